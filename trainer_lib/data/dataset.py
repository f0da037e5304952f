"""Build train/eval splits from any source: normalize + validate, filter, split.

One code path for ``posttrain prepare`` (:func:`build_dataset`, which also returns the stats)
and for the training stages (:func:`training_data`, which accepts either a prepared dir or a
raw source). Rows are validated and normalized one at a time, in order (the first row decides
the format; :mod:`trainer_lib.data.normalize`), and stream into Arrow files
(:mod:`trainer_lib.data.arrow_rows`); token lengths are measured by ``data.num_workers``
processes (:mod:`trainer_lib.data.tokenized`).
``datasets``/``pyarrow``/tokenizers are imported inside functions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainer_lib.data import llamafactory
from trainer_lib.data.formats import AUTO, FORMATS, SOURCE_FORMATS
from trainer_lib.data.holdout import SHUFFLE, holdout_indices
from trainer_lib.data.normalize import (  # Normalizer: also imported from here (rl/feedback.py)
    DROP_REASONS,
    BadRows,
    Normalizer,
    RowFilter,
    eval_rows,
    length_filter,
    read_rows,
)
from trainer_lib.data.sources import STATS_FILE, Source, is_prepared_dir, load_saved, open_source
from trainer_lib.errors import UserError

log = logging.getLogger(__name__)

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


# --------------------------------------------------------------------------- build

#: modules whose code decides what a normalized build contains (part of its cache key).
BUILD_CODE = (
    "trainer_lib.data.dataset",
    "trainer_lib.data.normalize",
    "trainer_lib.data.images",
    "trainer_lib.data.formats",
    "trainer_lib.data.sources",
    "trainer_lib.data.llamafactory",
    "trainer_lib.data.public_datasets",
    "trainer_lib.data.holdout",
    "trainer_lib.data.mixing",
    "trainer_lib.data.arrow_rows",
    "trainer_lib.data.tokenized",
)


@dataclass
class Spec:
    """One dataset to read: the setting that names it (for errors), where it is and how its rows are
    laid out. ``format`` None: as the training data (``data.eval_path``)."""

    key: str
    path: str
    format: str | None = AUTO
    columns: dict | None = None
    subset: str = ""
    split: str = ""
    eval_split: str = ""
    revision: str = ""

    def open(self) -> Source:
        source = open_source(self.path, self.key, self.subset, self.revision)
        return source.check_splits(self.split, self.eval_split)


def source_specs(data_cfg) -> tuple[list[Spec], list[Spec]]:
    """``(training datasets, eval datasets)`` of a ``data`` config: ``data.path`` or the names of
    ``data.dataset`` (their entries in ``dataset_info.json``), ``data.eval_path`` or ``data.eval_dataset``."""

    def registry(key: str, names: list[str]) -> list[Spec]:
        try:
            entries = llamafactory.registry_sources(names, getattr(data_cfg, "dataset_dir", "data"))
        except ValueError as exc:
            raise UserError(f"data.{key}: {exc}") from None
        return [
            Spec(f"data.{key} ({e['name']})", e["path"], e["format"], e["columns"], e["subset"], e["split"])
            for e in entries
        ]

    if getattr(data_cfg, "dataset", None):
        train = registry("dataset", data_cfg.dataset)
    elif getattr(data_cfg, "sources", None):
        train = [
            Spec(
                f"data.sources[{i}] ({s['path']})",
                s["path"],
                data_cfg.format,
                s.get("columns") or None,
                s.get("subset", ""),
                s.get("split", ""),
                "",
                s.get("revision", ""),
            )
            for i, s in enumerate(data_cfg.sources)
        ]
    else:
        if not data_cfg.path:
            raise UserError("data.path: required, expected a dataset path")
        settings = [getattr(data_cfg, k, "") for k in ("subset", "split", "eval_split", "revision")]
        train = [Spec("data.path", data_cfg.path, data_cfg.format, getattr(data_cfg, "columns", None), *settings)]
    if getattr(data_cfg, "eval_dataset", None):
        return train, registry("eval_dataset", data_cfg.eval_dataset)
    return train, [Spec("data.eval_path", data_cfg.eval_path, None)] if data_cfg.eval_path else []


def _display(data_cfg) -> str:
    """How messages name the training data: ``data.path``, or the dataset names."""
    names = getattr(data_cfg, "dataset", None) or [s["path"] for s in getattr(data_cfg, "sources", None) or []]
    return ",".join(names) or str(data_cfg.path)


@dataclass
class _Job:
    """What one normalized build reads, and the settings that shape it."""

    data_cfg: Any
    seed: int
    tokenizer: Any
    drop_empty: bool
    drop_duplicates: bool
    max_rows: int
    allowed_formats: Any
    stage: str
    train: list[tuple[Spec, Source]]
    evals: list[tuple[Spec, Source]]
    bad: BadRows | None = None  # data.bad_rows=drop: the malformed rows dropped

    def cache_parts(self) -> dict | None:
        """The build's cache key, or None when a source's content cannot be known (a hub id)."""
        from trainer_lib.data import cache

        specs = [spec for spec, _ in self.train + self.evals]
        sources = [cache.source_fingerprint(spec.path) for spec in specs]
        if None in sources:
            return None
        cfg, measured = self.data_cfg, self.tokenizer is not None
        return {
            "sources": sources,
            "specs": [dataclasses.asdict(spec) for spec in specs],
            "settings": {
                k: getattr(cfg, k, None)
                for k in (
                    "eval_fraction",
                    "eval_by",
                    "bad_rows",
                    "mix_strategy",
                    "interleave_probs",
                    "dataset",
                    "eval_dataset",
                )
            },
            "seed": self.seed,
            "max_rows": self.max_rows,
            "drop_empty": self.drop_empty,
            "drop_duplicates": self.drop_duplicates,
            "tokenizer": cache.tokenizer_fingerprint(self.tokenizer) if measured else None,
            "max_length": cfg.max_length if measured else None,
            "over_length": getattr(cfg, "over_length", "drop") if measured else None,
            "code": cache.code_version(*BUILD_CODE),
        }

    def normalizer(self, spec: Spec, source: Source, earlier: list[Normalizer]) -> Normalizer:
        """The normalizer of one dataset; after the first, it must give rows of the same kind."""
        fmt = spec.format
        if fmt == AUTO and source.prepared:
            fmt = source.prepared.get("format", AUTO)  # keep what prepare decided (maybe forced)
        columns = None if source.prepared else spec.columns
        if not earlier:
            return Normalizer(fmt, self.allowed_formats, self.stage, columns=columns)
        normalizer = Normalizer(fmt, self.allowed_formats, self.stage, earlier[0].conversational, columns)
        normalizer.kind_from = earlier[0].kind_from
        return normalizer

    def check_kind(self, spec: Spec, normalizer: Normalizer, earlier: list[Normalizer]) -> None:
        if earlier and normalizer.fmt not in (None, earlier[0].fmt):
            raise UserError(
                f"{spec.key}: {spec.path} holds {normalizer.fmt} rows, but {self.train[0][0].key} holds "
                f"{earlier[0].fmt} rows; datasets read together must share one format"
            )


def build_dataset(
    data_cfg,
    seed: int,
    *,
    tokenizer=None,
    drop_empty: bool = True,
    drop_duplicates: bool = True,
    max_rows: int = 0,
    allowed_formats: Iterable[str] | None = None,
    stage: str = "this stage",
) -> tuple[Any, dict]:
    """Normalize, validate, filter and split ``data_cfg.path`` (or the datasets of ``data_cfg.dataset``,
    mixed by ``data_cfg.mix_strategy``) -> ``(DatasetDict, stats)``.

    Eval rows come from ``data_cfg.eval_path`` / ``eval_dataset`` if set, else from an eval/validation/test
    split of the source(s), else are split off by ``data_cfg.eval_fraction`` with ``seed``. Rows over
    ``data_cfg.max_length`` tokens are measured only with a ``tokenizer``: dropped with
    ``data_cfg.over_length=drop`` (and prompts always), else counted (``stats["truncated"]``) and left
    for the stage's tokenizer to truncate. ``max_rows`` (> 0; else ``data_cfg.max_rows``) caps the rows
    read from each source.
    Raises :class:`DataError` for a malformed row, :class:`UserError` for other problems with the data.

    Rows stream through to memory-mapped Arrow (memory does not grow with the data); the result is
    cached (:mod:`trainer_lib.data.cache`) by the content of the sources and every setting above, so
    a second build (another ``prepare``, every rank but local rank 0 of a job) loads it.
    """
    import os

    from trainer_lib.data import cache

    train, evals = source_specs(data_cfg)
    job = _Job(
        data_cfg,
        seed,
        tokenizer,
        drop_empty,
        drop_duplicates,
        max_rows or getattr(data_cfg, "max_rows", 0),
        allowed_formats,
        stage,
        [(spec, spec.open()) for spec in train],
        [(spec, spec.open()) for spec in evals],
        BadRows() if getattr(data_cfg, "bad_rows", "error") == "drop" else None,
    )
    what = f"the rows of {_display(data_cfg)}"
    entry, manifest = cache.build_once("normalized", job.cache_parts(), lambda tmp: {"stats": _build(job, tmp)}, what)
    stats = manifest["stats"]
    source = stats["source_format"]  # a cached build: check that it fits, naming the format it was read as
    Normalizer(source if SOURCE_FORMATS.get(source) == stats["format"] else stats["format"], allowed_formats, stage)
    dd = load_saved(os.path.join(entry, "data"), _display(data_cfg))
    _report(stats, data_cfg)
    return dd, stats


def _report(stats: dict, data_cfg) -> None:
    """Log the counts; say on stderr (once per job) what happened to over-length rows and how datasets mixed."""
    import os
    import sys

    log.info(
        "data: %s rows read, kept train=%d eval=%d, dropped %s",
        stats["rows_read"],
        stats["rows"]["train"],
        stats["rows"]["eval"],
        stats["dropped"],
    )
    lines = []
    if stats.get("mix"):
        parts = ", ".join(f"{m['name']} ({m['rows']} rows)" for m in stats["mix"]["datasets"])
        lines.append(f"{parts} mixed by {stats['mix']['strategy']}: {stats['mix']['rows']} training rows")
    longer = f"longer than data.max_length={stats['max_length']} tokens"
    if stats.get("truncated"):
        lines.append(
            f"{stats['truncated']} rows {longer} are truncated to it when tokenized "
            f"(data.over_length=drop drops them instead)"
        )
    if stats["dropped"].get("too_long"):
        lines.append(f"{stats['dropped']['too_long']} rows {longer} dropped")
    if stats["dropped"].get("duplicate"):
        lines.append(
            f"{stats['dropped']['duplicate']} exact duplicate rows dropped "
            f"(to keep them: posttrain prepare drop_duplicates=false, then train on its output)"
        )
    if stats["dropped"].get("empty"):
        lines.append(f"{stats['dropped']['empty']} rows with an empty text field dropped")
    if stats["dropped"].get("malformed"):
        first = stats["malformed"][0]
        lines.append(f"{stats['dropped']['malformed']} malformed rows dropped (data.bad_rows=drop), the first: {first}")
    if os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0":
        for line in lines:
            print(f"data: {line}", file=sys.stderr)


def _write_train(job: _Job, rows: RowFilter) -> tuple[list[Normalizer], list[int]]:
    """Every training dataset's rows into the ``train`` split, in order: (their normalizers, rows kept of each)."""
    normalizers: list[Normalizer] = []
    counts: list[int] = []
    for spec, source in job.train:
        normalizer = job.normalizer(spec, source, normalizers)
        read, kept = rows.rows_read, rows.writer.rows.get("train", 0)
        rows.write("train", read_rows(source, source.train_split, normalizer, job.max_rows, job.bad), normalizer)
        if rows.rows_read == read:
            malformed = (
                f" ({job.bad.count} malformed, the first: {job.bad.first[0]})" if job.bad and job.bad.count else ""
            )
            raise UserError(f"{spec.key}: {spec.path}: no rows{malformed}")
        job.check_kind(spec, normalizer, normalizers)
        normalizers.append(normalizer)
        counts.append(rows.writer.rows["train"] - kept)
    return normalizers, counts


