"""Reference log-probs for preference training, three ways behind one call signature.

    reference(split_name, example_ids, batch) -> SequenceLogps

* :class:`FrozenModelReference`: a separate frozen model evaluated on the same batch.
* :class:`AdapterReference`: the LoRA policy with its adapters disabled, i.e. exactly the base
  weights; no second model in memory.
* :class:`PrecomputedReference`: a table computed once before training by one of the above
  (:func:`precomputed_reference`) and cached under a fingerprint of the reference model and every
  token id, so a retried or resumed run loads it instead of recomputing.

Batches are laid out by :mod:`trainer_lib.data.preference_batches` (``2B`` rows, two halves).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer_lib import storage


@dataclass
class SequenceLogps:
    """Summed completion log-probs ``(B,)`` of a collated batch's two halves and their token counts:
    chosen / rejected, or for unpaired (KTO) batches the completion / its mismatched KL completion."""

    chosen: Any
    rejected: Any
    chosen_tokens: Any
    rejected_tokens: Any

    def stacked(self):
        """``(B, 4)``: chosen, rejected, chosen_tokens, rejected_tokens."""
        import torch

        return torch.stack([self.chosen, self.rejected, self.chosen_tokens.float(), self.rejected_tokens.float()], -1)


def forward_logps(model, batch: dict, device, shards=None) -> SequenceLogps:
    """ONE forward pass over all ``2B`` rows of a batch -> per-sequence log-probs of each half; with ``shards``
    (:class:`~trainer_lib.engine.sequence.SequenceShards`, ``parallel.sequence > 1``) the packed row split
    over the sequence group, each rank's sums added across it."""
    from trainer_lib.data.preference_batches import model_inputs, sequence_logps, split_halves, summed_logps
    from trainer_lib.models.lm_head import position_logprobs, scored_logprobs

    if shards is not None:
        whole = {key: value.to(device) for key, value in batch.items() if hasattr(value, "to")}
        inputs, shifted = shards.split(whole, {"input_ids": 0, "completion_mask": False, "segment_ids": 0})
        mask = shifted["completion_mask"]
        per_token, _ = position_logprobs(model, inputs, shifted["input_ids"], mask)
        summed, counts = summed_logps(per_token, mask, shifted["segment_ids"], rows=len(batch["cu_seq_lens"]) - 1)
        summed, counts = shards.sum_with_grad(summed), shards.sum(counts)
        return SequenceLogps(*split_halves(summed), *split_halves(counts))

    inputs, ids, segments = model_inputs(batch, device), batch["input_ids"], batch.get("segment_ids")
    mask = batch["completion_mask"][:, 1:].to(device)
    scored = scored_logprobs(model, inputs, ids[:, 1:].to(device), mask)
    if scored is None:
        logits = model(**inputs, use_cache=False).logits
        summed, counts = sequence_logps(logits, ids, batch["completion_mask"], segments)
    else:
        summed, counts = summed_logps(scored[0], mask, segments)
    return SequenceLogps(*split_halves(summed), *split_halves(counts))


class FrozenModelReference:
    """A separate frozen model, evaluated on the same batch."""

    def __init__(self, model, device, shards=None):
        self.model, self.device, self.shards = model, device, shards

    def __call__(self, split: str, ids: list[int], batch: dict) -> SequenceLogps:
        import torch

        with torch.no_grad():
            return forward_logps(self.model, batch, self.device, self.shards)


class AdapterReference:
    """The LoRA policy with adapters disabled: exactly the base weights, no second copy in memory."""

    def __init__(self, engine, strategy, shards=None):
        self.engine, self.strategy, self.shards = engine, strategy, shards

    def __call__(self, split: str, ids: list[int], batch: dict) -> SequenceLogps:
        import torch

        with torch.no_grad(), self.strategy.unwrap(self.engine).disable_adapter():
            return forward_logps(self.engine, batch, self.strategy.device, self.shards)


class StartingPolicyReference:
    """The policy itself before its first step, in eval mode: the reference model when that is the model the
    policy was loaded from, with no second copy loaded. Only for computing a precomputed table before training
    starts (or resumes): afterwards the policy is no longer its starting model."""

    def __init__(self, engine, strategy, shards=None):
        self.engine, self.strategy, self.shards = engine, strategy, shards

    def __call__(self, split: str, ids: list[int], batch: dict) -> SequenceLogps:
        import torch

        module = self.strategy.unwrap(self.engine)
        was_training = module.training
        module.eval()  # as a frozen reference runs: no dropout
        try:
            with torch.no_grad():
                return forward_logps(self.engine, batch, self.strategy.device, self.shards)
        finally:
            module.train(was_training)


