"""A live pool of RL prompts: prioritized draws, DAPO's dynamic sampling, prompts added while training.

``buffer.mode=priority``: prompt ``i`` has a priority ``p_i`` (1.0 until it is first drawn, then the
learning signal of its last group of completions), and a step draws ``prompts_per_step`` distinct
prompts with probabilities

    P(i) = (1 - uniform_mix) * p_i^(1/T) / sum_j p_j^(1/T) + uniform_mix / N

prioritized replay's proportional variant (Schaul et al. 2016, eq. 1, with alpha = 1/T) plus a
uniform share, so that every prompt keeps at least ``uniform_mix / N`` and none starves.
``buffer.mode=uniform``: ``P(i) = 1 / N``. The draw without replacement takes the largest keys
``log(u_i) / P(i)`` (Efraimidis and Spirakis 2006), ``u_i`` from a generator seeded by (seed, step,
round): a draw is a pure function of the seed and the pool's state, the same on every rank, and a
resumed run (which restores the state) draws what an uninterrupted one draws.

The learning signal of a group, one per stage (computed from the training rewards of its ``rollout.n``
completions, gathered from all ranks by one all-reduce, so every rank holds the same priorities):

* GRPO, :func:`group_reward_std`: the standard deviation of the group's rewards. A group whose rewards
  are all equal has no advantage at all, so it teaches nothing.
* PPO, :func:`reward_deviation`: the mean absolute difference between the group's rewards and the
  step's mean reward, an advantage estimate with the batch mean as baseline (the critic's own
  advantages come later in the step).

``buffer.dynamic_sampling`` (DAPO, Yu et al. 2025, eq. 11's constraint): groups whose rewards are all
equal are dropped and further prompts drawn (excluding the step's earlier ones) until every rank holds
``prompts_per_step / world`` groups, at most ``buffer.max_resample_rounds`` extra rounds; slots still
empty then take dropped groups, so a step's batch keeps its size.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random

from trainer_lib.errors import UserError
from trainer_lib.rl.feedback import FeedbackFiles, prompt_key
from trainer_lib.rl.prompts import PromptSchedule

INITIAL_PRIORITY = 1.0  # prompts not drawn yet: above most signals, so new prompts are tried soon


# --------------------------------------------------------------------------- learning signals


def group_reward_std(groups, batch_mean: float):
    """GRPO: per group (row of ``groups`` ``(G, n)``), the standard deviation of its rewards."""
    return groups.std(dim=1, unbiased=False)


def reward_deviation(groups, batch_mean: float):
    """PPO: per group, the mean of ``|r - batch mean|`` over its completions."""
    return (groups - batch_mean).abs().mean(dim=1)


# --------------------------------------------------------------------------- the pool


class PromptBuffer:
    """Prompt rows (the training prompts, then those added), their priorities and visit counts."""

    def __init__(self, rows: list[dict], seed: int, prioritized: bool, temperature: float = 1.0, mix: float = 0.1):
        self.rows, self.base = rows, len(rows)
        self.seed, self.prioritized, self.temperature, self.mix = seed, prioritized, temperature, mix
        self.priority = [INITIAL_PRIORITY] * len(rows)
        self.visits = [0] * len(rows)
        self.keys = {prompt_key(row["prompt"]) for row in rows}

    def probabilities(self) -> list[float]:
        """``P(i)`` of every prompt (module docstring)."""
        count = len(self.priority)
        weights = [p ** (1.0 / self.temperature) if p > 0 else 0.0 for p in self.priority]
        total = sum(weights)
        if not self.prioritized or total <= 0:
            return [1.0 / count] * count
        return [(1.0 - self.mix) * w / total + self.mix / count for w in weights]

    def draw(self, step: int, round_: int, count: int, exclude: set[int] | frozenset = frozenset()) -> list[int]:
        """``count`` distinct prompt indices (fewer if the pool has no more), most likely first;
        ``exclude``: indices already taken this step."""
        rng = random.Random(f"prompt-buffer/{self.seed}/{step}/{round_}")
        keyed = []
        for i, p in enumerate(self.probabilities()):
            u = 1.0 - rng.random()  # in (0, 1]
            if i not in exclude:
                keyed.append((math.log(u) / p if p > 0 else -math.inf, -i))
        return [-negative for _, negative in heapq.nlargest(count, keyed)]

    def update(self, indices: list[int], signals: list[float]) -> None:
        """Set the priorities of the drawn prompts to their groups' learning signals."""
        for i, signal in zip(indices, signals):
            self.priority[i] = float(signal) if math.isfinite(signal) else 0.0  # a NaN reward teaches nothing
            self.visits[i] += 1

    def add(self, rows: list[dict]) -> int:
        """Append the rows whose prompt is not in the pool yet; how many were added."""
        added = 0
        for row in rows:
            key = prompt_key(row["prompt"])
            if key not in self.keys:
                self.keys.add(key)
                self.rows.append(row)
                self.priority.append(INITIAL_PRIORITY)
                self.visits.append(0)
                added += 1
        return added

    def state_dict(self) -> dict:
        import torch

        return {
            "added": [dict(row) for row in self.rows[self.base :]],
            "priority": torch.tensor(self.priority, dtype=torch.float64),
            "visits": torch.tensor(self.visits, dtype=torch.int64),
        }

    def load_state_dict(self, state: dict) -> None:
        del self.rows[self.base :]
        self.rows.extend(dict(row) for row in state["added"])
        self.priority = [float(p) for p in state["priority"].tolist()]
        self.visits = [int(v) for v in state["visits"].tolist()]
        if len(self.priority) != len(self.rows):
            raise UserError(
                f"resume: the checkpoint's prompt pool has {len(self.priority)} prompts, but data.path gives "
                f"{self.base} and the checkpoint adds {len(self.rows) - self.base}: data.path changed since"
            )
        self.keys = {prompt_key(row["prompt"]) for row in self.rows}


