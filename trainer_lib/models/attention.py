"""Packed rows attended per sequence: sdpa at the cost of each sequence's own length, not the row's.

A packed micro-batch is one flat row of several sequences with ``position_ids`` restarting for each
(``data/tokenize.py``). transformers' ``sdpa`` and ``eager`` turn that into a dense block-diagonal
mask, so a row of N tokens costs N^2 attention (and an N x N mask) however short its sequences are,
and SDPA cannot use its fused causal kernel: on CPU packing made SFT 7x slower per token than not
packing. ``flash_attention_2`` has a variable-length path for this; where it is missing (CPU, most
setups without the flash-attn package) this implementation, registered with transformers as
``posttrain_sdpa``, splits the row where the positions restart and runs causal SDPA on each sequence
(cost sum n_i^2). Anything else (padded batches, generation with a cache, sliding windows) goes to
transformers' own sdpa unchanged, so it is a drop-in for ``sdpa`` everywhere.
"""

from __future__ import annotations

NAME = "posttrain_sdpa"


def sequence_starts(position_ids) -> list[int]:
    """Where each packed sequence starts in a ``[1, n]`` row: wherever a position does not follow the one before."""
    import torch

    row = position_ids[0]
    follows = torch.ones_like(row, dtype=torch.bool)
    follows[1:] = row[1:] == row[:-1] + 1
    follows[0] = False
    return torch.nonzero(~follows).flatten().tolist()


def packed_sdpa(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers attention interface: ``query`` ``[b, heads, n, d]``; returns ``([b, n, heads, d], None)``."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    n = query.shape[2]
    packed = (
        attention_mask is None
        and position_ids is not None
        and query.shape[0] == 1
        and n > 1
        and key.shape[2] == n
        and not getattr(module, "sliding_window", None)
    )
    starts = sequence_starts(position_ids) if packed else []
    if len(starts) <= 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    grouped = key.shape[1] != query.shape[1]
    bounds = [*starts, n]
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