def _write_eval(job: _Job, rows: RowFilter, normalizers: list[Normalizer]) -> str | None:
    """The eval rows into the ``eval`` split: from the eval datasets, else from the eval splits of the
    training datasets. Returns where they came from (None: split off the training rows later)."""
    names = []
    if job.evals:
        for spec, source in job.evals:
            if spec.format is None:  # data.eval_path: read like the training data
                items, name = eval_rows(source, normalizers[0], job.max_rows, job.bad)
                rows.write("eval", items, normalizers[0])
            else:
                normalizer = job.normalizer(spec, source, normalizers)
                rows.write("eval", read_rows(source, source.train_split, normalizer, job.max_rows, job.bad), normalizer)
                job.check_kind(spec, normalizer, normalizers)
                name = spec.path
            names.append(name)
        return ", ".join(names)
    if getattr(job.data_cfg, "eval_by", SHUFFLE) != SHUFFLE:
        return None  # the training rows are split by data.eval_by, not by a source's own eval split
    for (_, source), normalizer in zip(job.train, normalizers):
        if source.eval_split is not None:
            rows.write("eval", read_rows(source, source.eval_split, normalizer, job.max_rows, job.bad), normalizer)
            names.append(f"{source.path}[{source.eval_split}]")
    return ", ".join(names) or None