# --------------------------------------------------------------------------- the schedule over it


class BufferedSchedule(PromptSchedule):
    """The prompts of each step drawn from a :class:`PromptBuffer` (the update phase's walk over
    mini-batches is :class:`PromptSchedule`'s). Saved in checkpoints as ``prompt_buffer``."""

    def __init__(self, cfg, buffer: PromptBuffer, strategy, signal, feedback: FeedbackFiles | None = None):
        super().__init__(cfg, buffer.rows, strategy.world_size, strategy.rank)
        if len(buffer.rows) < cfg.prompts_per_step:
            raise UserError(
                f"buffer.mode={cfg.buffer.mode}: data.path has {len(buffer.rows)} prompts, fewer than "
                f"prompts_per_step ({cfg.prompts_per_step}); a step draws distinct prompts"
            )
        self.buffer, self.strategy, self.signal, self.feedback = buffer, strategy, signal, feedback
        self.world, self.n = strategy.world_size, cfg.rollout.n
        self.dynamic, self.max_rounds = cfg.buffer.dynamic_sampling, cfg.buffer.max_resample_rounds
        self.counts = {"files": 0, "skipped_files": 0, "prompts": 0}

    @classmethod
    def build(cls, cfg, rows: list[dict], strategy, tokenizer, signal) -> BufferedSchedule:
        b = cfg.buffer
        buffer = PromptBuffer(rows, cfg.seed, b.mode == "priority", b.temperature, b.uniform_mix)
        feedback = None
        if cfg.data.feedback_path:
            import os

            from trainer_lib.data.preference_batches import encode_prompt

            if os.path.isfile(os.path.expanduser(cfg.data.feedback_path)):
                raise UserError(f"data.feedback_path: {cfg.data.feedback_path} is a file; expected a directory")

            feedback = FeedbackFiles(
                cfg.data.feedback_path,
                list(rows[0]),
                isinstance(rows[0]["prompt"], list),
                lambda prompt: len(encode_prompt(tokenizer, prompt)) <= cfg.data.max_length,
            )
        return cls(cfg, buffer, strategy, signal, feedback)

    def stateful(self) -> dict:
        return {"prompt_buffer": self}

    def state_dict(self) -> dict:
        known = sorted(self.feedback.known) if self.feedback is not None else []
        return {**self.buffer.state_dict(), "files": [list(k) for k in known], "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state)
        self.counts = dict(state["counts"])
        if self.feedback is not None:
            self.feedback.known = {(name, sha) for name, sha in state["files"]}

    # ---- between steps: feedback files

    def before_step(self, step: int) -> None:
        """Add the prompts of feedback files that arrived (all ranks see the same files, or none is read)."""
        if self.feedback is None:
            return
        arrivals = self.feedback.poll()
        if not self.agreed([f"{a.name}\0{a.sha256}" for a in arrivals]):
            return  # some rank does not see them yet: next step
        for arrival in arrivals:
            try:
                rows, counts = self.feedback.read(arrival)
            except UserError as exc:
                self.counts["skipped_files"] += 1
                self.feedback.remember(arrival)
                if self.strategy.is_rank_0:
                    import logging

                    logging.getLogger(__name__).warning("data.feedback_path: skipped a file: %s", exc)
                continue
            added = self.buffer.add(rows)
            self.feedback.remember(arrival)
            self.counts["files"] += 1
            self.counts["prompts"] += added
            dropped = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items() if k != "rows" and v)
            self.strategy.print(
                f"feedback: before step {step + 1}: {arrival.name}: {added} of {counts['rows']} prompts added "
                f"({len(rows) - added} already in the pool{', ' + dropped if dropped else ''}); "
                f"{len(self.prompts)} prompts"
            )

    def agreed(self, items: list[str]) -> bool:
        """Whether every rank passes the same ``items`` (two all-reduces of a 40-bit digest)."""
        if self.world == 1:
            return True
        digest = float(int(hashlib.sha256("\n".join(items).encode()).hexdigest()[:10], 16))
        return self.strategy.all_reduce(digest, op="max") * self.world == self.strategy.all_reduce(digest, op="sum")

    # ---- a step's experience

    def round_seed(self, step: int, round_: int) -> int:
        return (self.sampling_seed(step) + round_ * 1_000_000_007) % (2**63)

    def collect(self, step: int, run):
        """``(rollout, scores, metrics)`` of this rank's ``prompts_per_rank`` groups at ``step``;
        ``run(rows, seed)`` samples and scores rows (module docstring for the rounds)."""
        import torch

        need, width, world, rank = self.prompts_per_rank, self.prompts_per_rank, self.world, self.rank
        drawn: set[int] = set()
        rounds, kept, spare = [], [], []  # (rollout, scores, metrics, width) each; kept, dropped: (round, group)
        dropped = refilled = unfilled = 0.0
        for round_ in range(1 + (self.max_rounds if self.dynamic else 0)):
            chosen = self.buffer.draw(step, round_, width * world, drawn)
            if len(chosen) < width * world:
                break  # the pool is used up
            drawn.update(chosen)
            mine = chosen[rank * width : (rank + 1) * width]
            rollout, scores, metrics = run([self.prompts[i] for i in mine], self.round_seed(step, round_))
            rounds.append((rollout, scores, metrics, width))
            groups = scores.detach().double().cpu().view(width, self.n)
            equal = (groups.max(1).values == groups.min(1).values).tolist()
            for group, same in enumerate(equal):
                if self.dynamic and same:
                    spare.append((round_, group))
                elif len(kept) < need:
                    kept.append((round_, group))
            total = self.strategy.all_reduce({"sum": float(groups.sum()), "count": float(groups.numel())}, op="sum")
            # one all-reduce: every drawn prompt's signal, every rank's empty slots, dropped groups
            shared = torch.zeros(width * world + world + 1, dtype=torch.float64)
            shared[rank * width : (rank + 1) * width] = self.signal(groups, total["sum"] / total["count"])
            shared[width * world + rank] = need - len(kept)
            shared[-1] = sum(equal) if self.dynamic else 0
            shared = self.strategy.all_reduce(shared, op="sum").cpu()
            self.buffer.update(chosen, shared[: width * world].tolist())
            missing = shared[width * world : -1]
            dropped += float(shared[-1])
            refilled += (unfilled - float(missing.sum())) if round_ else 0.0
            unfilled, width = float(missing.sum()), int(missing.max())
            if width == 0:
                break
        kept += spare[: need - len(kept)]  # the bound is reached: dropped groups fill the rest
        rollout, scores, metrics = self.assemble(rounds, kept)
        metrics.update({"buffer/prompts": len(self.prompts), "buffer/priority_mean": self.priority_mean()})
        if self.feedback is not None:
            metrics.update({f"buffer/feedback_{k}": v for k, v in self.counts.items()})
        if self.dynamic:
            metrics.update(
                {
                    "dynamic_sampling/dropped_groups": dropped,
                    "dynamic_sampling/refilled_groups": refilled,
                    "dynamic_sampling/unfilled_groups": unfilled,
                    "dynamic_sampling/rounds": len(rounds),
                }
            )
        return rollout, scores, metrics

    def priority_mean(self) -> float:
        return sum(self.buffer.priority) / len(self.buffer.priority)

    def assemble(self, rounds: list, kept: list[tuple[int, int]]):
        """One rollout, its scores and metrics from the kept groups of the rounds."""
        import torch

        if len(rounds) == 1 and kept == [(0, g) for g in range(self.prompts_per_rank)]:
            return rounds[0][0], rounds[0][1], dict(rounds[0][2])
        n = self.n
        parts = [rounds[r][0].select(list(range(g * n, (g + 1) * n))) for r, g in kept]
        scores = torch.cat([rounds[r][1][g * n : (g + 1) * n] for r, g in kept])
        weight = sum(w for *_, w in rounds)
        metrics = {
            key: sum(m[key] for _, _, m, _ in rounds)
            if key.endswith("_time")
            else sum(m[key] * w for _, _, m, w in rounds) / weight
            for key in rounds[0][2]
        }
        return concat_rollouts(parts), scores, metrics


