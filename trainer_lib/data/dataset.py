"""Build train/eval splits from any source: normalize + validate, filter, split.

One code path for ``posttrain prepare`` (:func:`build_dataset`, which also returns the stats)
and for the training stages (:func:`load_training_data`, which accepts either a prepared dir
or a raw source). ``datasets``/``pyarrow``/tokenizers are imported inside functions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import random
from collections.abc import Iterable
from typing import Any

from trainer_lib.data import llamafactory
from trainer_lib.data.formats import (AUTO, FORMATS, SOURCE_FORMATS, canonical_key, detect_format, is_empty,
                                      normalize_row, row_format, row_is_conversational)
from trainer_lib.data.sources import STATS_FILE, Source, is_prepared_dir, load_saved, open_source
from trainer_lib.errors import DataError, UserError

log = logging.getLogger(__name__)

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
    (alpaca and sharegpt become messages; ``columns`` renames theirs, and implies one of them).
    """

    def __init__(self, fmt: str | None = None, allowed_formats: Iterable[str] | None = None,
                 stage: str = "this stage", conversational: bool | None = None,
                 columns: dict[str, str] | None = None):
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
        self.fmt = SOURCE_FORMATS.get(source, source)
        self.convert = llamafactory.converter(source, self.columns) if source in SOURCE_FORMATS else None
        self._check_allowed()

    def _check_allowed(self) -> None:
        if self.allowed is not None and self.fmt not in self.allowed:
            got = self.fmt if self.source == self.fmt else f"{self.source} (converted to {self.fmt})"
            raise UserError(f"data.path: {self.stage} needs one of {', '.join(self.allowed)}; got {got}")

    def _explain(self, exc: DataError) -> DataError:
        """Say why a string/conversation was expected when an earlier row decided it."""
        pinned = self.conversational
        if (pinned is None or self.fmt in ("text", "messages") or exc.field == "label"
                or exc.field not in FORMATS[self.fmt]
                or not isinstance(exc.got, (str, list)) or isinstance(exc.got, list) == pinned):
            return exc
        kind = "conversations" if pinned else "plain text"
        return DataError(exc.location, exc.field,
                         f"{exc.expected} (rows are {kind} like {self.kind_from})", exc.got)

    def __call__(self, location: str, row: Any) -> dict:
        if not isinstance(row, dict):
            raise DataError(location, None, "an object with named columns", row)
        if self.source is None:
            self._set_source(detect_format(row, location))
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
        for col, value in out.items():
            if col in fields or value is None:
                continue
            cat = _category(value)
            seen = self.extras.setdefault(col, (cat, location))
            if seen[0] != cat:
                raise DataError(location, col, f"{seen[0]} like {seen[1]} (one type per column)", value)
        return out


def _read(source: Source, split: str | None, normalizer: Normalizer, max_rows: int) -> list[Item]:
    rows = source.rows(split)
    if max_rows > 0:
        rows = itertools.islice(rows, max_rows)
    return [(loc, normalizer(loc, row)) for loc, row in rows]


# --------------------------------------------------------------------------- filters


def _filter(items: list[Item], fmt: str, drop_empty: bool, drop_duplicates: bool,
            dropped: dict) -> list[Item]:
    seen: set[str] = set()
    out = []
    for loc, row in items:
        if drop_empty and is_empty(row, fmt):
            dropped["empty"] += 1
            continue
        if drop_duplicates:
            key = canonical_key(row, fmt)
            if key in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(key)
        out.append((loc, row))
    return out


def _chat(tokenizer, messages: list[dict], location: str, generation_prompt: bool = False):
    """(text, add_special_tokens) for a conversation rendered with the chat template."""
    if getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
        except Exception as exc:  # noqa: BLE001 - jinja errors raised by templates
            raise DataError(location, None, f"a conversation the tokenizer's chat template "
                                            f"accepts ({exc})") from None
        return text, False
    # No chat template: count a simple role-tagged rendering.
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return text, True


