"""Distillation losses: the student matched to a frozen teacher token by token. Tensors in, tensors out.

Two kinds of input, and the functions say which they take:

* full-vocabulary log-probs ``(..., V)`` of the student and the teacher at the same positions (any
  leading shape: ``(B, T)`` rows, or the ``(rows, V)`` tile of a tiled LM head), from which the
  divergence at each position is exact;
* sampled-token log-probs ``(B, T)``: the log-prob each model gives the token the student sampled,
  from which the reverse KL is estimated (one sample per position, as the KL penalties of
  :mod:`trainer_lib.losses.policy_gradient` are).

The teacher is frozen: every function detaches its log-probs, so gradients reach the student only.
Per-token losses become one number by :func:`~trainer_lib.losses.advantages.masked_mean` over the
completion tokens (``mask`` 1 on them), every token of the batch weighing the same.
"""

from __future__ import annotations

import math

import torch

from trainer_lib.losses.advantages import masked_mean


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(P || Q) = sum_v p_v (log p_v - log q_v)`` over the last dim; terms with ``p_v = 0`` count 0
    (so ``-inf`` log-probs of a masked vocabulary give 0, not NaN, in the value and the gradient)."""
    present = log_p.exp() > 0
    log_ratio = torch.where(present, log_p - log_q, torch.zeros_like(log_p))
    return (log_p.exp() * log_ratio).sum(-1)


# --------------------------------------------------------------------------- reverse KL


def reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-position reverse KL of the student to the teacher, exact, from full-vocabulary log-probs:

        KL(pi_S || pi_T)_t = sum_v pi_S(v | y_<t) (log pi_S(v | y_<t) - log pi_T(v | y_<t))

    the divergence on-policy distillation minimizes on the student's own samples (Agarwal et al. 2024,
    GKD, sec. 3: on-policy GKD with D the reverse KL; MiniLLM, Gu et al. 2024, minimizes it per sequence).
    ``(..., V)`` in, ``(...)`` out. Mode-seeking: the student is pushed off tokens the teacher finds
    unlikely, and is not required to cover all of the teacher's mass.
    """
    return _kl(student_logprobs, teacher_logprobs.detach())


