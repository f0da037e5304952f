"""Packed rows attended per sequence: sdpa at the cost of each sequence's own length, not the row's.

A packed micro-batch is one flat row of several sequences with ``position_ids`` restarting for each
(``data/tokenize.py``). transformers' ``sdpa`` and ``eager`` turn that into a dense block-diagonal
mask, so a row of N tokens costs N^2 attention (and an N x N mask) however short its sequences are,
and SDPA cannot use its fused causal kernel: on CPU packing made SFT 7x slower per token than not
packing. ``flash_attention_2`` has a variable-length path for this; where it is missing (CPU, most
setups without the flash-attn package) this implementation, registered with transformers as
``posttrain_sdpa``, splits the row at the sequence boundaries and runs causal SDPA on each sequence
(cost sum n_i^2). Anything else (padded batches, generation with a cache, sliding windows) goes to
transformers' own sdpa unchanged, so it is a drop-in for ``sdpa`` everywhere.

Shared prefixes. A row of rollouts holds each prompt once and then its completions (``prefix_groups``, from
:func:`trainer_lib.models.lm_head.shared_prefix_inputs`): :func:`shared_prefix_sdpa` lets every completion
attend to its prompt and to itself, never to a sibling, so each completion's states are those of its whole
sequence while the prompt's are computed once for the group (the same states, to float rounding, tested).

Sequence boundaries, once per forward. The per-sequence loop slices with Python ints, and reading a
tensor on a GPU is a device-to-host sync, so the boundaries (the row's cumulative sequence lengths
``[0, n_1, n_1 + n_2, ..., N]``) are read once per forward, not once per layer. They come from

* ``cu_seq_lens_q`` when the caller passes it: transformers' own flash-attention kwargs (with
  ``cu_seq_lens_k`` and ``max_length_q``/``max_length_k``, as its
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` makes them), which every decoder
  hands from its forward to every attention call. With them ``flash_attention_2`` takes its varlen
  path with no sync in the layers. SFT's and DPO's packed batches carry them (:func:`boundary_kwargs`),
  except for remote modelling code, whose fixed ``forward`` signature would reject them.
* ``position_ids`` otherwise.

The first layer reads the tensor and caches the list under that very tensor object (a weak
reference, checked against the tensor's version counter); the later layers, and the recomputation
under gradient checkpointing, are handed the same object and find the list. So the bookkeeping stays
in this module: no stage passes anything extra to get it. transformers' mask builder reads the
position ids once per forward too (to see that the row is packed), whatever the attention.
"""

from __future__ import annotations

import functools

NAME = "posttrain_sdpa"
#: The keyword (passed through the model's forward to every attention call) of a row of shared prefixes:
#: :func:`shared_prefix_sdpa`'s ``groups``, built by :func:`trainer_lib.models.lm_head.shared_prefix_inputs`.
PREFIX_GROUPS = "prefix_groups"


def sequence_bounds(position_ids) -> list[int]:
    """``[0, ..., n]``: where each sequence of a packed ``[1, n]`` row starts (wherever a position does not follow
    the one before), then ``n``; one read of the row."""
    row = position_ids[0].tolist()
    return [0, *(i for i in range(1, len(row)) if row[i] != row[i - 1] + 1), len(row)]


@functools.cache
def _bounds_by_tensor():
    """Boundary lists by the tensor they were read from; an entry goes when its tensor does."""
    from torch.utils.weak import WeakIdKeyDictionary

    return WeakIdKeyDictionary()


def forward_bounds(cu_seq_lens, position_ids) -> list[int]:
    """The row's cumulative sequence lengths as a list: ``cu_seq_lens`` read, or derived from ``position_ids``;
    read once per tensor (inference-mode tensors, which have no version counter, every time)."""
    source = cu_seq_lens if cu_seq_lens is not None else position_ids
    if source.is_inference():
        return cu_seq_lens.tolist() if cu_seq_lens is not None else sequence_bounds(position_ids)
    cache = _bounds_by_tensor()
    version, bounds = cache.get(source, (None, None))
    if version != source._version:
        bounds = cu_seq_lens.tolist() if cu_seq_lens is not None else sequence_bounds(position_ids)
        cache[source] = (source._version, bounds)
    return bounds