def concat_rollouts(parts: list):
    """The rows of several rollouts as one: prompts left-padded and responses right-padded to the widest."""
    import torch
    import torch.nn.functional as F

    from trainer_lib.rl.rollout import Rollout

    prompt_width = max(p.prompt_ids.shape[1] for p in parts)
    response_width = max(p.response_ids.shape[1] for p in parts)

    def left(t, width):
        return F.pad(t, (width - t.shape[1], 0))

    def right(t, width):
        return F.pad(t, (0, width - t.shape[1]))

    return Rollout(
        torch.cat([left(p.prompt_ids, prompt_width) for p in parts]),
        torch.cat([left(p.prompt_mask, prompt_width) for p in parts]),
        torch.cat([right(p.response_ids, response_width) for p in parts]),
        torch.cat([right(p.response_mask, response_width) for p in parts]),
        [c for p in parts for c in p.completions],
        [f for p in parts for f in p.finished],
        **concat_images(parts),
        prompts=[q for p in parts for q in p.prompts] if all(p.prompts is not None for p in parts) else None,
        reward_table=torch.cat([p.reward_table for p in parts])
        if all(p.reward_table is not None for p in parts)
        else None,
        logprobs=torch.cat([right(p.logprobs, response_width) for p in parts])
        if all(p.logprobs is not None for p in parts)
        else None,
        action_mask=torch.cat([right(p.action_mask, response_width) for p in parts])
        if all(p.action_mask is not None for p in parts)
        else None,
        episodes=[e for p in parts for e in p.episodes] if all(p.episodes is not None for p in parts) else None,
    )


def concat_images(parts: list) -> dict:
    """``{"pixel_values", "image_counts"}`` of several rollouts' rows, in order; empty without images."""
    import torch

    if all(p.pixel_values is None for p in parts):
        return {}
    return {
        "pixel_values": torch.cat([p.pixel_values for p in parts if p.pixel_values is not None]),
        "image_counts": [c for p in parts for c in (p.image_counts or [0] * len(p))],
    }
