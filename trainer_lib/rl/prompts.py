"""Which prompts each rank takes at each RL step, the step's sampling seed, and the walk over
shuffled mini-batches of micro-batches that the update phase of PPO and GRPO shares.

All of it is a pure function of (seed, step, rank), so a resumed run samples the same prompts
and completions and updates in the same order as an uninterrupted one. This is the default
(``buffer.mode=shuffle``); :mod:`trainer_lib.rl.buffer` draws from a live, prioritized pool instead,
with the same methods.
"""

from __future__ import annotations

from collections.abc import Iterator

from trainer_lib.loop.micro_batches import MicroBatchSchedule, total_steps

#: Datasets the RL stages read prompts from (only the ``prompt`` column is used as input;
#: every other column goes to the reward functions).
PROMPT_FORMATS = ("prompt_only", "prompt_completion", "preference", "unpaired_preference")


def step_seed(seed: int, step: int, rank: int) -> int:
    """Sampling seed of one rank at one step: a resumed run draws the same completions."""
    return ((seed * 1_000_003 + step) * 1_009 + rank) % (2**63)


def minibatch_order(count: int, mini: int, micro: int, seed: int) -> list[list[list[int]]]:
    """A shuffled split of ``count`` rows into mini-batches of micro-batches (row lists)."""
    import torch

    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    return [[order[m + i : m + i + micro] for i in range(0, mini, micro)] for m in range(0, count, mini)]


class PromptSchedule:
    """Prompts of a step for one rank, and the micro-batches of its update phase.

    ``prompts_per_step`` prompts (all ranks together) per step, drawn epoch by epoch from a
    seeded shuffle of ``prompts``; each rank holds ``rollout.n`` completions of each of its
    prompts, walked ``ppo_epochs`` times in mini-batches of ``mini_batch`` / world sequences.
    """

    def __init__(self, cfg, prompts: list, world_size: int, rank: int):
        self.prompts, self.seed, self.rank = prompts, cfg.seed, rank
        self.prompts_per_step = cfg.prompts_per_step
        self.prompts_per_rank = cfg.prompts_per_step // world_size
        self.sequences = self.prompts_per_rank * cfg.rollout.n
        self.mini = cfg.mini_batch // world_size
        self.micro, self.epochs = cfg.batch_size, cfg.ppo_epochs
        self._order = MicroBatchSchedule(len(prompts), self.prompts_per_rank, world_size, cfg.seed)
        self.steps = total_steps(cfg, len(prompts), cfg.prompts_per_step)

    def stateful(self) -> dict:
        """Named objects to keep in checkpoints (Cadence's ``stateful``): none, all is a pure function."""
        return {}

    def before_step(self, step: int) -> None:
        """Between steps: nothing to update in a fixed shuffle."""

    def collect(self, step: int, run):
        """``(rollout, scores, metrics)`` of ``step``: ``run(rows, seed)`` on this rank's rows."""
        return run(self.rows(step), self.sampling_seed(step))

    def rows(self, step: int) -> list:
        """This rank's prompt rows at ``step``."""
        return [self.prompts[self._order.index(step, slot, self.rank)[1]] for slot in range(self.prompts_per_rank)]

    def trainer_state(self, step: int):
        """What reward functions are told about the run while they score step ``step`` (0-based)."""
        from trainer_lib.rewards.functions import TrainerState

        return TrainerState(
            global_step=step, epoch=step * self.prompts_per_step / len(self.prompts), max_steps=self.steps
        )

    def sampling_seed(self, step: int) -> int:
        return step_seed(self.seed, step, self.rank)

    def update_micro_batches(self, step: int) -> Iterator[list[int]]:
        """Row lists of this rank's sequences, ``ppo_epochs`` passes of shuffled mini-batches; the
        engine steps the optimizer once per mini-batch (its accumulation is mini / micro)."""
        for epoch in range(self.epochs):
            for minibatch in minibatch_order(self.sequences, self.mini, self.micro, self.sampling_seed(step) + epoch):
                yield from minibatch