def _sequences(row: dict, fmt: str, conv: bool, tokenizer, location: str) -> list[tuple[str, bool]]:
    """The texts a model sees for a row (preference: one per response)."""
    if fmt == "text":
        return [(row["text"], True)]
    if fmt == "messages":
        return [_chat(tokenizer, row["messages"], location)]
    if fmt == "prompt_only":
        if conv:
            return [_chat(tokenizer, row["prompt"], location, generation_prompt=True)]
        return [(row["prompt"], True)]
    answers = ("chosen", "rejected") if fmt == "preference" else ("completion",)
    if conv:
        return [_chat(tokenizer, row["prompt"] + row[a], location) for a in answers]
    return [(row["prompt"] + row[a], True) for a in answers]


def token_lengths(items: list[Item], fmt: str, conversational: bool, tokenizer,
                  batch_size: int = 512) -> list[int]:
    """Token count per row (the longest sequence of the row), chat template applied."""
    texts: list[tuple[int, str, bool]] = []
    for i, (loc, row) in enumerate(items):
        texts.extend((i, t, special) for t, special in _sequences(row, fmt, conversational, tokenizer, loc))
    lengths = [0] * len(items)
    for special in (True, False):
        group = [(i, t) for i, t, s in texts if s == special]
        for start in range(0, len(group), batch_size):
            chunk = group[start:start + batch_size]
            ids = tokenizer([t for _, t in chunk], add_special_tokens=special)["input_ids"]
            for (i, _), seq in zip(chunk, ids):
                lengths[i] = max(lengths[i], len(seq))
    return lengths


def _length_filter(items: list[Item], fmt: str, conv: bool, tokenizer, max_length: int,
                   dropped: dict, kept_lengths: list[int]) -> list[Item]:
    out = []
    for item, n in zip(items, token_lengths(items, fmt, conv, tokenizer)):
        if n > max_length:
            dropped["too_long"] += 1
        else:
            out.append(item)
            kept_lengths.append(n)
    return out


# --------------------------------------------------------------------------- split / arrow


