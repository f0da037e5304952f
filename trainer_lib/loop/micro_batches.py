"""Deterministic data order shared by every training loop, and a split cut into micro-batches.

Each optimizer step consumes ``gradient_accumulation_steps x world_size`` micro-batches; which
ones is a pure function of (seed, step, slot, rank), so resuming needs only the step count. The
recipes on a fixed data set (sft, reward, dpo) iterate them like this::

    train = SplitBatches(examples, micro_batches(examples, cfg.batch_size, ...), collate)
    order = TrainOrder(cfg, train, strategy.world_size, strategy.rank)
    for step in cadence.steps():
        for ids, batch in order.micro_batches(step):
            ...  # the recipe's forward, backward, optimizer step and metrics
        cadence.after_step(step, epoch=order.epoch(step))
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trainer_lib.config import TrainingConfig


class MicroBatchSchedule:
    """Which micro-batch each (step, accumulation slot, rank) trains on.

    Micro-batch ``k = (step * accumulation + slot) * world + rank`` of an endless stream that
    reshuffles every epoch with ``seed + epoch``. So 2 processes at accumulation 1 see exactly
    the batches 1 process sees at accumulation 2, and a resumed run continues where it stopped.
    """

    def __init__(self, num_batches: int, accumulation: int, world_size: int, seed: int):
        self.num_batches, self.accumulation, self.world, self.seed = num_batches, accumulation, world_size, seed
        self._perms: dict[int, list[int]] = {}

    def batches_per_step(self) -> int:
        return self.accumulation * self.world

    def index(self, step: int, slot: int, rank: int) -> tuple[int, int]:
        """(epoch, micro-batch id) for one slot."""
        k = (step * self.accumulation + slot) * self.world + rank
        epoch, pos = divmod(k, self.num_batches)
        if epoch not in self._perms:
            perm = list(range(self.num_batches))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(perm)
            self._perms = {epoch: perm}
        return epoch, self._perms[epoch][pos]


def total_steps(cfg: TrainingConfig, num_batches: int, batches_per_step: int) -> int:
    if cfg.num_epochs > 0:
        return max(1, math.ceil(cfg.num_epochs * num_batches / batches_per_step))
    return cfg.max_steps


@dataclass
class SplitBatches:
    examples: Any  # tokenized examples: a memory-mapped Dataset or a list of dicts
    groups: list[list[int]]  # the example indices of each micro-batch
    collate: Callable[[list], dict]  # examples -> one collated micro-batch

    def collated(self, ids: list[int]) -> dict:
        """The micro-batch of the examples ``ids``."""
        return self.collate([self.examples[i] for i in ids])


class TrainOrder:
    """The micro-batches of ``split`` that this rank trains on at each optimizer step: ``gradient_accumulation_steps``
    of them, in :class:`MicroBatchSchedule` order; ``steps`` is the number of optimizer steps of the run."""

    def __init__(self, cfg: TrainingConfig, split: SplitBatches, world_size: int, rank: int):
        self.split, self.rank = split, rank
        num_batches = len(split.groups)
        self.schedule = MicroBatchSchedule(num_batches, cfg.engine.gradient_accumulation_steps, world_size, cfg.seed)
        self.steps = total_steps(cfg, num_batches, self.schedule.batches_per_step())

    def micro_batches(self, step: int) -> Iterator[tuple[list[int], dict]]:
        """``(example ids, collated micro-batch)`` for each gradient-accumulation slot of ``step``."""
        for slot in range(self.schedule.accumulation):
            _, group = self.schedule.index(step, slot, self.rank)
            yield self.split.groups[group], self.split.collated(self.split.groups[group])

    def covers_epoch(self) -> bool:
        """Whether the run trains on every micro-batch at least once."""
        return self.steps * self.schedule.batches_per_step() >= len(self.split.groups)

    def epoch(self, step: int) -> int:
        """The epoch of the last micro-batch of ``step`` (for the log)."""
        return self.schedule.index(step, self.schedule.accumulation - 1, self.rank)[0]
