"""A tokenized split cut into micro-batches, and the order training takes them in: what the recipes on a
fixed data set (sft, reward, dpo) iterate.

    train = SplitBatches(examples, micro_batches(examples, cfg.batch_size, ...), collate)
    order = TrainOrder(cfg, train, strategy.world_size, strategy.rank)
    for step in cadence.steps():
        for ids, batch in order.micro_batches(step):
            ...  # the recipe's forward, backward, optimizer step and metrics
        cadence.after_step(step, epoch=order.epoch(step))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trainer_lib.config import TrainingConfig
from trainer_lib.loop.micro_batches import MicroBatchSchedule, total_steps


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

    def epoch(self, step: int) -> int:
        """The epoch of the last micro-batch of ``step`` (for the log)."""
        return self.schedule.index(step, self.schedule.accumulation - 1, self.rank)[0]