def _mix(job: _Job, train, counts: list[int]) -> tuple[Any, dict | None]:
    """The training rows of several datasets mixed by ``data.mix_strategy``, and what the stats say of it."""
    from trainer_lib.data.mixing import mix_indices

    if len(job.train) < 2:
        return train, None
    strategy = getattr(job.data_cfg, "mix_strategy", "concat")
    order = mix_indices(counts, strategy, getattr(job.data_cfg, "interleave_probs", None), job.seed)
    if strategy != "concat":
        train = train.select(order)
    names = [spec.key.split("(", 1)[-1].rstrip(")") for spec, _ in job.train]
    datasets = [{"name": name, "rows": count} for name, count in zip(names, counts)]
    return train, {"strategy": strategy, "datasets": datasets, "rows": len(order)}


def _split_off_eval(job: _Job, train, eval_by: str) -> dict:
    """``{"train", "eval"}``: the eval rows split off the training rows by ``data.eval_by`` (a seeded
    shuffle of ``data.eval_fraction``, a stable hash, or a column's ranges; :mod:`trainer_lib.data.holdout`)."""
    fraction = job.data_cfg.eval_fraction
    if eval_by == SHUFFLE:
        train_idx, eval_idx = split_indices(len(train), fraction, job.seed)
    else:
        train_idx, eval_idx = holdout_indices(train, eval_by, fraction, _display(job.data_cfg))
        if not train_idx:
            raise UserError(
                f"data.eval_by={eval_by}: every row of {_display(job.data_cfg)} is held out; none to train on"
            )
    return {"train": train.select(train_idx) if eval_idx else train, "eval": train.select(eval_idx)}


