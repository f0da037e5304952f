"""Preference losses against their paper equations, with the expected numbers written out by hand."""

import math

import pytest
import torch

from trainer_lib.losses import (
    dpo_sigmoid_loss,
    hinge_loss,
    ipo_loss,
    kto_loss,
    kto_reference_point,
    pairwise_reward_loss,
    reward_centering_penalty,
    robust_dpo_loss,
    rpo_nll_term,
    simpo_loss,
)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def softplus(x):
    """-log sigma(-x) = log(1 + e^x), written out."""
    return math.log1p(math.exp(x))


# Policy/reference log-probs for two pairs:
#   pair 0: h = (-1 - -1.5) - (-2 - -1.5) = 0.5 + 0.5 = 1.0
#   pair 1: equal log-probs everywhere, h = 0
POLICY_CHOSEN, POLICY_REJECTED = t(-1.0, -3.0), t(-2.0, -3.0)
REF_CHOSEN, REF_REJECTED = t(-1.5, -3.0), t(-1.5, -3.0)
PAIRS = (POLICY_CHOSEN, POLICY_REJECTED, REF_CHOSEN, REF_REJECTED)


def close(actual, expected):
    assert actual.shape == (len(expected),)
    torch.testing.assert_close(actual, t(*expected), rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- DPO (sigmoid) / cDPO


def test_dpo_sigmoid_no_smoothing():
    # -log sigma(beta h) = log(1 + e^{-beta h}); beta h = 0.1 and 0
    close(dpo_sigmoid_loss(*PAIRS, beta=0.1), [softplus(-0.1), math.log(2)])


def test_dpo_sigmoid_label_smoothing():
    eps = 0.2  # -(1-eps) log sigma(0.1) - eps log sigma(-0.1)
    expected = (1 - eps) * softplus(-0.1) + eps * softplus(0.1)
    close(dpo_sigmoid_loss(*PAIRS, beta=0.1, label_smoothing=eps), [expected, math.log(2)])


def test_dpo_sigmoid_large_margins_stay_finite():
    chosen, rejected, zero = t(0.0, -1000.0), t(-1000.0, 0.0), t(0.0, 0.0)  # h = +1000, -1000
    close(dpo_sigmoid_loss(chosen, rejected, zero, zero, beta=1.0), [0.0, 1000.0])
    # smoothing: eps * (-log sigma(-1000)) = 0.1 * 1000 for the well-ordered pair
    close(dpo_sigmoid_loss(chosen, rejected, zero, zero, beta=1.0, label_smoothing=0.1), [100.0, 900.0])


def test_reference_gets_no_gradient():
    ref_chosen, ref_rejected = REF_CHOSEN.clone().requires_grad_(), REF_REJECTED.clone().requires_grad_()
    policy_chosen = POLICY_CHOSEN.clone().requires_grad_()
    dpo_sigmoid_loss(policy_chosen, POLICY_REJECTED, ref_chosen, ref_rejected, beta=0.1).sum().backward()
    assert ref_chosen.grad is None and ref_rejected.grad is None
    # d/dx_c of log(1 + e^{-beta h}) = -beta * sigma(-beta h)
    expected = [-0.1 / (1 + math.exp(0.1)), -0.1 / 2]
    torch.testing.assert_close(policy_chosen.grad, t(*expected))


# --------------------------------------------------------------------------- IPO, hinge, robust


def test_ipo():
    # (h - 1/(2 beta))^2 with beta = 0.1: (1 - 5)^2 = 16, (0 - 5)^2 = 25
    close(ipo_loss(*PAIRS, beta=0.1), [16.0, 25.0])
    # beta = 0.5 puts the target at h = 1: zero loss for pair 0
    close(ipo_loss(*PAIRS, beta=0.5), [0.0, 1.0])


def test_hinge():
    # max(0, 1 - beta h): 1 - 0.1 = 0.9; equal log-probs: 1
    close(hinge_loss(*PAIRS, beta=0.1), [0.9, 1.0])
    # past the margin (beta h = 2 >= 1) the loss is exactly 0
    close(hinge_loss(*PAIRS, beta=2.0), [0.0, 1.0])


def test_robust_dpo():
    eps = 0.2  # [(1-eps) log(1+e^{-0.1}) - eps log(1+e^{0.1})] / (1 - 2 eps)
    expected = ((1 - eps) * softplus(-0.1) - eps * softplus(0.1)) / (1 - 2 * eps)
    # equal log-probs: (0.8 - 0.2) log 2 / 0.6 = log 2
    close(robust_dpo_loss(*PAIRS, beta=0.1, label_smoothing=eps), [expected, math.log(2)])


def test_robust_dpo_without_noise_is_dpo():
    close(robust_dpo_loss(*PAIRS, beta=0.1, label_smoothing=0.0), [softplus(-0.1), math.log(2)])


def test_robust_dpo_rejects_half():
    with pytest.raises(ValueError, match="label_smoothing"):
        robust_dpo_loss(*PAIRS, beta=0.1, label_smoothing=0.5)


# --------------------------------------------------------------------------- SimPO


def test_simpo():
    # -log sigma(beta (c - r) - gamma): 2 * (-0.5 - -1.0) - 0.5 = 0.5; equal averages: -gamma
    chosen_avg, rejected_avg = t(-0.5, -1.0), t(-1.0, -1.0)
    close(simpo_loss(chosen_avg, rejected_avg, beta=2.0, gamma=0.5), [softplus(-0.5), softplus(0.5)])
    # gamma = 0, equal: log 2
    close(simpo_loss(t(-1.0), t(-1.0), beta=2.0, gamma=0.0), [math.log(2)])


# --------------------------------------------------------------------------- KTO


def test_rpo_nll_term_is_the_per_token_nll_of_chosen():
    # -log pi(y_w) / |y_w|: -(-1.0) / 4 and -(-3.0) / 2; a zero count is read as one token
    close(rpo_nll_term(POLICY_CHOSEN, t(4, 2)), [0.25, 1.5])
    close(rpo_nll_term(POLICY_CHOSEN, torch.tensor([0, 3])), [1.0, 1.0])


def test_kto_desirable_and_undesirable():
    policy, reference = t(-1.0, -1.0), t(-1.5, -1.5)  # log-ratio r = 0.5 for both
    desirable = torch.tensor([True, False])
    z0, beta = 0.2, 0.1
    sigma = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = [
        1.0 * (1 - sigma(beta * (0.5 - z0))),  # lambda_D (1 - sigma(beta (r - z0)))
        2.0 * (1 - sigma(beta * (z0 - 0.5))),
    ]  # lambda_U (1 - sigma(beta (z0 - r)))
    close(kto_loss(policy, reference, desirable, z0, beta, desirable_weight=1.0, undesirable_weight=2.0), expected)


def test_kto_at_reference_point_is_half_the_weight():
    # r = z0 -> sigma(0) = 1/2 -> loss = lambda / 2
    close(
        kto_loss(
            t(-1.0, -1.0),
            t(-1.0, -1.0),
            torch.tensor([True, False]),
            0.0,
            0.1,
            desirable_weight=1.0,
            undesirable_weight=3.0,
        ),
        [0.5, 1.5],
    )


def test_kto_reference_point():
    # mean(0.5, -0.1) = 0.2; a negative KL estimate is clamped to 0
    close(kto_reference_point(t(-1.0, -2.1), t(-1.5, -2.0)).reshape(1), [0.2])
    close(kto_reference_point(t(-3.0, -4.0), t(-1.0, -1.0)).reshape(1), [0.0])
    policy = t(-1.0, -2.1).requires_grad_()
    assert not kto_reference_point(policy, t(-1.5, -2.0)).requires_grad


# --------------------------------------------------------------------------- reward model


def test_pairwise_reward_loss():
    chosen, rejected = t(2.0, 1.0), t(0.5, 1.0)
    close(pairwise_reward_loss(chosen, rejected), [softplus(-1.5), math.log(2)])  # -log sigma(1.5), equal
    close(pairwise_reward_loss(chosen, rejected, margin=t(1.0, 0.0)), [softplus(-0.5), math.log(2)])


def test_pairwise_reward_loss_large_margins():
    close(pairwise_reward_loss(t(100.0, 0.0), t(0.0, 100.0)), [softplus(-100.0), 100.0])


def test_reward_centering_penalty():
    close(reward_centering_penalty(t(1.0, -2.0), t(2.0, 2.0)), [9.0, 0.0])
