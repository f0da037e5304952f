"""Deterministic data order shared by every training loop.

Each optimizer step consumes ``gradient_accumulation_steps x world_size`` micro-batches; which
ones is a pure function of (seed, step, slot, rank), so resuming needs only the step count.
"""

from __future__ import annotations

import math
import random

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