def _build(job: _Job, out_dir: str) -> dict:
    """Build the splits into ``out_dir/data`` (a DatasetDict) and return the stats."""
    import os
    import shutil

    import datasets

    from trainer_lib.data.arrow_rows import INTERNAL, RowWriter, fingerprint

    data_cfg, tokenizer = job.data_cfg, job.tokenizer
    work = os.path.join(out_dir, "work")
    writer = RowWriter(work, _display(data_cfg))
    dropped = dict.fromkeys(DROP_REASONS, 0)
    rows = RowFilter(writer, job.drop_empty, job.drop_duplicates, dropped)
    normalizers, counts = _write_train(job, rows)
    eval_source = _write_eval(job, rows, normalizers)
    fmt, conv = normalizers[0].fmt, bool(normalizers[0].conversational)
    splits = writer.finish()
    splits["train"], mix = _mix(job, splits["train"], counts)

    lengths, truncated = [], 0
    if tokenizer is not None:
        for name in list(splits):
            splits[name], kept, over = length_filter(splits[name], fmt, conv, tokenizer, data_cfg, dropped, work)
            lengths.append(kept)
            truncated += over
    if not len(splits["train"]):
        reasons = ", ".join(f"{k}: {v}" for k, v in dropped.items())
        raise UserError(f"data.path: {_display(data_cfg)}: no training rows left after filtering ({reasons})")
    eval_by = getattr(data_cfg, "eval_by", SHUFFLE)
    if eval_source is None:
        splits = _split_off_eval(job, splits["train"], eval_by)
    dd = datasets.DatasetDict({name: splits[name] for name in ("train", "eval")})
    content = fingerprint(fmt, dd)
    dd = dd.remove_columns(list(INTERNAL))
    save_dataset_dict(dd, os.path.join(out_dir, "data"))
    source_formats = {n.source for n in normalizers}
    stats = {
        "format": fmt,
        "source_format": source_formats.pop() if len(source_formats) == 1 else None,
        "conversational": conv,
        "source": _display(data_cfg),
        "eval_source": eval_source,
        "columns": list(dd["train"].column_names),
        "rows_read": rows.rows_read,
        "rows": {name: len(ds) for name, ds in dd.items()},
        "dropped": dropped,
        "truncated": truncated,
        "token_lengths": None,
        "max_length": data_cfg.max_length if tokenizer is not None else None,
        "seed": job.seed,
        "eval_fraction": data_cfg.eval_fraction if eval_source is None and ":" not in eval_by else None,
        "eval_by": eval_by if eval_source is None else None,
        "fingerprint": content,
    }
    if mix:
        stats["mix"] = mix
    if job.bad is not None:
        dropped["malformed"], stats["malformed"] = job.bad.count, job.bad.first
    kept = [x for x in lengths if len(x)]
    if kept:
        import numpy as np

        every = np.concatenate(kept)
        mean = round(float(every.mean()), 2)
        stats["token_lengths"] = {"min": int(every.min()), "mean": mean, "max": int(every.max())}
    del dd, splits
    shutil.rmtree(work, ignore_errors=True)
    return stats


