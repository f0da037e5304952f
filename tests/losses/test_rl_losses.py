"""RL math against values worked out by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from trainer_lib.losses import (
    KLController,
    clipped_surrogate,
    constant_normalized_sum,
    explained_variance,
    gae_advantages,
    grpo_advantages,
    kl_penalty,
    masked_mean,
    masked_whiten,
    ppo_policy_loss,
    ppo_value_loss,
    rloo_advantages,
    sequence_mean,
)


def close(actual, expected, tol=1e-5):
    return torch.allclose(
        torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected, dtype=torch.float32), atol=tol
    )


def test_gae_one_sequence_of_three_tokens():
    # gamma = 0.9, lam = 0.8, so gamma * lam = 0.72
    # t=2: delta = 2 + 0.9*0   - 1.5 = 0.5                      A2 = 0.5
    # t=1: delta = 0 + 0.9*1.5 - 1.0 = 0.35  A1 = 0.35 + 0.72*0.5  = 0.71
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4   A0 = 1.4  + 0.72*0.71 = 1.9112
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 1.5]])
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    assert close(adv, [[1.9112, 0.71, 0.5]])
    assert close(ret, [[2.4112, 1.71, 2.0]])  # A + V


def test_gae_values_after_the_response_count_as_zero():
    # mask [1, 1, 0]: the 9.0 value and the 5.0 reward on padding are ignored.
    # t=1: delta = 2 + 0.9*0 - 1.0 = 1.0          A1 = 1.0
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4        A0 = 1.4 + 0.72*1.0 = 2.12
    rewards = torch.tensor([[1.0, 2.0, 5.0]])
    values = torch.tensor([[0.5, 1.0, 9.0]])
    adv, ret = gae_advantages(rewards, values, torch.tensor([[1, 1, 0]]), gamma=0.9, lam=0.8)
    assert close(adv, [[2.12, 1.0, 0.0]])
    assert close(ret, [[2.62, 2.0, 0.0]])


def test_gae_with_gamma_lam_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 3.0, 0.0]])
    values = torch.zeros(2, 3)
    adv, _ = gae_advantages(rewards, values, torch.tensor([[1, 1, 1], [1, 1, 0]]), 1.0, 1.0)
    assert close(adv, [[1.0, 1.0, 1.0], [3.0, 3.0, 0.0]])


def test_grpo_advantages_scaled_and_dr_grpo():
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])
    # group [1,2,3]: mean 2, std (Bessel) 1               -> [-1, 0, 1] / (1 + 1e-4)
    # group [0,0,4]: mean 4/3, var = (16/9+16/9+64/9)/2 = 48/9, std = 2.309401
    #                -> [-4/3, -4/3, 8/3] / 2.309401 = [-0.577350, -0.577350, 1.154701]
    adv = grpo_advantages(rewards, group_size=3)
    assert close(adv, [-1 / 1.0001, 0.0, 1 / 1.0001, -0.577325, -0.577325, 1.154651], tol=1e-5)
    dr = grpo_advantages(rewards, group_size=3, scale=False)
    assert close(dr, [-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3])


def test_grpo_equal_rewards_give_zero_advantage():
    assert close(grpo_advantages(torch.tensor([0.5, 0.5, 0.5, 0.5]), 2), [0, 0, 0, 0])


def test_rloo_advantages_leave_one_out():
    # [1,2,3]: baselines (2+3)/2=2.5, (1+3)/2=2, (1+2)/2=1.5 -> [-1.5, 0, 1.5]
    # [0,0,4]: baselines 2, 2, 0                                -> [-2, -2, 4]
    adv = rloo_advantages(torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0]), group_size=3)
    assert close(adv, [-1.5, 0.0, 1.5, -2.0, -2.0, 4.0])


def test_group_shapes_are_checked():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.zeros(3), 1)


def test_kl_estimators():
    logprobs = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-2.0, -1.0])
    assert close(kl_penalty(logprobs, ref, "k1"), [1.0, -1.0])  # lp - ref
    assert close(kl_penalty(logprobs, ref, "k2"), [0.5, 0.5])  # 0.5 * 1^2
    # k3 = exp(ref - lp) - (ref - lp) - 1:  e^-1 + 1 - 1 = 0.367879;  e^1 - 1 - 1 = 0.718282
    assert close(kl_penalty(logprobs, ref, "k3"), [math.exp(-1), math.e - 2])
    assert close(kl_penalty(ref, ref, "k3"), [0.0, 0.0])
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(logprobs, ref, "k4")


def test_adaptive_kl_controller_and_state_round_trip():
    ctl = KLController(0.1, target=6.0, horizon=10000)
    # KL 12 is 100% over target, clipped to +20%: 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512
    assert ctl.update(12.0, n_steps=256) == pytest.approx(0.100512)
    # KL 3 is 50% under, clipped to -20%: 0.100512 * (1 - 0.00512)
    assert ctl.update(3.0, n_steps=256) == pytest.approx(0.100512 * 0.99488)
    restored = KLController(0.1, target=6.0, horizon=10000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value
    fixed = KLController(0.05)
    assert fixed.update(100.0, 256) == 0.05


def test_clipped_surrogate_picks_the_pessimistic_term():
    # ratios 1.5, 1.5, 0.5 with eps 0.2:
    #   A=+1, r=1.5: -min(1.5, 1.2)  = -1.2 (clipped)
    #   A=-1, r=1.5: -min(-1.5,-1.2) =  1.5 (unclipped)
    #   A=+1, r=0.5: -min(0.5, 0.8)  = -0.5 (unclipped)
    logprobs = torch.log(torch.tensor([[1.5, 1.5, 0.5]]))
    loss, clipped = clipped_surrogate(logprobs, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 1.0]]), 0.2)
    assert close(loss, [[-1.2, 1.5, -0.5]])
    assert close(clipped, [[1, 0, 0]])
    mean, stats = ppo_policy_loss(
        logprobs, torch.zeros(1, 3), torch.tensor([[1.0, -1.0, 1.0]]), torch.tensor([[1, 1, 0]]), 0.2
    )
    assert mean.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)


def test_clipped_value_loss():
    # token 1: V=1.0, V_old=0.5, R=2: (1-2)^2 = 1; V_clip = 0.7 -> (0.7-2)^2 = 1.69 -> 1.69
    # token 2: V=0.6, V_old=0.5, R=0: inside the clip range -> 0.36
    # 0.5 * mean(1.69, 0.36) = 0.5125
    values, old = torch.tensor([[1.0, 0.6, 7.0]]), torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    loss, stats = ppo_value_loss(values, old, returns, torch.tensor([[1, 1, 0]]), 0.2)
    assert loss.item() == pytest.approx(0.5125)
    assert stats["value_clip_fraction"].item() == pytest.approx(0.5)
    unclipped, _ = ppo_value_loss(values, old, returns, torch.tensor([[1, 1, 0]]), 0.0)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 0.36) / 2)


def test_aggregations():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert masked_mean(per_token, mask).item() == pytest.approx(10 / 4)  # token mean
    assert sequence_mean(per_token, mask).item() == pytest.approx((2 + 4) / 2)  # mean of row means
    assert constant_normalized_sum(per_token, mask, 4).item() == pytest.approx(10 / (2 * 4))


def test_whiten_and_explained_variance():
    # mean 2, Bessel variance 1 on the masked part; the masked-out value only shifts by the mean
    whitened = masked_whiten(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
    assert close(whitened, [-1.0, 0.0, 1.0, 98.0], tol=1e-4)
    returns, mask = torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    # constant critic: Var[R - 2] / Var[R] = 1 -> 0
    assert explained_variance(torch.full((1, 3), 2.0), returns, mask).item() == pytest.approx(0.0)
