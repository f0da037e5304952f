"""Distillation losses against hand computations (the arithmetic is in the comments).

Two distributions over a vocabulary of two tokens are used throughout:
student S = [0.5, 0.5], teacher T = [0.25, 0.75].
"""

import math

import pytest
import torch

from trainer_lib.losses import (
    generalized_jsd,
    generalized_jsd_loss,
    reverse_kl,
    reverse_kl_loss,
    sampled_reverse_kl,
    sampled_reverse_kl_loss,
)

STUDENT = [0.5, 0.5]
TEACHER = [0.25, 0.75]
# KL(S || T) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)                       = 0.143841
REVERSE = 0.5 * math.log(4 / 3)
# KL(T || S) = 0.25 ln(0.25/0.5) + 0.75 ln(0.75/0.5) = -0.173287 + 0.304099             = 0.130812
FORWARD = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
# beta = 0.5: M = [0.375, 0.625]
# KL(T || M) = 0.25 ln(0.25/0.375) + 0.75 ln(0.75/0.625) = -0.101366 + 0.136741          = 0.035375
# KL(S || M) = 0.5 ln(0.5/0.375) + 0.5 ln(0.5/0.625)     =  0.143841 - 0.111572          = 0.032269
# JSD(0.5) = 0.5 * 0.035375 + 0.5 * 0.032269                                             = 0.033822
JSD_HALF = 0.5 * (0.25 * math.log(2 / 3) + 0.75 * math.log(1.2)) + 0.5 * (0.5 * math.log(4 / 3) + 0.5 * math.log(0.8))


def logprobs(*rows, requires_grad=False):
    logs = [[math.log(p) if p > 0 else -math.inf for p in r] for r in rows]
    return torch.tensor(logs, dtype=torch.float64, requires_grad=requires_grad)


def test_reverse_kl_per_token_by_hand():
    assert JSD_HALF == pytest.approx(0.033822, abs=1e-6)
    per_token = reverse_kl(logprobs(STUDENT, TEACHER), logprobs(TEACHER, TEACHER))
    assert per_token.tolist() == pytest.approx([REVERSE, 0.0], abs=1e-12)  # second row: KL(T || T) = 0


def test_jsd_at_beta_0_is_the_forward_kl_and_at_1_the_reverse_kl():
    s, t = logprobs(STUDENT), logprobs(TEACHER)
    assert generalized_jsd(s, t, 0.0).item() == pytest.approx(FORWARD, abs=1e-12)
    assert generalized_jsd(s, t, 1.0).item() == pytest.approx(REVERSE, abs=1e-12)
    assert FORWARD == pytest.approx(0.130812, abs=1e-6) and REVERSE == pytest.approx(0.143841, abs=1e-6)


def test_the_ends_are_the_limits_of_the_papers_formula():
    # JSD(beta) / beta -> KL(T || S) as beta -> 0; JSD(beta) / (1 - beta) -> KL(S || T) as beta -> 1
    s, t = logprobs(STUDENT), logprobs(TEACHER)
    eps = 1e-5
    assert generalized_jsd(s, t, eps).item() / eps == pytest.approx(FORWARD, rel=1e-3)
    assert generalized_jsd(s, t, 1 - eps).item() / eps == pytest.approx(REVERSE, rel=1e-3)


def test_jsd_at_one_half_by_hand_symmetric_and_bounded_by_log_2():
    s, t = logprobs(STUDENT), logprobs(TEACHER)
    assert generalized_jsd(s, t, 0.5).item() == pytest.approx(JSD_HALF, abs=1e-12)
    generator = torch.Generator().manual_seed(0)
    a = torch.log_softmax(3 * torch.randn(64, 11, generator=generator, dtype=torch.float64), -1)
    b = torch.log_softmax(3 * torch.randn(64, 11, generator=generator, dtype=torch.float64), -1)
    assert torch.allclose(generalized_jsd(a, b, 0.5), generalized_jsd(b, a, 0.5), atol=1e-12)
    values = generalized_jsd(a, b, 0.5)
    assert (values >= -1e-12).all() and (values <= math.log(2)).all()
    # disjoint supports reach the bound: M = [0.5, 0.5], KL(T || M) = KL(S || M) = ln 2
    disjoint = generalized_jsd(logprobs([1.0, 0.0]), logprobs([0.0, 1.0]), 0.5)
    assert disjoint.item() == pytest.approx(math.log(2), abs=1e-12)
    assert generalized_jsd(b, b, 0.3).abs().max() < 1e-12  # identical distributions: 0 at any beta


def test_beta_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(logprobs(STUDENT), logprobs(TEACHER), 1.5)