# --------------------------------------------------------------------------- training stages


def read_prepared_stats(path: str) -> dict:
    from trainer_lib import storage

    try:
        return json.loads(storage.read_text(storage.join(path, STATS_FILE)))
    except ValueError as exc:
        raise UserError(f"data.path: {path}/{STATS_FILE}: not valid JSON ({exc})") from None


@dataclass
class TrainingData:
    """A training stage's data: ``splits`` (DatasetDict with train/eval), their ``format``, and the
    content ``fingerprints`` of each split (None where unknown), the key of their tokenization cache."""

    splits: Any
    format: str
    fingerprints: dict


def load_training_data(
    data_cfg, seed: int, allowed_formats: tuple[str, ...] | None = None, tokenizer=None, stage: str = "this stage"
) -> tuple[Any, str]:
    """``(DatasetDict with train/eval, format)`` for a training stage (see :func:`training_data`)."""
    data = training_data(data_cfg, seed, allowed_formats, tokenizer, stage)
    return data.splits, data.format


def training_data(
    data_cfg, seed: int, allowed_formats: tuple[str, ...] | None = None, tokenizer=None, stage: str = "this stage"
) -> TrainingData:
    """The train/eval splits of ``data_cfg.path`` for a training stage.

    ``data_cfg.path`` is a prepared dir (loaded as is; ``data.eval_path``, if set, replaces
    its eval split) or any raw source ``prepare`` accepts, or ``data_cfg.dataset`` names datasets
    of ``dataset_info.json`` (normalized on the fly by :func:`build_dataset`, at most
    ``data.max_rows`` rows of each; with a ``tokenizer`` over-length rows are measured there too).
    ``stage`` names the caller in the ``allowed_formats`` error, e.g. ``"SFT"``.
    """
    if getattr(data_cfg, "dataset", None) or not is_prepared_dir(data_cfg.path or ""):
        dd, stats = build_dataset(data_cfg, seed, tokenizer=tokenizer, allowed_formats=allowed_formats, stage=stage)
        return TrainingData(dd, stats["format"], _split_fingerprints(stats.get("fingerprint"), dd))
    if getattr(data_cfg, "eval_dataset", None):
        raise UserError(
            f"data.eval_dataset: {data_cfg.path} is a prepared dataset, whose eval split is used as it is; "
            f"give separate eval data to it as data.eval_path"
        )

    import datasets

    from trainer_lib import storage

    stats = read_prepared_stats(data_cfg.path)
    fmt = stats.get("format")
    if fmt not in FORMATS:
        raise UserError(f"data.path: {data_cfg.path}/{STATS_FILE}: unknown format {fmt!r}")
    source_format = stats.get("source_format") or fmt
    if data_cfg.format not in (AUTO, fmt, source_format):
        raise UserError(f"data.format: {data_cfg.format}, but {data_cfg.path} was prepared as {source_format}")
    columns = getattr(data_cfg, "columns", None)
    if source_format in llamafactory.SOURCE_FORMATS and llamafactory.target_format(source_format, columns) != fmt:
        source_format, columns = fmt, None  # e.g. ranked sharegpt pairs: read on as the preference rows they became
    normalizer = Normalizer(source_format, allowed_formats, stage, stats.get("conversational"), columns=columns)
    dd = load_saved(storage.localize(data_cfg.path), data_cfg.path)
    if not isinstance(dd, datasets.DatasetDict) or "train" not in dd:
        raise UserError(f"data.path: {data_cfg.path}: expected a DatasetDict with a 'train' split")
    given = getattr(data_cfg, "split", ""), getattr(data_cfg, "eval_split", "")
    Source(data_cfg.path, data_cfg.path, "saved", splits=list(dd)).check_splits(*given)
    split, held_out = given[0] or "train", given[1] or "eval"
    max_rows = getattr(data_cfg, "max_rows", 0)
    picked = {"train": dd[split], "eval": dd[held_out] if held_out in dd else dd[split].select([])}
    if max_rows:
        picked = {name: rows.select(range(min(max_rows, len(rows)))) for name, rows in picked.items()}
    fingerprints = _split_fingerprints(stats.get("fingerprint"), dd, {"train": split, "eval": held_out}, max_rows)
    if data_cfg.eval_path:
        picked["eval"], fingerprints["eval"] = _prepared_eval(data_cfg, fmt, normalizer, tokenizer, picked["train"])
    return TrainingData(datasets.DatasetDict(picked), fmt, fingerprints)


