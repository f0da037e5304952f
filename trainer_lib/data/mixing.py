"""Which rows of several datasets train, and in what order: LLaMA-Factory's ``mix_strategy``.

Pure Python. The datasets' rows sit one after the other (dataset 0's rows, then dataset 1's, ...);
:func:`mix_indices` returns the row indices of the mixture, following the rules of
``datasets.interleave_datasets``, which LLaMA-Factory calls:

* ``concat``: every row of every dataset, in order.
* ``interleave_under`` (``stopping_strategy="first_exhausted"``): rounds of one row of each
  dataset, as many as the smallest dataset has rows; or, with ``probs``, a dataset drawn at random
  for each row until one of them has given its last row.
* ``interleave_over`` (``"all_exhausted"``): as many rounds as the largest dataset has rows, smaller
  ones starting over; or, with ``probs``, draws until every dataset has given all its rows at least
  once, a dataset that ran out starting over (oversampled).

The draws come from Python's ``random.Random(seed)``, so the order differs from ``datasets``' own
(numpy) draws while the rule and the expected shares are the same. A dataset with probability 0 or
no rows is never drawn and does not hold the mixture back.
"""

from __future__ import annotations

import random


def mix_indices(counts: list[int], strategy: str, probs: list[float] | None = None, seed: int = 0) -> list[int]:
    """Indices into the concatenated rows of datasets with ``counts`` rows each."""
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    if strategy == "concat":
        return list(range(sum(counts)))
    if strategy not in ("interleave_under", "interleave_over"):
        raise ValueError(f"mix strategy: expected concat, interleave_under or interleave_over, got {strategy!r}")
    weights = list(probs) if probs else [1.0] * len(counts)
    live = [i for i, n in enumerate(counts) if n > 0 and weights[i] > 0]
    if not live:
        return []
    if not probs:  # whole rounds, one row of each dataset per round
        rounds = (min if strategy == "interleave_under" else max)(counts[i] for i in live)
        return [offsets[i] + r % counts[i] for r in range(rounds) for i in live]
    rng = random.Random(seed)
    position = dict.fromkeys(live, 0)
    exhausted: set[int] = set()
    out: list[int] = []
    while True:
        source = rng.choices(live, weights=[weights[i] for i in live])[0]
        out.append(offsets[source] + position[source])
        position[source] += 1
        if position[source] == counts[source]:
            exhausted.add(source)
            position[source] = 0
            if strategy == "interleave_under" or len(exhausted) == len(live):
                return out
