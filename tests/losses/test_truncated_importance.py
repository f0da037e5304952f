"""Truncated importance sampling (Yao et al. 2025): the weights by hand."""

import math

import torch

from trainer_lib.losses import truncated_importance_weights


def test_weights_are_the_capped_probability_ratios():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 0.0]])
    rollout = torch.tensor([[-1.2, -1.0, -3.0], [-3.0, -0.3, 0.0]])
    weights = truncated_importance_weights(train, rollout, cap=2.0)
    by_hand = [
        [math.exp(0.2), math.exp(-1.0), 2.0],  # e^2.5 = 12.2 is capped at 2
        [1.0, math.exp(0.2), 1.0],
    ]
    torch.testing.assert_close(weights, torch.tensor(by_hand), rtol=1e-6, atol=0)
    assert truncated_importance_weights(train, rollout, cap=20.0)[0, 2] == torch.tensor(math.exp(2.5))


def test_weights_carry_no_gradient():
    train = torch.tensor([-1.0, -2.0], requires_grad=True)
    rollout = torch.tensor([-1.5, -1.0], requires_grad=True)
    weights = truncated_importance_weights(train, rollout, cap=5.0)
    assert not weights.requires_grad
