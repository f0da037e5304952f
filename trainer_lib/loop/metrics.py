"""Metric sums between two log events, kept on the device until a record is logged.

A training loop adds its metrics every micro-batch. Turning each into a Python float there would
make the host wait for the accelerator once per metric per micro-batch; here a tensor's sum stays
a tensor on its device, and the window reads the device once per log record
(:meth:`MetricsWindow.reduce`, one all-reduce of every sum and count) and once per step for the
NaN/inf check (:meth:`MetricsWindow.nonfinite`, one flag for all losses).

The arithmetic is the one the logged numbers always had: the values of one tensor are summed in
float32, those per-call sums are accumulated in float64 (as Python floats were, in the same
order), and the ranks add their float64 totals.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class MetricSum:
    """The running sum and count of one metric.

    ``total`` is a float until the first tensor arrives, then a 0-dim float64 tensor on that
    tensor's device; ``count`` (how many values) is always a float, known on the host.
    """

    total: Any = 0.0
    count: float = 0.0

    def add(self, value) -> None:
        """One value (a float) or a tensor of per-example values."""
        if hasattr(value, "detach"):
            values = value.detach().float().reshape(-1)
            # the float32 sum, widened exactly to float64: what float(values.sum()) gave, without the read
            self.total = self.total + values.sum().double()
            self.count += float(values.numel())
        else:
            self.total = self.total + float(value)
            self.count += 1.0

    @property
    def on_host(self) -> bool:
        return isinstance(self.total, float)


class MetricsWindow:
    """Values summed between two log events, with the same throughput keys in every stage (``samples_per_s``,
    ``tokens_per_s``, and ``tokens``: the tokens of the window, all ranks, whose running sum is the
    tokens seen).

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
        self.sums: dict[str, MetricSum] = {k: MetricSum() for k in self.keys}
        self.samples = self.tokens = 0.0
        self.start = time.time()

    def add(self, key: str, values) -> None:
        if key not in self.sums:
            self.sums[key] = MetricSum()
        self.sums[key].add(values)

    def add_all(self, values: dict) -> None:
        for key, value in values.items():
            self.add(key, value)

    def count(self, samples: int | float, tokens: int | float) -> None:
        self.samples += float(samples)
        self.tokens += float(tokens)

    def nonfinite(self, keys) -> Any:
        """Nonzero when the sum of one of ``keys`` is NaN or inf, else zero: a float when every one
        of them is a float, else a 0-dim tensor on their device (not read back here), so that a
        caller can all-reduce it and read it once."""
        entries = [self.sums[k] for k in keys]
        flag = 0.0 if all(math.isfinite(e.total) for e in entries if e.on_host) else 1.0
        tensors = [e.total for e in entries if not e.on_host]
        if not tensors:
            return flag
        import torch

        # (a key fed from the CPU as well as the accelerator: gather on the accelerator, no read)
        device = next((t.device for t in tensors if t.device.type != "cpu"), tensors[0].device)
        return (~torch.isfinite(torch.stack([t.to(device) for t in tensors]))).any().double() + flag

    def totals(self, keys) -> dict[str, float]:
        """The sums of ``keys`` as floats (a read from the device each: for error messages)."""
        return {k: float(self.sums[k].total) for k in keys}

    def reduce(self, strategy) -> dict:
        """The window's means and throughput across ranks (one all-reduce, one read from the
        device), and the next window opened."""
        elapsed = max(time.time() - self.start, 1e-9)
        flat: dict[str, Any] = {"#samples": self.samples, "#tokens": self.tokens}
        for key, entry in self.sums.items():
            flat[key], flat[f"{key}#n"] = entry.total, entry.count
        sums = strategy.all_reduce(flat, op="sum")
        means = means_of(sums, [k for k in sums if not k.startswith("#") and not k.endswith("#n")])
        self._reset()
        # the ranks of a tensor group, a pipeline or a sequence group count the same rows: once per replica
        parallel = getattr(strategy, "parallel", None)
        shared = parallel.replica_ranks if parallel is not None else 1
        samples, tokens = sums["#samples"] / shared, sums["#tokens"] / shared
        return {**means, "samples_per_s": samples / elapsed, "tokens_per_s": tokens / elapsed, "tokens": tokens}


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
