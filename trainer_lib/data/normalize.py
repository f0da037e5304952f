"""Rows one at a time: normalized and validated (:class:`Normalizer`), read from a source
(:func:`read_rows`, :func:`eval_rows`), filtered into Arrow files (:class:`RowFilter`: empty and
duplicate rows) and measured against ``data.max_length`` (:func:`length_filter`).

:mod:`trainer_lib.data.dataset` builds whole train/eval splits from these.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from trainer_lib.data import images, llamafactory, public_datasets
from trainer_lib.data.formats import (
    AUTO,
    FORMATS,
    SOURCE_FORMATS,
    canonical_key,
    detect_format,
    is_empty,
    normalize_row,
    row_format,
    row_is_conversational,
)
from trainer_lib.data.sources import Source
from trainer_lib.errors import DataError, UserError

DROP_REASONS = ("empty", "duplicate", "too_long")

Item = tuple[str, dict]  # (location, normalized row)


# --------------------------------------------------------------------------- normalization


def _category(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class Normalizer:
    """Normalizes rows of one dataset (train and eval sources share it), enforcing one format,
    one text kind (plain or conversational) and one type per extra column across rows.

    ``fmt`` is the format of the raw rows (``None``/``auto``: detected from the first row);
    ``self.fmt`` is the normalized format, which differs for the formats converted first
    (alpaca and sharegpt become messages, or what their ``columns`` say: preference for ranked
    pairs, unpaired_preference with a kto_tag, text for an alpaca corpus without responses;
    ``columns`` renames theirs, and implies one of them; hh_rlhf becomes preference, gsm8k and
    mbpp prompt_completion).
    """

    def __init__(
        self,
        fmt: str | None = None,
        allowed_formats: Iterable[str] | None = None,
        stage: str = "this stage",
        conversational: bool | None = None,
        columns: dict[str, str] | None = None,
    ):
        source = None if fmt in (None, AUTO) else fmt
        if columns:
            source = llamafactory.source_format(columns, source or AUTO)
        self.columns = dict(columns or {})
        self.auto = source is None
        self.allowed = tuple(allowed_formats) if allowed_formats else None
        self.stage = stage
        self.first: str | None = None
        self.conversational = conversational
        self.kind_from = "the prepared data"  # where `conversational` was decided
        self.extras: dict[str, tuple[str, str]] = {}
        self.source = self.fmt = self.convert = None
        if source is not None:
            self._set_source(source)

    def _set_source(self, source: str) -> None:
        self.source = source
        self.fmt, self.convert = source, None
        if source in public_datasets.TARGETS:
            self.fmt, self.convert = public_datasets.TARGETS[source], public_datasets.converter(source)
        elif source in SOURCE_FORMATS:
            self.fmt = llamafactory.target_format(source, self.columns, self.allowed)
            self.convert = llamafactory.converter(source, self.columns, self.fmt)
        self._check_allowed()

    def _check_allowed(self) -> None:
        if self.allowed is not None and self.fmt not in self.allowed:
            got = self.fmt if self.source == self.fmt else f"{self.source} (converted to {self.fmt})"
            raise UserError(f"data.path: {self.stage} needs one of {', '.join(self.allowed)}; got {got}")

    def _explain(self, exc: DataError) -> DataError:
        """Say why a string/conversation was expected when an earlier row decided it."""
        pinned = self.conversational
        if (
            pinned is None
            or self.fmt in ("text", "messages")
            or exc.field == "label"
            or exc.field not in FORMATS[self.fmt]
            or not isinstance(exc.got, (str, list))
            or isinstance(exc.got, list) == pinned
        ):
            return exc
        kind = "conversations" if pinned else "plain text"
        return DataError(exc.location, exc.field, f"{exc.expected} (rows are {kind} like {self.kind_from})", exc.got)

    def __call__(self, location: str, row: Any) -> dict:
        if not isinstance(row, dict):
            raise DataError(location, None, "an object with named columns", row)
        if self.source is None:
            detected = detect_format(row, location)
            if detected == "sharegpt" and {"chosen", "rejected"} <= set(row) and not self.columns:
                self.columns = {"chosen": "chosen", "rejected": "rejected"}  # ranked pairs, as ranking: true reads
            self._set_source(detected)
        elif self.auto:
            row_format(row, self.source, location, self.first)
        if self.first is None:
            self.first = location
        if self.convert is not None:
            row = self.convert(row, location)
        try:
            out = normalize_row(row, self.fmt, location, self.conversational)
        except DataError as exc:
            raise self._explain(exc) from None
        if self.conversational is None:
            self.conversational = row_is_conversational(out, self.fmt)
            self.kind_from = location
        fields = FORMATS[self.fmt]
        if images.IMAGES in out:  # checked, read and hashed here; rows without the column are untouched
            out[images.IMAGES] = images.normalize_images(out, fields, location)
        for col, value in out.items():
            if col in fields or value is None:
                continue
            cat = _category(value)
            seen = self.extras.setdefault(col, (cat, location))
            if seen[0] != cat:
                raise DataError(location, col, f"{seen[0]} like {seen[1]} (one type per column)", value)
        return out


class BadRows:
    """The malformed rows dropped with ``data.bad_rows=drop``: how many, and the first few errors."""

    KEEP = 3

    def __init__(self):
        self.count = 0
        self.first: list[str] = []

    def add(self, exc: DataError) -> None:
        self.count += 1
        if len(self.first) < self.KEEP:
            self.first.append(str(exc))


def read_rows(
    source: Source, split: str | None, normalizer: Normalizer, max_rows: int, bad: BadRows | None = None
) -> Iterator[Item]:
    """Normalized ``(location, row)`` of one split, streamed. A malformed row raises its DataError, or
    with ``bad`` is counted there and skipped."""
    rows = source.rows(split)
    if max_rows > 0:
        rows = itertools.islice(rows, max_rows)
    for loc, row in rows:
        try:
            out = normalizer(loc, row)
        except DataError as exc:
            if bad is None:
                raise
            bad.add(exc)
            continue
        yield loc, out


def eval_rows(
    source: Source, normalizer: Normalizer, max_rows: int, bad: BadRows | None = None
) -> tuple[Iterator[Item], str]:
    """Rows of a separate eval source: its eval-like split if it has a non-empty one."""
    split = source.eval_split
    if split is not None:
        rows = read_rows(source, split, normalizer, max_rows, bad)
        first = next(rows, None)
        if first is not None:
            return itertools.chain([first], rows), f"{source.path}[{split}]"
    name = f"{source.path}[{source.train_split}]" if source.splits else source.path
    return read_rows(source, source.train_split, normalizer, max_rows, bad), name


# --------------------------------------------------------------------------- filters


class RowFilter:
    """Streams normalized rows into a :class:`RowWriter` split, dropping empty and duplicate rows
    (duplicates within the split, across every source written to it, by a digest of the format
    fields) and counting them."""

    def __init__(self, writer, drop_empty: bool, drop_duplicates: bool, dropped: dict):
        self.writer = writer
        self.drop_empty, self.drop_duplicates, self.dropped = drop_empty, drop_duplicates, dropped
        self.rows_read = 0
        self.seen: dict[str, set[bytes]] = {}

    def write(self, split: str, items: Iterable[Item], normalizer: Normalizer) -> None:
        from trainer_lib.data.arrow_rows import row_digest

        self.writer.open_split(split)
        seen = self.seen.setdefault(split, set())
        for loc, row in items:
            self.rows_read += 1
            fmt = normalizer.fmt
            if self.drop_empty and is_empty(row, fmt):
                self.dropped["empty"] += 1
                continue
            if self.drop_duplicates:
                key = hashlib.blake2b(canonical_key(row, fmt).encode(), digest_size=16).digest()
                if key in seen:
                    self.dropped["duplicate"] += 1
                    continue
                seen.add(key)
            self.writer.add(split, loc, row, FORMATS[fmt], row_digest(row))
        if not self.writer.columns and normalizer.fmt:  # no rows at all: still the format's columns
            self.writer.columns.update(dict.fromkeys(FORMATS[normalizer.fmt]))


def length_filter(ds, fmt: str, conv: bool, tokenizer, data_cfg, dropped: dict, work_dir: str):
    """``(ds, its rows' token lengths, rows over data.max_length kept)``: rows over ``data.max_length``
    tokens are dropped with ``data.over_length=drop`` and always for prompts (RL), else kept for the
    tokenizer of the stage to truncate."""
    import numpy as np

    from trainer_lib.data.arrow_rows import LOCATION
    from trainer_lib.data.tokenized import length_column

    lengths = np.asarray(
        length_column(ds, fmt, conv, tokenizer, getattr(data_cfg, "num_workers", 1), work_dir, LOCATION), dtype=np.int64
    )
    over = lengths > data_cfg.max_length
    count = int(over.sum())
    if not count:
        return ds, lengths, 0
    if getattr(data_cfg, "over_length", "drop") == "truncate" and fmt != "prompt_only":
        return ds, lengths, count
    dropped["too_long"] += count
    keep = np.flatnonzero(~over)
    return ds.select(keep), lengths[keep], 0
