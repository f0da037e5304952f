"""Which training rows are held out for eval, when the data has no eval split (``data.eval_by``).

``shuffle`` (the default) takes ``data.eval_fraction`` of the rows by a seeded shuffle
(:func:`trainer_lib.data.dataset.split_indices`). The other two choose rows by what they are, so the
same rows are held out on every machine, whatever the seed and the order of the rows:

``hash``      a row is held out when the sha256 of its normalized value (JSON, keys sorted, the digest
              :mod:`trainer_lib.data.arrow_rows` keeps), read as a fraction of 2**64 from its first 8
              bytes, is below ``data.eval_fraction``. A later run that reads the same rows, or more of
              them, holds out the same ones and evaluates on rows it never trained on.
``COL:RANGES`` a row is held out when its integer column ``COL`` is in one of the ranges:
              ``task_id:511-600`` (MBPP's validation tasks), ``task_id:1-10,511-600``, ``id:7``.
"""

from __future__ import annotations

import re

from trainer_lib.errors import DataError, UserError

SHUFFLE, HASH = "shuffle", "hash"

_RANGES = re.compile(r"^(\w+):(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)$")


def parse_eval_by(value: str) -> tuple[str, str, list[tuple[int, int]]]:
    """``(kind, column, ranges)``: kind ``shuffle``, ``hash`` or ``column`` (then the column and its
    inclusive ranges). ``ValueError`` with the reason otherwise."""
    if value in (SHUFFLE, HASH):
        return value, "", []
    match = _RANGES.match(value.replace(" ", ""))
    if match is None:
        raise ValueError(f"expected shuffle, hash or COLUMN:RANGES (e.g. task_id:511-600), got {value!r}")
    ranges = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        ranges.append((int(low), int(high or low)))
        if ranges[-1][0] > ranges[-1][1]:
            raise ValueError(f"range {part} of {value!r} ends before it starts")
    return "column", match.group(1), ranges


def hash_indices(digests, eval_fraction: float) -> tuple[list[int], list[int]]:
    """``(train, eval)`` indices: eval where the digest's first 8 bytes, as a fraction of 2**64, are
    below ``eval_fraction``."""
    bound = eval_fraction * 2**64
    held = [int.from_bytes(bytes(d[:8]), "big") < bound for d in digests]
    return [i for i, h in enumerate(held) if not h], [i for i, h in enumerate(held) if h]


def column_indices(values, locations, column: str, ranges, setting: str) -> tuple[list[int], list[int]]:
    """``(train, eval)`` indices: eval where the row's integer ``column`` is in one of ``ranges``. A
    row whose value is not an integer is a :class:`DataError` naming its location."""
    train, held = [], []
    for i, (value, location) in enumerate(zip(values, locations)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DataError(location, column, f"an integer ({setting} holds rows out by it)", value)
        (held if any(low <= value <= high for low, high in ranges) else train).append(i)
    if not held:
        raise UserError(f"{setting}: no row has {column} in its ranges; nothing would be held out")
    return train, held


def holdout_indices(ds, eval_by: str, eval_fraction: float, display: str) -> tuple[list[int], list[int]]:
    """``(train, eval)`` indices of the normalized rows ``ds`` (with arrow_rows' location and digest
    columns) by ``hash`` or ``COLUMN:RANGES``; ``display`` names the data in errors."""
    from trainer_lib.data.arrow_rows import DIGEST, LOCATION

    kind, column, ranges = parse_eval_by(eval_by)
    setting = f"data.eval_by={eval_by}"
    if kind == HASH:
        return hash_indices(ds[DIGEST], eval_fraction)
    if column not in ds.column_names:
        names = ", ".join(c for c in ds.column_names if c not in (DIGEST, LOCATION))
        raise UserError(f"{setting}: the rows of {display} have no column {column!r} (they have {names})")
    return column_indices(ds[column], ds[LOCATION], column, ranges, setting)