def sampled_reverse_kl(student_token_logprobs: torch.Tensor, teacher_token_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of the reverse KL from the sampled tokens only, ``(B, T)`` in and out:

        k1_t = log pi_S(y_t | y_<t) - log pi_T(y_t | y_<t),   y_t ~ pi_S

    Its expectation over the student's sampling is :func:`reverse_kl` (Schulman's k1 estimator, as
    :func:`~trainer_lib.losses.policy_gradient.kl_k1`); one sample is noisy and may be negative. Use it
    as a value (a metric, or ``-k1`` as a per-token reward); its own gradient is NOT the KL's gradient,
    since the sampling distribution depends on the student: train with :func:`sampled_reverse_kl_loss`.
    """
    return student_token_logprobs - teacher_token_logprobs.detach()


def sampled_reverse_kl_loss(
    student_token_logprobs: torch.Tensor, teacher_token_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """On-policy distillation from sampled tokens as a policy gradient with per-token reward
    ``r_t = -(log pi_S(y_t) - log pi_T(y_t))`` and no discount (the teacher's log-ratio as a dense
    reward: GKD sec. 3 with the reverse KL; the setting of Thinking Machines' on-policy distillation, 2025):

        loss = mean_t  sg(log pi_S(y_t) - log pi_T(y_t)) * log pi_S(y_t)

    ``sg`` stops the gradient. Its gradient, ``mean_t k1_t * grad log pi_S(y_t)``, is the score-function
    estimate of the gradient of the per-token reverse KL at each sampled position (the ``E[grad log pi]``
    term of the exact gradient is 0 in expectation and left out). Only the student's log-probs carry a
    gradient. ``(B, T)`` inputs, masked token mean.
    """
    k1 = sampled_reverse_kl(student_token_logprobs, teacher_token_logprobs).detach()
    return masked_mean(k1 * student_token_logprobs, mask)


# --------------------------------------------------------------------------- GKD's generalized JSD


def generalized_jsd(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-position generalized Jensen-Shannon divergence of GKD (Agarwal et al. 2024, "On-Policy
    Distillation of Language Models", sec. 2, generalized JSD), with P the teacher and Q the student:

        M              = beta * P + (1 - beta) * Q
        JSD(beta)(P||Q) = beta * KL(P || M) + (1 - beta) * KL(Q || M)

    The paper's formula is 0 at both ends (M equals the other distribution); it behaves as the forward
    KL near beta = 0 (``JSD(beta) / beta -> KL(P || Q)``) and as the reverse KL near beta = 1
    (``JSD(beta) / (1 - beta) -> KL(Q || P)``). As the paper's experiments and TRL's ``GKDTrainer``
    do, the ends are those limits:

        beta = 0: KL(teacher || student), the forward KL (mode-covering, supervised KD's divergence)
        beta = 1: KL(student || teacher), the reverse KL (mode-seeking, :func:`reverse_kl`)

    So the loss jumps in scale at the ends (a beta of 0.01 is about 1 % of the forward KL). At
    beta = 0.5 it is the symmetric Jensen-Shannon divergence, bounded by ``log 2``. ``(..., V)``
    full-vocabulary log-probs in, ``(...)`` out; the teacher's are detached.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"generalized_jsd: beta must be in [0, 1], got {beta}")
    teacher_logprobs = teacher_logprobs.detach()
    if beta == 0.0:
        return _kl(teacher_logprobs, student_logprobs)
    if beta == 1.0:
        return _kl(student_logprobs, teacher_logprobs)
    # log M = logsumexp(log beta + log P, log(1 - beta) + log Q); -inf (a masked vocabulary) is made the
    # most negative finite value first, as logaddexp's gradient at (-inf, -inf) is NaN
    floor = torch.finfo(student_logprobs.dtype).min
    mixture = torch.logaddexp(
        teacher_logprobs.clamp(min=floor) + math.log(beta), student_logprobs.clamp(min=floor) + math.log1p(-beta)
    )
    return beta * _kl(teacher_logprobs, mixture) + (1.0 - beta) * _kl(student_logprobs, mixture)


def generalized_jsd_loss(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """:func:`generalized_jsd` averaged over the masked positions: ``(B, T, V)`` log-probs, ``(B, T)`` mask."""
    return masked_mean(generalized_jsd(student_logprobs, teacher_logprobs, beta), mask)


def reverse_kl_loss(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`reverse_kl` averaged over the masked positions: ``(B, T, V)`` log-probs, ``(B, T)`` mask."""
    return masked_mean(reverse_kl(student_logprobs, teacher_logprobs), mask)


# --------------------------------------------------------------------------- chunked over positions


def _head_log_softmax(states: torch.Tensor, weight: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """``(rows, vocab)`` float32 log-softmax of ``states @ weight[:vocab]^T`` (weight None: states are logits)."""
    logits = states if weight is None else torch.mm(states, weight[:vocab].t())
    return torch.log_softmax(logits[:, :vocab].float(), dim=-1)


def _vocab(states: torch.Tensor, weight: torch.Tensor | None) -> int:
    return states.shape[-1] if weight is None else weight.shape[0]


def _chunk_jsd(student_states, student_weight, teacher_logprobs, beta: float, vocab: int) -> torch.Tensor:
    return generalized_jsd(_head_log_softmax(student_states, student_weight, vocab), teacher_logprobs, beta)


def chunked_generalized_jsd(
    student_states: torch.Tensor,
    student_weight: torch.Tensor | None,
    teacher_states: torch.Tensor,
    teacher_weight: torch.Tensor | None,
    beta: float,
    rows: int | None = None,
) -> torch.Tensor:
    """:func:`generalized_jsd` ``(N,)`` at ``N`` positions given by each model's final hidden states ``(N, H)``
    and LM head weight ``(V, H)`` (or, with a weight of None, its logits ``(N, V)``), ``rows`` positions at a
    time (default: about :data:`~trainer_lib.losses.chunked_head.TILE_ELEMENTS` logits per chunk).

    The divergence needs both full next-token distributions, so the tiled log-prob trick of
    :mod:`~trainer_lib.losses.chunked_head` does not apply; instead only one chunk of positions' logits
    exists at once: the teacher's without gradient, the student's recomputed in the backward (activation
    checkpointing) rather than kept. The models' vocabularies are cut to the smaller one (a checkpoint may
    pad its embedding past the tokenizer's last id). The teacher's hidden size may differ from the student's.
    """
    from torch.utils.checkpoint import checkpoint

    from trainer_lib.losses.chunked_head import rows_per_tile

    vocab = min(_vocab(student_states, student_weight), _vocab(teacher_states, teacher_weight))
    step = rows or rows_per_tile(vocab)
    parts = []
    for start in range(0, student_states.shape[0], step):
        with torch.no_grad():
            teacher = _head_log_softmax(teacher_states[start : start + step], teacher_weight, vocab)
        chunk = student_states[start : start + step]
        if torch.is_grad_enabled() and chunk.requires_grad:
            parts.append(checkpoint(_chunk_jsd, chunk, student_weight, teacher, beta, vocab, use_reentrant=False))
        else:
            parts.append(_chunk_jsd(chunk, student_weight, teacher, beta, vocab))
    return torch.cat(parts) if parts else student_states.new_zeros(0, dtype=torch.float32)