def _split_fingerprints(content: str | None, dd, names: dict | None = None, max_rows: int = 0) -> dict:
    """The content fingerprint of each split a stage trains and evaluates on: a prepared dataset's own
    split (``names``: which one each role takes, data.split / data.eval_split), cut to ``max_rows``."""
    from trainer_lib.data.cache import digest

    names = names or {"train": "train", "eval": "eval"}
    return {
        role: digest([content, names[role]] + ([max_rows] if max_rows else [])) if content else None
        for role in ("train", "eval")
    }


def _prepared_eval(data_cfg, fmt: str, normalizer: Normalizer, tokenizer, train):
    """``(eval Dataset, its fingerprint)`` read from ``data.eval_path`` for a prepared ``data.path``: the
    same filters as prepare, the schema of the train split where it fits."""
    import os

    import datasets

    from trainer_lib.data import cache

    esrc = open_source(data_cfg.eval_path, "data.eval_path")
    known = cache.source_fingerprint(data_cfg.eval_path)
    parts = (
        None
        if known is None
        else {
            "eval_source": known,
            "eval_path": data_cfg.eval_path,
            "format": normalizer.source,
            "conversational": normalizer.conversational,
            "columns": getattr(data_cfg, "columns", None),
            "bad_rows": getattr(data_cfg, "bad_rows", "error"),
            "tokenizer": cache.tokenizer_fingerprint(tokenizer) if tokenizer is not None else None,
            "max_length": data_cfg.max_length if tokenizer is not None else None,
            "over_length": getattr(data_cfg, "over_length", "drop") if tokenizer is not None else None,
            "code": cache.code_version(*BUILD_CODE),
        }
    )

    def build(tmp: str) -> dict:
        from trainer_lib.data.arrow_rows import INTERNAL, RowWriter, fingerprint

        work = os.path.join(tmp, "work")
        writer = RowWriter(work, data_cfg.eval_path)
        dropped = dict.fromkeys(DROP_REASONS, 0)
        bad = BadRows() if getattr(data_cfg, "bad_rows", "error") == "drop" else None
        items, _ = eval_rows(esrc, normalizer, 0, bad)
        RowFilter(writer, True, True, dropped).write("eval", items, normalizer)
        if bad is not None and bad.count:
            log.warning(
                "data.eval_path: %d malformed rows dropped (data.bad_rows=drop), the first: %s", bad.count, bad.first[0]
            )
        ds = writer.finish()["eval"]
        if tokenizer is not None:
            ds, _, _ = length_filter(ds, fmt, bool(normalizer.conversational), tokenizer, data_cfg, dropped, work)
        content = fingerprint(fmt, {"eval": ds})
        save_dataset_dict(datasets.DatasetDict({"eval": ds.remove_columns(list(INTERNAL))}), os.path.join(tmp, "data"))
        return {"fingerprint": content}

    entry, manifest = cache.build_once("eval", parts, build, what=f"the rows of {data_cfg.eval_path}")
    eval_ds = load_saved(os.path.join(entry, "data"), data_cfg.eval_path)["eval"]
    if set(eval_ds.column_names) == set(train.column_names):
        import pyarrow as pa

        try:  # same schema as train where possible (e.g. an empty eval has null columns)
            table = eval_ds.data.table.select(train.column_names)
            eval_ds = datasets.Dataset(table.cast(train.features.arrow_schema))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError):
            pass
    return eval_ds, cache.digest([manifest["fingerprint"], "eval"])
