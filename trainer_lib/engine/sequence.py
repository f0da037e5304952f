"""Sequence parallelism (``parallel.sequence=S``): one packed row split over the S ranks of a sequence
group, attention exchanging sequence chunks for heads all-to-all (Ulysses; Jacobs et al. 2023).

DeepSpeed ships the Hugging Face side of it (Arctic Long Sequence Training, Bekman et al. 2025;
``deepspeed.runtime.sequence_parallel.ulysses_sp`` in the pinned 0.19.8): ``UlyssesSPAttentionHF``
wraps the model's attention function. Before attention each rank holds ``N / S`` positions of all
heads; an all-to-all gives it all ``N`` positions of ``heads / S`` heads; the wrapped attention runs
there and a second all-to-all returns the chunk. Key-value heads fewer than S are replicated. Here
the wrapped function is our ``posttrain_sdpa`` (``models/attention.py``), so a packed row is attended
per sequence at the full length, with the row's boundaries as they were before the split; its
data-loader adapter is not used, the split being this module's :meth:`SequenceShards.split` of the
micro-batches our loops already make (one packed row each).

Losses. Each rank scores the positions it holds: the row's labels are shifted once, before the split
(a chunk's last position predicts the next chunk's first token), and a rank's loss is its share of
the row's sum (scaled by the row's whole count, :meth:`SequenceShards.sum`). DeepSpeed, handed the
sequence groups (``mpu``), sums gradients over every rank and divides by the data-parallel size only,
so the shares add up to the one-process gradient. Losses that are not sums over positions (DPO's
sigmoid of sequence log-prob differences) sum the per-sequence parts across the group with gradient
first (:meth:`SequenceShards.sum_with_grad`).
"""

from __future__ import annotations

import functools

from trainer_lib.errors import ConfigError


@functools.cache
def _groups(size: int):
    """DeepSpeed's sequence-parallel groups (its ``parallel_state_sp`` module, once per process)."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as groups

    groups.initialize_sequence_parallel(sequence_parallel_size=size)
    return groups


_WRAPPED: set[str] = set()

#: the keyword a split chunk's forward carries down to every attention call (transformers hands a model's extra
#: keywords to its attention functions, and gradient checkpointing's recomputation keeps them); a forward
#: without it attends whole sequences on its rank, unexchanged
EXCHANGE = "ulysses_exchange"


def register(model, size: int):
    """Wrap ``model``'s attention function in Ulysses' exchange over sequence groups of ``size`` ranks
    (once per attention function and process) and return DeepSpeed's ``mpu`` for ``deepspeed.initialize``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = getattr(model, "get_base_model", lambda: model)()
    attention = base.config._attn_implementation
    if attention in ("eager", None):
        raise ConfigError(
            f"parallel.sequence={size} with model.attn_implementation={attention}: eager attention builds the "
            f"whole row's mask; use sdpa (the default) or flash_attention_2"
        )
    groups = _groups(size)
    if attention not in _WRAPPED:
        ALL_ATTENTION_FUNCTIONS[attention] = _exchanging(ALL_ATTENTION_FUNCTIONS[attention], attention, groups)
        _WRAPPED.add(attention)
    return groups


