"""beta-DPO (Wu et al. 2024): the batch's beta, the margin filter and the loss, against hand computations."""

import math

import pytest
import torch

from trainer_lib.losses import (
    beta_dpo_beta,
    beta_dpo_loss,
    dpo_sigmoid_loss,
    margin_filter_mask,
    margin_filter_weights,
)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


# three pairs with zero reference log-probs and rejected log-probs: the log-ratio margins h = (2, 0, -1)
H = t(2.0, 0.0, -1.0)
ZEROS = t(0.0, 0.0, 0.0)
PAIRS = (H, ZEROS, ZEROS, ZEROS)


def dpo(beta, h):
    """-log sigma(beta * h) = log(1 + e^(-beta * h)), written out."""
    return math.log1p(math.exp(-beta * h))


def test_batch_beta_follows_the_calibration_equation():
    # mean margin 1/3, M0 = 0.5: beta = 0.1 * (1 + 0.5 * (1/3 - 1/2)) = 0.1 * 11/12
    assert float(beta_dpo_beta(H, 0.5, 0.1, 0.5)) == pytest.approx(0.1 * 11 / 12, rel=1e-12)
    # a wider batch than usual: a larger, more conservative beta
    assert float(beta_dpo_beta(H, -1.0, 0.1, 0.5)) == pytest.approx(0.1 * (1 + 0.5 * (1 / 3 + 1)), rel=1e-12)
    # far below the running mean the linear rule would turn negative: clamped at 1e-3
    assert float(beta_dpo_beta(H, 5.0, 0.1, 10.0)) == pytest.approx(1e-3)


def test_loss_at_the_batch_beta():
    losses, beta = beta_dpo_loss(*PAIRS, beta=0.1, alpha=0.5, margin_mean=0.5)
    b = 0.1 * 11 / 12
    assert float(beta) == pytest.approx(b, rel=1e-12)
    torch.testing.assert_close(losses, t(dpo(b, 2.0), math.log(2.0), dpo(b, -1.0)), rtol=1e-12, atol=0)


def test_alpha_zero_is_plain_dpo_exactly():
    for eps in (0.0, 0.1):
        losses, beta = beta_dpo_loss(*PAIRS, beta=0.1, alpha=0.0, margin_mean=3.0, label_smoothing=eps)
        assert torch.equal(losses, dpo_sigmoid_loss(*PAIRS, 0.1, eps)) and float(beta) == 0.1
    float32 = tuple(x.float() for x in PAIRS)
    assert torch.equal(beta_dpo_loss(*float32, 0.1, 0.0, 3.0)[0], dpo_sigmoid_loss(*float32, 0.1))


def test_kept_pairs_set_beta_and_carry_the_mean():
    keep = torch.tensor([True, False, True])
    losses, beta = beta_dpo_loss(*PAIRS, beta=0.1, alpha=0.5, margin_mean=0.5, keep=keep)
    # kept margins (2, -1): mean 0.5 = M0, so beta = 0.1; the dropped pair's loss is 0, the others x 3/2
    assert float(beta) == pytest.approx(0.1, rel=1e-12)
    torch.testing.assert_close(losses, t(1.5 * dpo(0.1, 2.0), 0.0, 1.5 * dpo(0.1, -1.0)), rtol=1e-12, atol=0)
    assert float(losses.mean()) == pytest.approx((dpo(0.1, 2.0) + dpo(0.1, -1.0)) / 2, rel=1e-12)


def test_no_gradient_through_beta():
    policy = H.clone().requires_grad_(True)
    losses, beta = beta_dpo_loss(policy, ZEROS, ZEROS, ZEROS, beta=0.1, alpha=0.5, margin_mean=0.5)
    assert not beta.requires_grad
    losses.sum().backward()
    b = 0.1 * 11 / 12  # d/dh log(1 + e^(-b h)) = -b * sigma(-b h), with b held constant
    expected = [-b / (1 + math.exp(b * h)) for h in (2.0, 0.0, -1.0)]
    torch.testing.assert_close(policy.grad, t(*expected), rtol=1e-12, atol=0)


def test_filter_weights_are_a_gaussian_around_the_running_mean():
    weights = margin_filter_weights(H, 0.5, 1.0)
    torch.testing.assert_close(weights, t(math.exp(-1.125), math.exp(-0.125), math.exp(-1.125)))
    assert torch.equal(margin_filter_weights(H, 0.5, 0.0), t(1.0, 1.0, 1.0))  # no spread seen yet


def test_filter_keeps_the_share_and_prefers_usual_margins():
    generator = torch.Generator().manual_seed(0)
    margins = t(0.0, 100.0, -100.0, 0.1, 50.0)
    # rho = 0.2 of 5 pairs: 4 kept; rho = 0.7: max(1, int(1.5)) = 1, and only the weight-1 pairs can win
    assert int(margin_filter_mask(margins, 0.0, 1.0, 0.2, generator).sum()) == 4
    for _ in range(20):
        kept = margin_filter_mask(margins, 0.0, 1.0, 0.7, generator)
        assert int(kept.sum()) == 1 and bool(kept[0] or kept[3])
    # every weight underflows (or a margin is not finite): uniform sampling, no error
    far = t(1e6, -1e6, float("nan"))
    assert int(margin_filter_mask(far, 0.0, 1.0, 0.5, generator).sum()) == 1


def test_filter_draws_are_reproducible_from_the_seed():
    margins = torch.linspace(-2, 2, 16, dtype=torch.float64)
    draws = [margin_filter_mask(margins, 0.0, 1.0, 0.5, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(draws[0], draws[1]) and int(draws[0].sum()) == 8
