"""Combine reward sources into one scalar per completion: weights, normalization, clipping.

    r = sum_i w_i * r_i            (sources returning None for a completion are left out)
    r = (r - mean) / std           normalize: "batch" (this step's rewards) or "running"
                                   (all rewards so far, Welford-merged), or "none"
    r = clip(r, -c, c)             clip > 0

Statistics are reduced across ranks through ``reduce`` (sums of a dict), so every rank
normalizes with the same numbers; the running moments are part of the resumable state.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from trainer_lib.errors import UserError
from trainer_lib.rewards.functions import TrainerState, check_rewards, takes_keyword

NORMALIZE = ("none", "batch", "running")


class RunningMoments:
    """Mean and variance of every value seen so far (Chan et al. parallel merge)."""

    def __init__(self):
        self.count, self.mean, self.m2 = 0.0, 0.0, 0.0

    def update(self, count: float, total: float, total_sq: float) -> None:
        if count <= 0:
            return
        batch_mean = total / count
        batch_m2 = max(total_sq - count * batch_mean**2, 0.0)
        delta = batch_mean - self.mean
        merged = self.count + count
        self.mean += delta * count / merged
        self.m2 += batch_m2 + delta**2 * self.count * count / merged
        self.count = merged

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 1.0

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean, self.m2 = float(state["count"]), float(state["mean"]), float(state["m2"])


def _label(name: str, fn: Callable, taken: set) -> str:
    """Metric name of a source: the built-in's name or the function's ``__name__`` (as TRL logs)."""
    base = name if ":" not in name else getattr(fn, "__name__", name.rsplit(":", 1)[-1])
    label, i = base, 2
    while label in taken:
        label, i = f"{base}_{i}", i + 1
    taken.add(label)
    return label


class RewardCombiner:
    """Calls every source, validates what it returns, and combines the results.

    ``sources`` is a list of ``(name, fn)``; ``weights`` one per source (empty: all 1.0). A training
    loop sets ``trainer_state`` at each step; sources that take a ``trainer_state`` keyword get it.
    """

    def __init__(
        self,
        sources: list[tuple[str, Callable]],
        weights: list[float] | None = None,
        clip: float = 0.0,
        normalize: str = "none",
        reduce: Callable[[dict], dict] | None = None,
        eps: float = 1e-8,
    ):
        if not sources:
            raise UserError("reward.functions: no reward source; name at least one function or set reward.model_path")
        weights = list(weights or [1.0] * len(sources))
        if len(weights) != len(sources):
            names = ", ".join(name for name, _ in sources)
            raise UserError(f"reward.weights: {len(weights)} weights for {len(sources)} reward sources ({names})")
        if normalize not in NORMALIZE:
            raise UserError(f"reward.normalize: expected one of {list(NORMALIZE)}, got {normalize!r}")
        taken: set = set()
        self.sources = [(name, fn, _label(name, fn, taken)) for name, fn in sources]
        self.weights = weights
        self.clip, self.normalize, self.eps = clip, normalize, eps
        self.reduce = reduce or (lambda sums: sums)
        self.moments = RunningMoments()
        self.trainer_state: TrainerState | None = None
        self._takes_state = [takes_keyword(fn, "trainer_state") for _, fn, _ in self.sources]

    def table(
        self, prompts: list, completions: list, columns: dict[str, list], completion_ids: list[list[int]]
    ) -> torch.Tensor:
        """Per-source rewards ``(N, S)``, NaN where a source returned None (no collective call)."""
        table = torch.full((len(completions), len(self.sources)), float("nan"), dtype=torch.float64)
        for j, (name, fn, _) in enumerate(self.sources):
            state = {"trainer_state": self.trainer_state} if self._takes_state[j] and self.trainer_state else {}
            values = check_rewards(
                name, fn(prompts, completions, completion_ids=completion_ids, **columns, **state), len(completions)
            )
            table[:, j] = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)
        return table

    def source_sums(self, table: torch.Tensor | None = None) -> dict[str, float]:
        """``rewards/<source>`` sums and ``.count``s of a table (zeros without one), to reduce over ranks;
        with a table, also the counts a source reports since it last did (``step_counts()``, named in its
        ``count_names``: the LLM judge's ``judge/failures`` and so on)."""
        sums = {}
        for j, (_, fn, label) in enumerate(self.sources):
            column = table[:, j] if table is not None else torch.zeros(0, dtype=torch.float64)
            present = column[~torch.isnan(column)]
            sums[f"rewards/{label}"] = float(present.sum())
            sums[f"rewards/{label}.count"] = float(present.numel())
            names = getattr(fn, "count_names", ())
            counts = fn.step_counts() if names and table is not None else {}
            sums.update({name: float(counts.get(name, 0.0)) for name in names})
        return sums

    def source_means(self, sums: dict) -> dict[str, float]:
        """Each source's mean reward from (reduced) :meth:`source_sums` totals; a source that applied to
        none of the completions (``None`` for all, e.g. ``refusal`` on code prompts) is left out, not 0.
        A source's counts are passed on as totals."""
        keys = [f"rewards/{label}" for _, _, label in self.sources]
        means = {key: sums[key] / sums[f"{key}.count"] for key in keys if sums[f"{key}.count"] > 0}
        for _, fn, _ in self.sources:
            means.update({name: sums[name] for name in getattr(fn, "count_names", ()) if name in sums})
        return means

    def score(
        self, prompts: list, completions: list, columns: dict[str, list], completion_ids: list[list[int]]
    ) -> tuple[torch.Tensor, dict]:
        """Per-source rewards ``(N, S)`` and each source's mean, reduced over ranks."""
        table = self.table(prompts, completions, columns, completion_ids)
        return table, self.source_means(self.reduce(self.source_sums(table)))

    def weighted(self, table: torch.Tensor, completion_level: bool = False) -> torch.Tensor:
        """``sum_i w_i r_i`` per completion, sources that returned None left out; ``(N,)`` float64.
        ``completion_level``: without the token-level sources (:meth:`token_level`), whose scores a loop
        places on tokens instead."""
        weights = [
            0.0 if completion_level and getattr(fn, "token_level", False) else weight
            for weight, (_, fn, _) in zip(self.weights, self.sources)
        ]
        return torch.nansum(table * torch.tensor(weights, dtype=torch.float64), dim=1)

    def token_level(self) -> list[tuple[float, object]]:
        """``(weight, source)`` of the sources whose scores go on tokens (``source.token_level``: the PRM's
        ``steps``), read by PPO (:func:`trainer_lib.rl.experience.step_token_rewards`)."""
        return [(w, fn) for w, (_, fn, _) in zip(self.weights, self.sources) if getattr(fn, "token_level", False)]

    def combine(self, table: torch.Tensor) -> torch.Tensor:
        """Weighted sum of the completion-level sources, normalized and clipped, ``(N,)`` float32."""
        rewards = self.weighted(table, completion_level=True)
        if self.normalize != "none":
            sums = self.reduce(
                {"count": float(rewards.numel()), "total": float(rewards.sum()), "total_sq": float((rewards**2).sum())}
            )
            if self.normalize == "running":
                self.moments.update(sums["count"], sums["total"], sums["total_sq"])
                mean, std = self.moments.mean, self.moments.std
            else:
                batch = RunningMoments()
                batch.update(sums["count"], sums["total"], sums["total_sq"])
                mean, std = batch.mean, batch.std
            rewards = (rewards - mean) / (std + self.eps)
        if self.clip > 0:
            rewards = rewards.clamp(-self.clip, self.clip)
        return rewards.float()

    def __call__(
        self, prompts: list, completions: list, columns: dict[str, list], completion_ids: list[list[int]]
    ) -> tuple[torch.Tensor, dict]:
        """``(rewards (N,), metrics)``; metrics hold each source's mean raw reward."""
        table, means = self.score(prompts, completions, columns, completion_ids)
        return self.combine(table), means

    def close(self) -> None:
        """Release what sources hold (the sandbox's worker pool)."""
        for _, fn, _ in self.sources:
            if hasattr(fn, "close"):
                fn.close()

    def state_dict(self) -> dict:
        return {"moments": self.moments.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.moments.load_state_dict(state["moments"])