def test_masked_token_mean_weighs_every_token_alike():
    # sequence 0: two tokens (S vs T, then T vs T), sequence 1: one token (S vs T) and a padding position
    student = logprobs(STUDENT, TEACHER, STUDENT, STUDENT).view(2, 2, 2)
    teacher = logprobs(TEACHER, TEACHER, TEACHER, [0.999, 0.001]).view(2, 2, 2)
    mask = torch.tensor([[1, 1], [1, 0]])
    assert reverse_kl_loss(student, teacher, mask).item() == pytest.approx((REVERSE + 0 + REVERSE) / 3, abs=1e-12)
    jsd = generalized_jsd_loss(student, teacher, mask, 0.5).item()
    assert jsd == pytest.approx((JSD_HALF + 0 + JSD_HALF) / 3, abs=1e-12)
    assert generalized_jsd_loss(student, teacher, mask, 0.0).item() == pytest.approx(2 * FORWARD / 3, abs=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gradients_reach_the_student_only(beta):
    student_logits = torch.tensor([[0.3, -1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    teacher_logits = torch.tensor([[1.0, 0.0, -0.5]], dtype=torch.float64, requires_grad=True)
    s, t = torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logits, -1)
    generalized_jsd(s, t, beta).sum().backward()
    assert teacher_logits.grad is None
    # the same divergence written out with a constant teacher gives the same student gradient
    reference_logits = student_logits.detach().clone().requires_grad_(True)
    q, p = torch.softmax(reference_logits, -1), torch.softmax(teacher_logits.detach(), -1)
    m = beta * p + (1 - beta) * q
    if beta == 0.0:
        value = (p * (p.log() - q.log())).sum()
    elif beta == 1.0:
        value = (q * (q.log() - p.log())).sum()
    else:
        value = beta * (p * (p.log() - m.log())).sum() + (1 - beta) * (q * (q.log() - m.log())).sum()
    value.backward()
    assert torch.allclose(student_logits.grad, reference_logits.grad, atol=1e-12)
    assert student_logits.grad.abs().sum() > 0


def test_reverse_kl_gradient_skips_the_teacher_and_masked_vocabulary_gives_no_nan():
    student_logits = torch.tensor([[0.0, 1.0, -math.inf]], requires_grad=True)  # a masked-out token
    teacher_logits = torch.tensor([[1.0, 0.0, -math.inf]], requires_grad=True)
    s, t = torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logits, -1)
    for beta in (0.0, 0.3, 1.0):
        generalized_jsd(s, t, beta).sum().backward(retain_graph=True)
    reverse_kl(s, t).sum().backward()
    assert teacher_logits.grad is None and torch.isfinite(student_logits.grad).all()


def test_sampled_reverse_kl_and_its_policy_gradient_loss_by_hand():
    # k1 = log S(y) - log T(y) = [-1.0 - (-1.5), -2.0 - (-1.0)] = [0.5, -1.0]
    student = torch.tensor([[-1.0, -2.0, -0.1]], requires_grad=True)
    teacher = torch.tensor([[-1.5, -1.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    assert sampled_reverse_kl(student, teacher)[0, :2].tolist() == pytest.approx([0.5, -1.0])
    # loss = mean_t sg(k1_t) * log S(y_t) = (0.5 * -1.0 + -1.0 * -2.0) / 2 = 0.75
    loss = sampled_reverse_kl_loss(student, teacher, mask)
    assert loss.item() == pytest.approx(0.75)
    loss.backward()
    # d loss / d log S(y_t) = k1_t / 2 on the mask, 0 off it; the teacher gets nothing
    assert student.grad[0].tolist() == pytest.approx([0.25, -0.5, 0.0])
    assert teacher.grad is None


def test_the_sampled_estimate_averages_to_the_exact_reverse_kl():
    generator = torch.Generator().manual_seed(0)
    s, t = logprobs(STUDENT)[0], logprobs(TEACHER)[0]
    tokens = torch.multinomial(s.exp(), 40000, replacement=True, generator=generator)
    estimate = sampled_reverse_kl(s[tokens], t[tokens]).mean().item()
    assert estimate == pytest.approx(REVERSE, abs=0.01)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_chunked_jsd_equals_the_full_logits_one_in_value_and_gradient(beta):
    """Hidden states and head weights in, a chunk of positions at a time (3 rows here), a padded teacher
    vocabulary cut to the student's: the same values and gradients as the full-logits divergence."""
    from trainer_lib.losses import chunked_generalized_jsd

    gen = torch.Generator().manual_seed(0)
    student_h = torch.randn(7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    student_w = torch.randn(11, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    teacher_h = torch.randn(7, 4, generator=gen, dtype=torch.float64)  # another hidden size
    teacher_w = torch.randn(13, 4, generator=gen, dtype=torch.float64)  # two padding rows past the vocabulary
    chunked = chunked_generalized_jsd(student_h, student_w, teacher_h, teacher_w, beta, rows=3)
    grads = torch.autograd.grad(chunked.sum(), (student_h, student_w))
    full = generalized_jsd(
        torch.log_softmax((student_h @ student_w.t()).float(), -1),
        torch.log_softmax((teacher_h @ teacher_w[:11].t()).float(), -1),
        beta,
    )
    expected = torch.autograd.grad(full.sum(), (student_h, student_w))
    torch.testing.assert_close(chunked, full)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    logits = chunked_generalized_jsd(student_h @ student_w.t(), None, teacher_h, teacher_w, beta, rows=2)
    torch.testing.assert_close(logits, full)