def split_indices(n: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic (train, eval) index lists, each in original order.

    At least one eval row when ``eval_fraction > 0`` and ``n >= 2``; at least one train row.
    """
    if eval_fraction <= 0 or n < 2:
        return list(range(n)), []
    n_eval = min(n - 1, max(1, round(n * eval_fraction)))
    order = list(range(n))
    random.Random(seed).shuffle(order)
    eval_idx = sorted(order[:n_eval])
    chosen = set(eval_idx)
    return [i for i in range(n) if i not in chosen], eval_idx


def _to_dataset_dict(splits: dict[str, list[dict]], fmt: str, source: str):
    """One Arrow schema for all splits (columns: format fields, then extras in first-seen order)."""
    import datasets
    import pyarrow as pa

    columns: dict[str, None] = dict.fromkeys(FORMATS[fmt])
    for rows in splits.values():
        for row in rows:
            columns.update(dict.fromkeys(row))
    all_rows = [row for rows in splits.values() for row in rows]
    arrays = {}
    for col in columns:
        try:
            arrays[col] = pa.array([row.get(col) for row in all_rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                ValueError, OverflowError) as exc:
            raise UserError(f"{source}: column '{col}': values do not share one type "
                            f"across rows ({exc})") from None
    table = pa.table(arrays) if arrays else pa.table({})
    out, start = {}, 0
    for name, rows in splits.items():
        out[name] = datasets.Dataset(table.slice(start, len(rows)))
        start += len(rows)
    return datasets.DatasetDict(out)


def save_dataset_dict(dd, directory: str) -> None:
    """``dd.save_to_disk(directory)`` that also works for empty splits.

    ``datasets`` writes no Arrow file for a split with 0 rows and then cannot load it back
    (IndexError in ``concat_tables``); give such splits an empty Arrow stream with the schema.
    """
    import os

    import pyarrow as pa

    dd.save_to_disk(directory)
    for name, ds in dd.items():
        split_dir = os.path.join(directory, name)
        state_file = os.path.join(split_dir, "state.json")
        with open(state_file, encoding="utf-8") as fh:
            state = json.load(fh)
        if state.get("_data_files"):
            continue
        filename = "data-00000-of-00001.arrow"
        with pa.OSFile(os.path.join(split_dir, filename), "wb") as sink:
            with pa.ipc.new_stream(sink, ds.features.arrow_schema):
                pass
        state["_data_files"] = [{"filename": filename}]
        with open(state_file, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=2, sort_keys=True)


def fingerprint(fmt: str, splits: dict[str, list[dict]]) -> str:
    """sha256 of the format and every row of every split (in order)."""
    h = hashlib.sha256(fmt.encode())
    for name, rows in splits.items():
        h.update(f"\0split:{name}\0".encode())
        for row in rows:
            h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
            h.update(b"\n")
    return h.hexdigest()


# --------------------------------------------------------------------------- build


def _eval_rows(source: Source, normalizer: Normalizer, max_rows: int) -> tuple[list[Item], str]:
    """Rows of a separate eval source: its eval-like split if it has a non-empty one."""
    split = source.eval_split
    if split is not None:
        items = _read(source, split, normalizer, max_rows)
        if items:
            return items, f"{source.path}[{split}]"
    items = _read(source, source.train_split, normalizer, max_rows)
    name = f"{source.path}[{source.train_split}]" if source.splits else source.path
    return items, name


def build_dataset(data_cfg, seed: int, *, tokenizer=None, drop_empty: bool = True,
                  drop_duplicates: bool = True, max_rows: int = 0,
                  allowed_formats: Iterable[str] | None = None,
                  stage: str = "this stage") -> tuple[Any, dict]:
    """Normalize, validate, filter and split ``data_cfg.path`` -> ``(DatasetDict, stats)``.

    Eval rows come from ``data_cfg.eval_path`` if set, else from an eval/validation/test split
    of the source, else are split off by ``data_cfg.eval_fraction`` with ``seed``.
    Over-length rows (``> data_cfg.max_length`` tokens) are dropped only with a ``tokenizer``.
    ``max_rows`` (> 0) caps the rows read from each source. Raises :class:`DataError` for a
    malformed row, :class:`UserError` for other problems with the data.
    """
    if not data_cfg.path:
        raise UserError("data.path: required, expected a dataset path")
    subset, split, eval_split, revision = (getattr(data_cfg, k, "") for k in ("subset", "split", "eval_split",
                                                                              "revision"))
    source = open_source(data_cfg.path, "data.path", subset, revision).check_splits(split, eval_split)
    fmt = data_cfg.format
    if fmt == AUTO and source.prepared:
        fmt = source.prepared.get("format", AUTO)  # keep what prepare decided (maybe forced)
    normalizer = Normalizer(fmt, allowed_formats, stage, columns=None if source.prepared else getattr(data_cfg, "columns", None))
    train = _read(source, source.train_split, normalizer, max_rows)
    rows_read = len(train)
    if not train:
        raise UserError(f"data.path: {data_cfg.path}: no rows")
    eval_items: list[Item] | None = None
    eval_source = None
    if data_cfg.eval_path:
        esrc = open_source(data_cfg.eval_path, "data.eval_path")
        eval_items, eval_source = _eval_rows(esrc, normalizer, max_rows)
        rows_read += len(eval_items)
    elif source.eval_split is not None:
        eval_items = _read(source, source.eval_split, normalizer, max_rows)
        eval_source = f"{source.path}[{source.eval_split}]"
        rows_read += len(eval_items)
    fmt, conv = normalizer.fmt, bool(normalizer.conversational)

    dropped = dict.fromkeys(DROP_REASONS, 0)
    train = _filter(train, fmt, drop_empty, drop_duplicates, dropped)
    if eval_items is not None:
        eval_items = _filter(eval_items, fmt, drop_empty, drop_duplicates, dropped)
    lengths: list[int] = []
    if tokenizer is not None:
        train = _length_filter(train, fmt, conv, tokenizer, data_cfg.max_length, dropped, lengths)
        if eval_items is not None:
            eval_items = _length_filter(eval_items, fmt, conv, tokenizer, data_cfg.max_length,
                                        dropped, lengths)
    if not train:
        reasons = ", ".join(f"{k}: {v}" for k, v in dropped.items())
        raise UserError(f"data.path: {data_cfg.path}: no training rows left after filtering "
                        f"({reasons})")
    if eval_items is None:
        train_idx, eval_idx = split_indices(len(train), data_cfg.eval_fraction, seed)
        splits = {"train": [train[i][1] for i in train_idx], "eval": [train[i][1] for i in eval_idx]}
    else:
        splits = {"train": [r for _, r in train], "eval": [r for _, r in eval_items]}
    dd = _to_dataset_dict(splits, fmt, data_cfg.path)
    stats = {
        "format": fmt,
        "source_format": normalizer.source,
        "conversational": conv,
        "source": data_cfg.path,
        "eval_source": eval_source,
        "columns": list(dd["train"].column_names),
        "rows_read": rows_read,
        "rows": {name: len(rows) for name, rows in splits.items()},
        "dropped": dropped,
        "token_lengths": None,
        "max_length": data_cfg.max_length if tokenizer is not None else None,
        "seed": seed,
        "eval_fraction": data_cfg.eval_fraction if eval_items is None else None,
        "fingerprint": fingerprint(fmt, splits),
    }
    if lengths:
        stats["token_lengths"] = {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 2),
                                  "max": max(lengths)}
    log.info("data: %s rows read, kept train=%d eval=%d, dropped %s", rows_read,
             stats["rows"]["train"], stats["rows"]["eval"], dropped)
    return dd, stats


# --------------------------------------------------------------------------- training stages


def read_prepared_stats(path: str) -> dict:
    from trainer_lib import storage

    try:
        return json.loads(storage.read_text(storage.join(path, STATS_FILE)))
    except ValueError as exc:
        raise UserError(f"data.path: {path}/{STATS_FILE}: not valid JSON ({exc})") from None


def load_training_data(data_cfg, seed: int, allowed_formats: tuple[str, ...] | None = None,
                       tokenizer=None, stage: str = "this stage") -> tuple[Any, str]:
    """``(DatasetDict with train/eval, format)`` for a training stage.

    ``data_cfg.path`` is a prepared dir (loaded as is; ``data.eval_path``, if set, replaces
    its eval split) or any raw source ``prepare`` accepts (normalized on the fly by
    :func:`build_dataset`; with a ``tokenizer`` over-length rows are dropped there too).
    ``stage`` names the caller in the ``allowed_formats`` error, e.g. ``"SFT"``.
    """
    if not data_cfg.path:
        raise UserError("data.path: required, expected a dataset path")
    if not is_prepared_dir(data_cfg.path):
        dd, stats = build_dataset(data_cfg, seed, tokenizer=tokenizer,
                                  allowed_formats=allowed_formats, stage=stage)
        return dd, stats["format"]

    import datasets

    from trainer_lib import storage

    stats = read_prepared_stats(data_cfg.path)
    fmt = stats.get("format")
    if fmt not in FORMATS:
        raise UserError(f"data.path: {data_cfg.path}/{STATS_FILE}: unknown format {fmt!r}")
    source_format = stats.get("source_format") or fmt
    if data_cfg.format not in (AUTO, fmt, source_format):
        raise UserError(f"data.format: {data_cfg.format}, but {data_cfg.path} was prepared "
                        f"as {source_format}")
    normalizer = Normalizer(source_format, allowed_formats, stage, stats.get("conversational"),
                            columns=getattr(data_cfg, "columns", None))
    dd = load_saved(storage.localize(data_cfg.path), data_cfg.path)
    if not isinstance(dd, datasets.DatasetDict) or "train" not in dd:
        raise UserError(f"data.path: {data_cfg.path}: expected a DatasetDict with a 'train' split")
    if data_cfg.eval_path:
        esrc = open_source(data_cfg.eval_path, "data.eval_path")
        items, _ = _eval_rows(esrc, normalizer, 0)
        dropped = dict.fromkeys(DROP_REASONS, 0)
        items = _filter(items, fmt, True, True, dropped)
        if tokenizer is not None:
            items = _length_filter(items, fmt, bool(normalizer.conversational), tokenizer,
                                   data_cfg.max_length, dropped, [])
        eval_ds = _to_dataset_dict({"eval": [r for _, r in items]}, fmt, data_cfg.eval_path)["eval"]
        if set(eval_ds.column_names) == set(dd["train"].column_names):
            import pyarrow as pa

            train_ds = dd["train"]
            try:  # same schema as train where possible (e.g. an empty eval has null columns)
                table = eval_ds.data.table.select(train_ds.column_names)
                eval_ds = datasets.Dataset(table.cast(train_ds.features.arrow_schema))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError):
                pass
        dd["eval"] = eval_ds
    elif "eval" not in dd:
        dd["eval"] = dd["train"].select([])
    return datasets.DatasetDict({"train": dd["train"], "eval": dd["eval"]}), fmt
