"""Token log-probs and the cross-entropy loss of an LM head, without the ``(tokens, vocab)`` logits.

With ``z = h W^T / T`` (hidden state ``h``, head weight ``W``, temperature ``T``)::

    log p(y | h) = z_y - logsumexp(z)                                   (softmax log-likelihood)
    d log p(y) / d z = onehot(y) - softmax(z)
    d log p(y) / d h = (W_y - softmax(z) W) / T,   d log p(y) / d W = (onehot(y) - softmax(z))^T h / T

At a 152k vocabulary a 1,024-token row has 622 MB of float32 logits, again for their gradient. Here
rows are taken a tile at a time (``rows_per_tile``: about :data:`TILE_ELEMENTS` logits), so only one
tile of logits exists at once, in float32 for bf16/fp16/fp32 weights (float64 for float64). Three ways to get gradients,
each with the fewest vocabulary-sized matmuls (GEMMs) for what is known when the forward runs:

* :func:`chunked_nll` (SFT): a weighted sum of token losses, whose per-token weights are known in the
  forward. Gradients for ``h`` and ``W`` are computed tile by tile in the forward and only scaled in
  the backward: 3 GEMMs, as many as the full-logits loss (Liger's fused linear cross-entropy does
  the same).
* :func:`chunked_logprobs` with a frozen ``W`` (LoRA): per-token ``d log p / d h`` is accumulated in
  the forward (an ``(N, H)`` tensor), and the backward multiplies it by the incoming gradient: 2 GEMMs
  instead of 3.
* :func:`chunked_logprobs` with a trainable ``W``: the backward recomputes each tile's logits (4
  GEMMs instead of 3; the price of never holding the logits).

Every result equals the full-logits computation within float32 rounding (tests/losses/test_chunked_head.py).
"""

from __future__ import annotations

import torch

#: Logits per tile (float32 elements): 32M, 128 MB, a tile of 220 rows at a 152k vocabulary. On
#: a 2-core CPU (2026-12-02) smaller tiles cost time: 512 rows x 152k took 4.3 s forward + backward
#: (frozen head) in 55-row tiles, 3.7 s in 220-row tiles, 3.25 s in one.
TILE_ELEMENTS = 1 << 25


