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