def packed_sdpa(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers attention interface: ``query`` ``[b, heads, n, d]``; returns ``([b, n, heads, d], None)``."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids, cu_seq_lens = kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q")
    n = query.shape[2]
    groups = kwargs.get(PREFIX_GROUPS)
    if groups is not None:  # shared_prefix_inputs builds such a row only for models without sliding windows
        if (
            attention_mask is not None
            or query.shape[0] != 1
            or key.shape[2] != n
            or getattr(module, "sliding_window", None)
        ):
            raise ValueError(f"{PREFIX_GROUPS}: expected one packed row, no mask, no sliding window, no cache")
        return shared_prefix_sdpa(query, key, value, groups, dropout, scaling), None
    packed = (
        attention_mask is None
        and (position_ids is not None or cu_seq_lens is not None)
        and query.shape[0] == 1
        and n > 1
        and key.shape[2] == n
        and not getattr(module, "sliding_window", None)
    )
    bounds = forward_bounds(cu_seq_lens, position_ids) if packed else []
    if len(bounds) <= 2:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if bounds[0] != 0 or bounds[-1] != n:
        raise ValueError(f"cu_seq_lens_q runs from {bounds[0]} to {bounds[-1]}, but the packed row has {n} tokens")
    grouped = key.shape[1] != query.shape[1]
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                query[:, :, a:b],
                key[:, :, a:b],
                value[:, :, a:b],
                dropout_p=dropout,
                is_causal=True,
                scale=scaling,
                enable_gqa=grouped,
            )
            for a, b in zip(bounds[:-1], bounds[1:])
        ],
        dim=2,
    )
    return out.transpose(1, 2).contiguous(), None


def shared_prefix_sdpa(query, key, value, groups, dropout: float = 0.0, scaling=None):
    """Attention over a row of prefix groups (``[1, heads, n, d]`` in, ``[1, n, heads, d]`` out).

    ``groups``: ``(a, b, branches)`` each, where ``[a, b)`` is a prefix and every ``[s, e)`` of ``branches``
    a sequence that continues it (several rollouts of one prompt): the prefix attends causally to itself, a
    branch to the whole prefix and causally to itself, never to another branch. So each branch's states are
    those of its own whole sequence, while the prefix is computed once for all of them."""
    import torch
    import torch.nn.functional as F

    grouped = key.shape[1] != query.shape[1]
    parts = [None] * query.shape[2]

    def attend(q_span, k_spans, mask):
        q = query[:, :, q_span[0] : q_span[1]]
        k = torch.cat([key[:, :, a:b] for a, b in k_spans], dim=2)
        v = torch.cat([value[:, :, a:b] for a, b in k_spans], dim=2)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling, enable_gqa=grouped
        )

    for a, b, branches in groups:
        parts[a] = attend((a, b), [(a, b)], None)
        for s, e in branches:  # a branch's query t sees the prefix and its own tokens up to t
            length = e - s
            mask = torch.ones(length, b - a + length, dtype=torch.bool, device=query.device)
            mask[:, b - a :] = torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
            parts[s] = attend((s, e), [(a, b), (s, e)], mask)
    out = torch.cat([part for part in parts if part is not None], dim=2)
    return out.transpose(1, 2).contiguous()


def _mask(*args, attention_mask=None, local_size=None, **kwargs):
    """sdpa's mask, except that no dense mask is built for a row without padding: a packed row is split
    by :func:`packed_sdpa` instead, and an unpacked one is plainly causal. Sliding windows keep theirs."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and local_size is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, local_size=local_size, **kwargs)


def register() -> str:
    """Make ``posttrain_sdpa`` known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_sdpa)
    AttentionMaskInterface.register(NAME, _mask)
    return NAME