def rows_per_tile(vocab: int) -> int:
    return max(1, TILE_ELEMENTS // max(vocab, 1))


def _exact(dtype: torch.dtype) -> torch.dtype:
    """The dtype logits and sums are kept in: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _tile_logits(hidden: torch.Tensor, weight: torch.Tensor, inv_temp: float) -> torch.Tensor:
    """``(rows, vocab)`` logits of one tile in at least float32, divided by the temperature."""
    logits = torch.mm(hidden, weight.t())
    logits = logits.to(_exact(logits.dtype))
    return logits.mul_(inv_temp) if inv_temp != 1.0 else logits


def _tiles(count: int, vocab: int):
    step = rows_per_tile(vocab)
    return [(start, min(start + step, count)) for start in range(0, count, step)]


def _forward_tiles(hidden, weight, targets, inv_temp, with_entropy, jacobian=None):
    """Log-probs ``(N,)``, entropies ``(N,)`` or None, logsumexps ``(N,)``; fills ``jacobian`` with
    ``d log p / d h`` when given."""
    count = hidden.shape[0]
    logprobs = torch.empty(count, dtype=_exact(hidden.dtype), device=hidden.device)
    normalizers = torch.empty_like(logprobs)
    entropy = torch.empty_like(logprobs) if with_entropy else None
    for start, end in _tiles(count, weight.shape[0]):
        logits = _tile_logits(hidden[start:end], weight, inv_temp)
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, targets[start:end, None]).squeeze(1)
        logprobs[start:end] = picked - lse
        normalizers[start:end] = lse
        if entropy is None and jacobian is None:
            continue
        log_p = logits.sub_(lse[:, None])  # in place: the tile's log-softmax
        probs = log_p.exp()
        if entropy is not None:
            entropy[start:end] = -(probs * log_p).sum(-1)
        if jacobian is not None:
            expected = torch.mm(probs.to(weight.dtype), weight).to(jacobian.dtype)
            jacobian[start:end] = (weight[targets[start:end]].to(jacobian.dtype) - expected) * inv_temp
    return logprobs, entropy, normalizers


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temp: float, with_entropy: bool):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        jacobian = None
        if need_hidden and not need_weight:  # a frozen head: d log p / d h now, no recompute later
            jacobian = torch.empty(hidden.shape, dtype=_exact(hidden.dtype), device=hidden.device)
        logprobs, entropy, normalizers = _forward_tiles(hidden, weight, targets, inv_temp, with_entropy, jacobian)
        ctx.inv_temp = inv_temp
        ctx.save_for_backward(hidden, weight, targets, normalizers, jacobian)
        if entropy is None:
            return logprobs, logprobs.new_zeros(0)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, targets, normalizers, jacobian = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_logprobs = grad_logprobs.to(normalizers.dtype)
        if jacobian is not None:
            return (grad_logprobs[:, None] * jacobian).to(hidden.dtype), None, None, None, None
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        exact = normalizers.dtype
        grad_weight = torch.zeros(weight.shape, dtype=exact, device=weight.device) if need_weight else None
        for start, end in _tiles(hidden.shape[0], weight.shape[0]):
            tile = hidden[start:end]
            logits = _tile_logits(tile, weight, ctx.inv_temp)
            # d loss / d z = g * (onehot - p), then d z / d (h W^T) = 1 / T
            grad_logits = logits.sub_(normalizers[start:end, None]).exp_().mul_(-grad_logprobs[start:end, None])
            grad_logits[torch.arange(end - start, device=tile.device), targets[start:end]] += grad_logprobs[start:end]
            grad_logits = grad_logits.mul_(ctx.inv_temp).to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = torch.mm(grad_logits, weight)
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().to(exact), tile.to(exact))
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None


def chunked_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy=False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(h W^T / T)[y]`` for each row, ``(N,)`` in at least float32, and (``with_entropy``) each row's
    entropy ``-sum p log p``, without gradient. ``hidden`` is ``(N, H)``, ``weight`` ``(V, H)``,
    ``targets`` ``(N,)``; differentiable with respect to ``hidden`` and ``weight``."""
    inv_temp = 1.0 / temperature if temperature > 0 else 1.0
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        with torch.no_grad():
            logprobs, entropy, _ = _forward_tiles(hidden, weight, targets, inv_temp, with_entropy)
        return logprobs, entropy
    logprobs, entropy = _ChunkedLogprobs.apply(hidden, weight, targets, inv_temp, with_entropy)
    return logprobs, entropy if with_entropy else None


class _ChunkedNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, token_weights):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        exact = _exact(hidden.dtype)
        grad_weight = torch.zeros(weight.shape, dtype=exact, device=weight.device) if need_weight else None
        total = torch.zeros((), dtype=exact, device=hidden.device)
        for start, end in _tiles(hidden.shape[0], weight.shape[0]):
            tile, rows, scale = hidden[start:end], targets[start:end], token_weights[start:end].to(exact)
            logits = _tile_logits(tile, weight, 1.0)
            lse = torch.logsumexp(logits, dim=-1)
            total += (scale * (lse - logits.gather(1, rows[:, None]).squeeze(1))).sum()
            # d (-w log p_y) / d z = w * (p - onehot)
            grad_logits = logits.sub_(lse[:, None]).exp_().mul_(scale[:, None])
            grad_logits[torch.arange(end - start, device=tile.device), rows] -= scale
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = torch.mm(grad_logits, weight)
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().to(exact), tile.to(exact))
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            None if grad_hidden is None else (grad_hidden * grad_total).to(hidden_dtype),
            None if grad_weight is None else (grad_weight * grad_total).to(weight_dtype),
            None,
            None,
        )


def chunked_nll(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_weights: torch.Tensor
) -> torch.Tensor:
    """``-sum_t w_t log softmax(h_t W^T)[y_t]``, a scalar in at least float32: with ``w_t = 1 / N`` the mean
    cross-entropy of the ``N`` rows (transformers' causal-LM loss)."""
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        with torch.no_grad():
            logprobs, _, _ = _forward_tiles(hidden, weight, targets, 1.0, False)
        return -(logprobs * token_weights.to(logprobs.dtype)).sum()
    return _ChunkedNLL.apply(hidden, weight, targets, token_weights)