class PrecomputedReference:
    """Log-probs looked up by example index in ``{split: (N, 4) tensor}`` tables."""

    def __init__(self, tables: dict, device):
        self.tables, self.device = tables, device

    def __call__(self, split: str, ids: list[int], batch: dict) -> SequenceLogps:
        rows = self.tables[split][ids].to(self.device)
        return SequenceLogps(rows[:, 0].float(), rows[:, 1].float(), rows[:, 2], rows[:, 3])


#: Seconds between two progress lines of :func:`compute_reference_tables` (a large set takes an hour on a CPU).
PROGRESS_EVERY_S = 60.0


class Progress:
    """A line on rank 0 every :data:`PROGRESS_EVERY_S` seconds: ``done/total`` batches of one split."""

    def __init__(self, strategy, name: str, total: int, started: float):
        self.strategy, self.name, self.total, self.started = strategy, name, total, started
        self.done, self.said = 0, time.time()

    def advance(self) -> None:
        self.done += 1
        if time.time() - self.said >= PROGRESS_EVERY_S:
            self.said = time.time()
            elapsed = self.said - self.started
            self.strategy.print(f"reference log-probs: {self.name}: {self.done}/{self.total} batches, {elapsed:.0f} s")


def compute_reference_tables(reference, sets: dict, strategy, batch_size: int) -> dict:
    """``{split: (N, 4) float64}`` from a live reference over every example of every split in
    ``sets`` (objects with ``examples`` and ``collate``); ranks take shards, then sum. Rank 0 says how far
    its own share is (:class:`Progress`)."""
    import torch

    tables, started = {}, time.time()
    for name, split in sets.items():
        count = len(split.examples)
        groups = [list(range(i, min(i + batch_size, count))) for i in range(0, count, batch_size)]
        share = -(-len(groups) // strategy.data_world_size)
        strategy.print(f"reference log-probs: {name}: {count} examples, {share} batches of {batch_size} on this rank")
        progress = Progress(strategy, name, share, started)

        def rows(group: list[int], name=name, split=split, count=count, progress=progress) -> dict:
            table = torch.zeros(count, 4, dtype=torch.float64)  # this group's rows; others stay 0
            logps = reference(name, group, split.collate([split.examples[i] for i in group]))
            table[group] = logps.stacked().double().cpu()
            progress.advance()
            return {"table": table}

        zeros = {"table": torch.zeros(count, 4, dtype=torch.float64)}
        tables[name] = strategy.sharded_sums(groups, rows, zeros)["table"].cpu()
    return tables


def precomputed_reference(
    sets: dict, strategy, make_live: Callable, directory: str, identity: list[str], batch_size: int
) -> tuple[PrecomputedReference, str]:
    """``(reference, "loaded" | "computed")``.

    The cache file is ``<directory>/<fingerprint[:16]>.pt``, the fingerprint covering ``identity``
    (reference model, precision) and every token id of ``sets``. On a miss, ``make_live()`` builds a
    live reference that is used once and dropped; rank 0 stores the tables.
    """
    import torch

    from trainer_lib.data.preference_batches import token_fingerprint

    fingerprint = token_fingerprint(
        [ex for s in sets.values() for ex in s.examples],
        *identity,
        *(f"{name}:{len(s.examples)}" for name, s in sets.items()),
    )
    path = storage.join(directory, f"{fingerprint[:16]}.pt")
    if storage.exists(path):
        stored = torch.load(io.BytesIO(storage.read_bytes(path)), weights_only=True)
        if stored.get("fingerprint") == fingerprint:
            strategy.print(f"reference log-probs loaded from {path}")
            return PrecomputedReference(stored["tables"], strategy.device), "loaded"
    live = make_live()
    tables = compute_reference_tables(live, sets, strategy, batch_size)
    del live
    if strategy.is_rank_0:
        buffer = io.BytesIO()
        torch.save({"fingerprint": fingerprint, "identity": list(identity), "tables": tables}, buffer)
        storage.write_bytes(path, buffer.getvalue())
        strategy.print(f"reference log-probs computed and stored at {path}")
    strategy.barrier()
    return PrecomputedReference(tables, strategy.device), "computed"
