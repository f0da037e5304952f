"""Metrics to ``metrics.jsonl`` and TensorBoard, plus a progress bar; rank 0 only.

``metrics.jsonl`` holds one JSON object per logging event (``{"step": 10, "split": "train",
"loss": ...}``); the evaluation report and the KFP components read it back.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any


class Tracker:
    def __init__(self, log_dir: str, enabled: bool = True, total_steps: int = 0, initial_step: int = 0,
                 desc: str = "train"):
        self.enabled = enabled
        self.log_dir = log_dir
        self._writer = None
        self._bar = None
        self._start = time.time()
        if not enabled:
            return
        os.makedirs(log_dir, exist_ok=True)
        _truncate_after(os.path.join(log_dir, "metrics.jsonl"), initial_step)
        self._file = open(os.path.join(log_dir, "metrics.jsonl"), "a", encoding="utf-8")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(os.path.join(log_dir, "tensorboard"))
        except ImportError:  # tensorboard is optional at run time
            self._writer = None
        if total_steps:
            from tqdm.auto import tqdm

            import sys

            # In pod logs (no terminal) a bar redraw is a new line: redraw rarely there.
            self._bar = tqdm(total=total_steps, initial=initial_step, desc=desc, dynamic_ncols=True,
                             mininterval=0.1 if sys.stderr.isatty() else 30.0,
                             disable=os.environ.get("POSTTRAIN_NO_PROGRESS") == "1")

    def log(self, step: int, metrics: dict[str, Any], split: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: _plain(v) for k, v in metrics.items()}
        record = {"step": step, "split": split, "time": round(time.time() - self._start, 3), **clean}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"{split}/{key}", value, step)
        if self._bar is not None and split == "train":
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in clean.items()
                                   if isinstance(v, float) and k in ("loss", "reward", "lr", "kl")},
                                  refresh=False)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.close()
        self._file.close()


def _truncate_after(path: str, step: int) -> None:
    """A resumed run replays the steps after its checkpoint: drop their earlier records."""
    if not os.path.exists(path):
        return
    kept = [r for r in read_metrics(path) if step > 0 and r.get("step", 0) <= step]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def read_metrics(path: str) -> list[dict]:
    """Records of a ``metrics.jsonl`` file (or of ``<dir>/metrics.jsonl``)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class MetricsWindow:
    """Values summed between two log events, with the same throughput keys in every stage.

    ``add(key, values)`` takes a float (one value) or a tensor of per-example values;
    ``count(samples, tokens)`` records the work done. :meth:`reduce` returns the mean of every
    key across ranks plus ``samples_per_s`` and ``tokens_per_s`` (all ranks together, over the
    wall time since the window opened) and opens the next window. Every rank must hold the same
    keys when reducing: declare in ``keys`` those that a rank may see no value of.
    """

    def __init__(self, keys: tuple[str, ...] = ()):
        self.keys = tuple(keys)
        self._reset()

    def _reset(self) -> None:
        self.sums = {f"{k}{s}": 0.0 for k in self.keys for s in ("", "#n")}
        self.samples = self.tokens = 0.0
        self.start = time.time()

    def add(self, key: str, values) -> None:
        self.add_all({key: values})

    def add_all(self, values: dict) -> None:
        for key, value in sums_and_counts(values).items():
            self.sums[key] = self.sums.get(key, 0.0) + value

    def count(self, samples: int | float, tokens: int | float) -> None:
        self.samples += float(samples)
        self.tokens += float(tokens)

    def reduce(self, strategy) -> dict:
        elapsed = max(time.time() - self.start, 1e-9)
        sums = strategy.all_reduce({**self.sums, "#samples": self.samples, "#tokens": self.tokens}, op="sum")
        means = means_of(sums, [k for k in sums if not k.startswith("#") and not k.endswith("#n")])
        self._reset()
        return {**means, "samples_per_s": sums["#samples"] / elapsed, "tokens_per_s": sums["#tokens"] / elapsed}


def sums_and_counts(values: dict) -> dict:
    """``{key: sum, key#n: count}`` of floats (one value each) or tensors of per-example values."""
    out = {}
    for key, value in values.items():
        if hasattr(value, "detach"):
            value = value.detach().float().reshape(-1)
            out[key], out[f"{key}#n"] = float(value.sum()), float(value.numel())
        else:
            out[key], out[f"{key}#n"] = float(value), 1.0
    return out


def means_of(sums: dict, keys) -> dict:
    """Means from :func:`sums_and_counts` totals, for the keys that saw at least one value."""
    return {k: sums[k] / sums[f"{k}#n"] for k in keys if sums.get(f"{k}#n")}
