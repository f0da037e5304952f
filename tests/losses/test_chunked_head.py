"""The tiled LM-head log-probs and loss equal the full-logits computation, values and gradients."""

import pytest
import torch

import trainer_lib.losses.chunked_head as chunked
from trainer_lib.losses.chunked_head import chunked_logprobs, chunked_nll


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 3 rows at a 50-token vocabulary, so every case below spans several tiles."""
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 150)


def _inputs(dtype=torch.float64, rows=11, hidden=8, vocab=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=gen, dtype=dtype)
    w = torch.randn(vocab, hidden, generator=gen, dtype=dtype)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    return h, w, targets


def _full_logprobs(h, w, targets, temperature=1.0):
    logits = (h @ w.t()) / temperature
    log_p = torch.log_softmax(logits, -1)
    return log_p.gather(1, targets[:, None]).squeeze(1), -(log_p.exp() * log_p).sum(-1)


def _grads(fn, h, w, frozen):
    h = h.clone().requires_grad_()
    w = w.clone().requires_grad_(not frozen)
    out = fn(h, w)
    out.backward()
    return out.detach(), h.grad, w.grad


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable-head", "frozen-head"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_gradients_equal_full_logits(small_tiles, frozen, temperature):
    h, w, targets = _inputs()
    upstream = torch.randn(h.shape[0], generator=torch.Generator().manual_seed(1), dtype=h.dtype)
    want = _grads(lambda a, b: (_full_logprobs(a, b, targets, temperature)[0] * upstream).sum(), h, w, frozen)
    got = _grads(lambda a, b: (chunked_logprobs(a, b, targets, temperature)[0] * upstream).sum(), h, w, frozen)
    assert chunked.rows_per_tile(w.shape[0]) == 3
    torch.testing.assert_close(got[0].double(), want[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[1], want[1], rtol=1e-9, atol=1e-9)
    if frozen:
        assert got[2] is None
    else:
        torch.testing.assert_close(got[2], want[2], rtol=1e-9, atol=1e-9)


def test_entropy_equals_full_logits_and_carries_no_gradient(small_tiles):
    h, w, targets = _inputs()
    logprobs, entropy = chunked_logprobs(h.requires_grad_(), w, targets, 0.5, with_entropy=True)
    want_logprobs, want_entropy = _full_logprobs(h.detach(), w, targets, 0.5)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(logprobs.detach().double(), want_logprobs, rtol=1e-9, atol=1e-9)
    assert logprobs.requires_grad and not entropy.requires_grad


def test_nll_is_the_weighted_cross_entropy_with_its_gradients(small_tiles):
    h, w, targets = _inputs(rows=13)
    weights = torch.rand(13, generator=torch.Generator().manual_seed(2), dtype=h.dtype)
    cross_entropy = torch.nn.functional.cross_entropy
    want = _grads(lambda a, b: (cross_entropy(a @ b.t(), targets, reduction="none") * weights).sum(), h, w, False)
    got = _grads(lambda a, b: chunked_nll(a, b, targets, weights) * 3.0, h, w, False)  # an upstream scale
    torch.testing.assert_close(got[0].double(), want[0] * 3.0, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[1], want[1] * 3.0, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got[2], want[2] * 3.0, rtol=1e-9, atol=1e-9)


def test_float32_matches_float64_within_rounding(small_tiles):
    h, w, targets = _inputs(dtype=torch.float32, rows=40, hidden=32)
    logprobs, _ = chunked_logprobs(h, w, targets)
    want, _ = _full_logprobs(h.double(), w.double(), targets)
    assert (logprobs.double() - want).abs().max() < 1e-4


def test_without_grad_nothing_is_kept_for_backward(small_tiles):
    h, w, targets = _inputs()
    with torch.no_grad():
        logprobs, _ = chunked_logprobs(h.requires_grad_(), w, targets)
        loss = chunked_nll(h, w, targets, torch.ones(h.shape[0], dtype=h.dtype))
    assert logprobs.grad_fn is None and loss.grad_fn is None
    torch.testing.assert_close(-logprobs.sum(), loss, rtol=1e-9, atol=1e-9)
