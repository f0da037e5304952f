"""DAPO, GSPO and REINFORCE++ math against values worked out by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from trainer_lib.losses import (
    clipped_surrogate,
    kl_penalized_returns,
    overlong_penalty,
    reinforce_pp_advantages,
    sequence_clipped_surrogate,
    sequence_mean,
    token_mean,
)


def close(actual, expected, tol=1e-5):
    return torch.allclose(
        torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected, dtype=torch.float32), atol=tol
    )


def test_clip_higher_widens_only_the_upper_side():
    # ratios 0.5, 1.25, 1.5 (old log-probs 0); advantages -1, +1, +1; eps_low 0.2, eps_high 0.28
    # t0: A<0: max(-(-1)*0.5, -(-1)*clip(0.5, 0.8, 1.28)) = max(0.5, 0.8) = 0.8       clipped
    # t1: A>0: max(-1.25, -clip(1.25)) = max(-1.25, -1.25) = -1.25                       not clipped
    # t2: A>0: max(-1.5, -1.28) = -1.28                                                  clipped
    logprobs = torch.log(torch.tensor([[0.5, 1.25, 1.5]]))
    advantages = torch.tensor([[-1.0, 1.0, 1.0]])
    loss, clipped = clipped_surrogate(logprobs, torch.zeros(1, 3), advantages, 0.2, clip_high=0.28)
    assert close(loss, [[0.8, -1.25, -1.28]]) and close(clipped, [[1.0, 0.0, 1.0]])
    # symmetric (clip_high None = clip_range): t1 is now clipped at 1.2
    loss, clipped = clipped_surrogate(logprobs, torch.zeros(1, 3), advantages, 0.2)
    assert close(loss, [[0.8, -1.2, -1.2]]) and close(clipped, [[1.0, 1.0, 1.0]])


def test_gspo_one_clipped_ratio_per_sequence():
    # log-ratios [0.3, -0.1, 0.1] -> mean 0.1, s0 = e^0.1 = 1.105171; A0 = 1: loss0 = -1.105171
    # log-ratios [0.2, 0.4, (pad 9)] -> mean 0.3, s1 = e^0.3 = 1.349859 > 1 + 0.3; A1 = 2:
    #   max(-2 * 1.349859, -2 * 1.3) = -2.6, clipped
    # sequence mean: (-1.105171 - 2.6) / 2 = -1.8525855
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.3, -0.1, 0.1], [0.2, 0.4, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    per_token, clipped = sequence_clipped_surrogate(
        logprobs, old, torch.tensor([1.0, 2.0]), mask, clip_low=0.2, clip_high=0.3
    )
    assert close(per_token * mask, [[-1.105171] * 3, [-2.6, -2.6, 0.0]])
    assert close(clipped * mask, [[0.0] * 3, [1.0, 1.0, 0.0]])
    loss = sequence_mean(per_token, mask)
    assert close(loss, -1.8525855)
    # gradient: d/d logprob_{0,t} of -(1/2) s0 = -(1/2) * s0 * (1/3) = -0.1841952 each; the clipped
    # sequence and the padding get none
    loss.backward()
    assert close(logprobs.grad, [[-0.1841952] * 3, [0.0, 0.0, 0.0]])


def test_gspo_with_equal_policies_is_minus_the_mean_advantage():
    logprobs = torch.randn(3, 4)
    per_token, clipped = sequence_clipped_surrogate(
        logprobs, logprobs.clone(), torch.tensor([[1.0], [-2.0], [4.0]]), torch.ones(3, 4), 3e-4, 4e-4
    )
    assert close(sequence_mean(per_token, torch.ones(3, 4)), -1.0) and clipped.sum() == 0


def test_token_mean_weighs_every_token_alike():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert close(token_mean(per_token, mask), 15 / 5)  # (1+2+3+4+5) / 5 tokens
    assert close(sequence_mean(per_token, mask), (2.0 + 4.5) / 2)  # the per-sequence means, averaged


def test_overlong_penalty_falls_linearly_in_the_buffer():
    # L_max 10, L_cache 4: free up to 6 tokens, then (6 - |y|) / 4, -1 from 10 on
    lengths = torch.tensor([3, 6, 7, 9, 10, 12])
    assert close(overlong_penalty(lengths, max_tokens=10, buffer=4), [0.0, 0.0, -0.25, -0.75, -1.0, -1.0])
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(lengths, max_tokens=10, buffer=0)


def test_reinforce_pp_returns_carry_the_kl_penalty_to_go():
    # beta 0.5; seq0 reward 1, kl [0.1, 0.2, 0.3]: kl to go [0.6, 0.5, 0.3] -> G = 1 - 0.5 * that
    #   = [0.7, 0.75, 0.85]; seq1 reward 0, kl [0.4, 0.5, (pad 9)]: to go [0.9, 0.5] -> [-0.45, -0.25, 0]
    rewards = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    returns = kl_penalized_returns(rewards, kl, mask, beta=0.5)
    assert close(returns, [[0.7, 0.75, 0.85], [-0.45, -0.25, 0.0]])


def test_reinforce_pp_advantages_normalize_over_the_whole_batch():
    # the returns above: 0.7, 0.75, 0.85, -0.45, -0.25; mean 1.6 / 5 = 0.32
    # deviations 0.38, 0.43, 0.53, -0.77, -0.57; squares sum to 1.528; Bessel var 1.528 / 4 = 0.382
    rewards = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    deviations = [[0.38, 0.43, 0.53], [-0.77, -0.57]]
    adv = reinforce_pp_advantages(rewards, kl, mask, beta=0.5)
    std = math.sqrt(0.382 + 1e-8)
    assert close(adv, [[d / std for d in deviations[0]], [d / std for d in deviations[1]] + [0.0]])
    # reduce: the statistics of all ranks; as if a second rank held the same batch, the mean stays
    # 0.32 and the Bessel variance is 2 * 1.528 / 9
    calls = []

    def two_ranks(sums):
        calls.append(sorted(sums))
        return {k: 2 * float(v) for k, v in sums.items()}

    adv = reinforce_pp_advantages(rewards, kl, mask, beta=0.5, reduce=two_ranks)
    std = math.sqrt(2 * 1.528 / 9 + 1e-8)
    assert calls == [["count", "sum", "sum_sq"]]
    assert close(adv, [[d / std for d in deviations[0]], [d / std for d in deviations[1]] + [0.0]])