def _exchanging(core, name: str, groups):
    """``core`` (an attention function) behind Ulysses' exchange for the calls that carry :data:`EXCHANGE`. One
    ``UlyssesSPAttentionHF`` per head layout (query heads, key-value heads, head size: a reference or reward
    model may differ from the policy), made at its first call; the module's ``num_key_value_groups``, which it
    rewrites when it replicates key-value heads, is put back after each call, for whole-sequence calls."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    exchanges: dict[tuple, UlyssesSPAttentionHF] = {}

    def exchanged(module, query, key, value, attention_mask, *args, **kwargs):
        if not kwargs.pop(EXCHANGE, False):  # a whole sequence on this rank (an RL rollout, its log-probs)
            return core(module, query, key, value, attention_mask, *args, **kwargs)
        layout = (query.shape[1], key.shape[1], query.shape[-1])  # before the exchange: every head
        if layout not in exchanges:
            exchanges[layout] = UlyssesSPAttentionHF(
                attn=core,
                batch_size=1,  # one packed row per micro-batch
                attn_head_count=layout[0],
                attn_head_size=layout[2],
                kv_head_count=layout[1],
                num_hidden_layers=1,  # (read only by its debugging mode)
                process_group=groups.get_sequence_parallel_group(),
                seq_length_is_variable=True,
            )
            exchanges[layout].core_attn_implementation = name
        groups_before = getattr(module, "num_key_value_groups", None)
        try:
            # the mask, if any, was built for this rank's chunk; the sequences are read from the
            # boundaries (or the gathered position ids) at the whole row's length
            return exchanges[layout](module, query, key, value, None, *args, **kwargs)
        finally:
            if groups_before is not None:
                module.num_key_value_groups = groups_before

    return exchanged


class SequenceShards:
    """This rank's place in its sequence group, the split of a packed row and the sums across the group."""

    def __init__(self, size: int):
        groups = _groups(size)
        self.group = groups.get_sequence_parallel_group()
        self.size, self.rank = size, groups.get_sequence_parallel_rank()

    def split(self, batch: dict, shifted: dict, pad_token_id: int = 0) -> tuple[dict, dict]:
        """``(this rank's inputs, its shifted tensors)`` of a packed one-row micro-batch: the row padded to a
        multiple of S with a sequence of its own, each of ``shifted``'s keys (``{key: fill}``) shifted one
        position left before the split (``out[:, i] = batch[key][:, i + 1]``: what position ``i`` predicts;
        ``fill`` at the end and over the padding), then everything cut into S equal chunks. The sequence
        boundaries (``cu_seq_lens_*``) stay the whole row's: attention runs on the whole row."""
        import torch
        import torch.nn.functional as F

        from trainer_lib.data.tokenize import boundary_kwargs

        ids, positions = batch["input_ids"], batch.get("position_ids")
        if ids.shape[0] != 1:
            raise ValueError(f"parallel.sequence splits one packed row, got a micro-batch of {ids.shape[0]} rows")
        length = ids.shape[1]
        pad = -length % self.size
        chunk = (length + pad) // self.size
        piece = slice(self.rank * chunk, (self.rank + 1) * chunk)
        if positions is None:
            positions = torch.arange(length, device=ids.device)[None]
        padded_ids = F.pad(ids, (0, pad), value=pad_token_id)
        positions = torch.cat([positions, torch.arange(pad, device=ids.device)[None]], dim=1)
        local = {"input_ids": padded_ids[:, piece], "position_ids": positions[:, piece].to(ids.device), EXCHANGE: True}
        bounds = batch.get("cu_seq_lens_q", batch.get("cu_seq_lens"))
        if bounds is not None:
            bounds = bounds.cpu().long()
            local.update(boundary_kwargs(torch.cat([bounds, bounds[-1:] + pad]) if pad else bounds, ids.device))
        moved = {key: F.pad(batch[key][:, 1:], (0, 1 + pad), value=fill)[:, piece] for key, fill in shifted.items()}
        return local, moved

    def sum(self, value):
        """``value`` (a tensor) summed over the sequence group, without gradient."""
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value, group=self.group)
        return value

    def sum_with_grad(self, value):
        """``value`` summed over the sequence group, for a loss every rank of the group then computes alike
        from the sum: its gradient comes back to each rank's part unchanged (each rank holds the whole
        loss, so nothing is summed on the way back; torch's differentiable all-reduce would sum S copies)."""
        return _replicated_sum().apply(value, self.group)

    def gather_with_grad(self, value):
        """The group's chunks of ``value`` ``(1, n)`` joined in rank order ``(1, S x n)``, for a loss every rank of
        the group then computes alike; each rank's gradient is its own chunk's slice (nothing summed back)."""
        return _replicated_gather().apply(value, self.group, self.size, self.rank)

    def gather_objects(self, value) -> list:
        """``value`` (picklable: tensors on the CPU, lists) of every rank of the group, in rank order."""
        import torch.distributed as dist

        found = [None] * self.size
        dist.all_gather_object(found, value, group=self.group)
        return found


@functools.cache
def _replicated_gather():
    """The autograd function of :meth:`SequenceShards.gather_with_grad` (built on first use)."""
    import torch

    class ReplicatedGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value, group, size, rank):
            import torch.distributed as dist

            parts = [torch.empty_like(value) for _ in range(size)]
            dist.all_gather(parts, value.contiguous(), group=group)
            ctx.rank, ctx.width = rank, value.shape[-1]
            return torch.cat(parts, dim=-1)

        @staticmethod
        def backward(ctx, grad):
            start = ctx.rank * ctx.width
            return grad[..., start : start + ctx.width], None, None, None

    return ReplicatedGather


@functools.cache
def _replicated_sum():
    """The autograd function of :meth:`SequenceShards.sum_with_grad` (built on first use: no torch at import)."""
    import torch

    class ReplicatedSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value, group):
            import torch.distributed as dist

            total = value.clone()
            dist.all_reduce(total, group=group)
            return total

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    return ReplicatedSum
