"""A2C's loss (Mnih et al. 2016) and the entropy bonus against values worked out by hand."""

import torch

from trainer_lib.losses import entropy_bonus, policy_gradient_loss, ppo_value_loss


def test_a2c_loss_by_hand():
    # two sequences, the second with one padded position
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], requires_grad=True)
    advantages = torch.tensor([[2.0, -1.0], [4.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # -A * log pi on the three response tokens: 2, -2, 2        -> mean 2/3
    policy, stats = policy_gradient_loss(logprobs, advantages, mask)
    assert torch.allclose(policy, torch.tensor(2 / 3)) and stats == {}
    # its gradient is -A_t / 3 on response tokens, 0 on padding (A is a constant)
    policy.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-2 / 3, 1 / 3], [-4 / 3, 0.0]]))

    # value loss, unclipped: 0.5 * mean (V - R)^2 = 0.5 * (1 + 4 + 0.25) / 3 = 0.875
    values, returns = torch.tensor([[1.0, 0.0], [0.5, 5.0]]), torch.tensor([[2.0, 2.0], [0.0, -5.0]])
    value, _ = ppo_value_loss(values, values, returns, mask, clip_range=0.0)
    assert torch.allclose(value, torch.tensor(0.875))

    # entropy bonus: -0.01 * mean H = -0.01 * (1.5 + 0.5 + 1.0) / 3 = -0.01
    entropy = torch.tensor([[1.5, 0.5], [1.0, 8.0]])
    bonus = entropy_bonus(entropy, mask, coef=0.01)
    assert torch.allclose(bonus, torch.tensor(-0.01))

    # the whole A2C objective with vf_coef = 0.5: 2/3 + 0.5 * 0.875 - 0.01
    assert torch.allclose(policy + 0.5 * value + bonus, torch.tensor(2 / 3 + 0.4375 - 0.01))


def test_a2c_gradient_equals_ppo_gradient_at_ratio_one():
    """With pi == pi_old (A2C's single pass) the clipped PPO loss has the same gradient: a check that
    the two objectives differ only in what happens after the first update."""
    from trainer_lib.losses import ppo_policy_loss

    logits = torch.tensor([[0.3, -0.2, 1.1]])
    advantages = torch.tensor([[1.0, -2.0, 0.5]])
    mask = torch.ones(1, 3)
    grads = []
    for use_ppo in (False, True):
        x = logits.clone().requires_grad_(True)
        logprobs = torch.nn.functional.logsigmoid(x)
        if use_ppo:
            loss, _ = ppo_policy_loss(logprobs, logprobs.detach(), advantages, mask, clip_range=0.2)
        else:
            loss, _ = policy_gradient_loss(logprobs, advantages, mask)
        loss.backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1])


def test_entropy_bonus_with_zero_coefficient_is_exactly_zero():
    entropy = torch.tensor([[0.7, 1.3]])
    assert entropy_bonus(entropy, torch.ones(1, 2), 0.0).item() == 0.0
