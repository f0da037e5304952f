"""Read raw dataset rows from any supported source, with a location for every row.

Sources (local paths or any storage URL, downloaded with :func:`trainer_lib.storage.localize`):

* JSONL (``.jsonl``/``.ndjson``): one object per line, locations ``FILE:LINE``;
* JSON (``.json``): a list of objects or ``{"data": [...]}``, locations ``FILE:LINE`` (the
  line where the object starts);
* CSV (``.csv``): header row, locations ``FILE:LINE``; see :func:`_csv_rows` for typing;
* plain text (``.txt``): one ``{"text": line}`` row per line, as ``datasets``' text builder reads it
  (the line break dropped, blank lines kept as empty rows, which the empty filter drops), locations
  ``FILE:LINE``;
* Parquet (``.parquet``/``.pq``): locations ``FILE:row N`` (0-based row index);
* a ``datasets`` ``save_to_disk`` directory (Dataset or DatasetDict, e.g. a prepared dir):
  locations ``DIR:row N`` or ``DIR[split]:row N``;
* a directory of the files above (read in sorted order);
* a Hugging Face hub id (``datasets.load_dataset``, with ``data.subset`` and ``data.revision``),
  or, with ``data.subset``, a directory laid out like a hub dataset repository; locations
  ``ID[split]:row N``.

``.gz`` is accepted after the JSONL/JSON/CSV/TXT suffixes. Heavy imports stay inside functions.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from trainer_lib.errors import DataError, UserError

FILE_KINDS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".txt": "txt",
    ".parquet": "parquet",
    ".pq": "parquet",
}
#: split names used as the eval split of a multi-split source, in order of preference.
EVAL_SPLITS = ("eval", "validation", "valid", "test")
#: prepared-dir marker files (written by ``posttrain prepare``).
STATS_FILE = "stats.json"
DATASET_DICT_FILE = "dataset_dict.json"

_TEXT_COLUMNS = (
    "text",
    "prompt",
    "completion",
    "chosen",
    "rejected",
    "messages",
    "instruction",
    "input",
    "output",
    "system",
    "history",
    "conversations",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_INT = re.compile(r"^[+-]?\d+$")

Row = tuple[str, dict]


def _file_kind(path: str) -> str | None:
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
        kind = FILE_KINDS.get(os.path.splitext(name)[1])
        return kind if kind in ("jsonl", "json", "csv", "txt") else None
    return FILE_KINDS.get(os.path.splitext(name)[1])


def _open_text(path: str, display: str):
    """The file as UTF-8 text (a UTF-8 byte-order mark is skipped). Bytes that are not UTF-8 are
    read as lone surrogates, which :func:`_check_utf8` reports with their line; a UTF-16 or
    UTF-32 file (byte-order mark) or one with NUL bytes is refused here."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        head = fh.read(4096)
    for bom, name in (
        (b"\xff\xfe\x00\x00", "UTF-32"),
        (b"\x00\x00\xfe\xff", "UTF-32"),
        (b"\xff\xfe", "UTF-16"),
        (b"\xfe\xff", "UTF-16"),
    ):
        if head.startswith(bom):
            raise DataError(
                display, None, f"UTF-8 text, got a {name} file (byte-order mark {bom.hex()}); save it as UTF-8"
            )
    if b"\x00" in head:
        line = head.count(b"\n", 0, head.index(b"\x00")) + 1
        raise DataError(f"{display}:{line}", None, "UTF-8 text, got NUL bytes (a UTF-16 or binary file?)")
    return opener(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline="")


_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _check_utf8(text: str, display: str, first_line: int = 1) -> None:
    """A :class:`DataError` naming the line and column of the first byte that was not UTF-8."""
    bad = _NOT_UTF8.search(text)
    if bad is None:
        return
    start = text.rfind("\n", 0, bad.start()) + 1
    line = first_line + text.count("\n", 0, bad.start())
    raise DataError(
        f"{display}:{line}",
        None,
        f"UTF-8 text (byte {ord(bad.group()) - 0xDC00:#04x} at column {bad.start() - start + 1} is not valid UTF-8)",
    )


def is_saved_dataset(local_dir: str) -> bool:
    """A ``datasets`` ``save_to_disk`` directory (Dataset or DatasetDict)."""
    return os.path.isfile(os.path.join(local_dir, DATASET_DICT_FILE)) or (
        os.path.isfile(os.path.join(local_dir, "state.json"))
        and os.path.isfile(os.path.join(local_dir, "dataset_info.json"))
    )


def is_prepared_dir(path: str) -> bool:
    """Whether ``path`` (local or URL) is a ``posttrain prepare`` output dir."""
    from trainer_lib import storage

    try:
        return storage.exists(storage.join(path, STATS_FILE)) and storage.exists(storage.join(path, DATASET_DICT_FILE))
    except (ValueError, FileNotFoundError):
        return False


@dataclass
class Source:
    """An opened source: ``path`` as the user gave it, ``local`` its local copy."""

    path: str
    local: str
    kind: str  # jsonl | json | csv | txt | parquet | saved | dir | hub
    splits: list[str] = field(default_factory=list)  # saved DatasetDict, hub, dir of split files
    prepared: dict | None = None  # stats.json of a prepared dir
    key: str = "data.path"  # the setting that named it, for errors
    split: str = ""  # the training split asked for (data.split); default train, else the first
    held_out: str = ""  # the eval split asked for (data.eval_split); default the first of EVAL_SPLITS
    dataset: object = None  # the DatasetDict load_dataset returned (hub)

    @property
    def train_split(self) -> str | None:
        if not self.splits:
            return None
        if self.split:
            return self.split
        return "train" if "train" in self.splits else self.splits[0]

    @property
    def eval_split(self) -> str | None:
        if self.held_out:
            return self.held_out
        return next((s for s in EVAL_SPLITS if s in self.splits and s != self.train_split), None)

    def check_splits(self, split: str = "", held_out: str = "") -> Source:
        """Take ``split``/``held_out`` as the train/eval splits, or a UserError naming the setting."""
        for setting, name in (("data.split", split), ("data.eval_split", held_out)):
            if not name:
                continue
            if self.splits and name not in self.splits:
                raise UserError(f"{setting}: {self.path} has no split {name!r} (it has {', '.join(self.splits)})")
            if not self.splits and not (setting == "data.split" and name == "train"):
                raise UserError(
                    f"{setting}: {self.path} has no named splits (a single {self.kind} source is "
                    f"all 'train'); name a split of a hub dataset, a DatasetDict or a directory of "
                    f"train/eval files"
                )
        if split and split == held_out:
            raise UserError(f"data.eval_split: {held_out!r} is also data.split; hold out another split")
        self.split = split if self.splits else ""
        self.held_out = held_out
        return self

    def rows(self, split: str | None = None) -> Iterator[Row]:
        """Yield ``(location, row)``; ``split`` picks a split of a multi-split source."""
        if self.kind in ("jsonl", "json", "csv", "txt", "parquet"):
            yield from _file_rows(self.local, self.kind, self.path)
        elif self.kind == "dir":
            wanted = split or self.train_split
            for rel in _data_files(self.local):
                if wanted is not None and _split_of(rel) != wanted:
                    continue
                local = os.path.join(self.local, rel)
                yield from _file_rows(local, _file_kind(rel), _display_join(self.path, rel))
        elif self.kind == "saved":
            yield from _dataset_rows(load_saved(self.local, self.path, self.key), self.path, split or self.train_split)
        elif self.kind == "hub":
            yield from _dataset_rows(self.dataset, self.path, split or self.train_split)
        else:  # pragma: no cover
            raise ValueError(self.kind)


def _display_join(base: str, rel: str) -> str:
    from trainer_lib import storage

    return storage.join(base, rel.replace(os.sep, "/")) if storage.is_remote(base) else os.path.join(base, rel)


def _data_files(local_dir: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(local_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith(".") and _file_kind(name) not in (None, "txt"):  # a README.txt is no data
                out.append(os.path.relpath(os.path.join(root, name), local_dir))
    return sorted(out)


def _split_of(rel: str) -> str | None:
    """``train.jsonl``, ``eval/part-0.parquet`` -> the split it names (HF's data-files layout)."""
    stem = rel.split(os.sep, 1)[0].split(".", 1)[0]
    return stem if stem in ("train", *EVAL_SPLITS) else None


def open_source(path: str, key: str = "data.path", subset: str = "", revision: str = "") -> Source:
    """Localize ``path`` and find out what it is; ``key`` names the setting in errors.

    A hub id is read with ``datasets.load_dataset``, ``subset`` naming its configuration and
    ``revision`` pinning its commit (branch, tag or sha). With a ``subset``, a local directory or
    a URL is read the same way: a dataset repository laid out like the hub's (a README whose
    ``configs`` name the data files of each configuration and split)."""
    from trainer_lib import storage

    if storage.is_remote(path):
        try:
            local = storage.localize(path)
        except FileNotFoundError:
            raise UserError(f"{key}: {path}: not found") from None
        except ValueError as exc:
            raise UserError(f"{key}: {exc}") from None
    else:
        local = os.path.expanduser(path)
        if not os.path.exists(local):
            if _HUB_ID.match(path) and not _file_kind(path):
                return _hub_source(path, path, key, subset, revision)
            raise UserError(f"{key}: {path}: no such file or directory")
    if revision:
        raise UserError(
            f"{key}: {path} is not a hub dataset, so data.revision ({revision!r}) cannot pin it; "
            f"leave data.revision empty"
        )
    if subset:
        if not os.path.isdir(local):
            raise UserError(
                f"{key}: {path}: data.subset ({subset!r}) names a configuration of a hub dataset or a "
                f"dataset repository directory, not of a single file"
            )
        return _hub_source(path, local, key, subset, "")
    if os.path.isdir(local):
        if is_saved_dataset(local):
            return _saved_source(path, local, key)
        files = _data_files(local)
        if not files:
            raise UserError(
                f"{key}: {path}: directory has no .jsonl/.json/.csv/.parquet files "
                "and is not a datasets save_to_disk directory"
            )
        named = {_split_of(rel) for rel in files}
        splits = sorted(named) if None not in named and "train" in named else []
        return Source(path, local, "dir", splits=splits)
    kind = _file_kind(local)
    if kind is None:
        raise UserError(
            f"{key}: {path}: unsupported file type (expected .jsonl, .json, .csv, "
            ".txt or .parquet, a directory of those, or a datasets save_to_disk directory)"
        )
    return Source(path, local, kind)


def _hub_source(path: str, local: str, key: str, subset: str, revision: str) -> Source:
    dataset = _load_hub(local, key, subset, revision, display=path)
    return Source(path, local, "hub", splits=list(dataset.keys()), key=key, dataset=dataset)


def _saved_source(path: str, local: str, key: str) -> Source:
    splits: list[str] = []
    dict_file = os.path.join(local, DATASET_DICT_FILE)
    if os.path.isfile(dict_file):
        try:
            with open(dict_file, encoding="utf-8") as fh:
                splits = list(json.load(fh).get("splits", []))
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise UserError(
                f"{key}: {path}/{DATASET_DICT_FILE}: not a datasets DatasetDict index ({type(exc).__name__}: {exc})"
            ) from None
        if not splits:
            raise UserError(f"{key}: {path}: DatasetDict has no splits")
    prepared = None
    stats_file = os.path.join(local, STATS_FILE)
    if splits and os.path.isfile(stats_file):
        try:
            with open(stats_file, encoding="utf-8") as fh:
                prepared = json.load(fh)
        except (OSError, ValueError):
            raise UserError(f"{key}: {path}/{STATS_FILE}: not valid JSON") from None
    return Source(path, local, "saved", splits=splits, prepared=prepared, key=key)


def load_saved(local: str, display: str, key: str = "data.path"):
    """``datasets.load_from_disk`` with any failure (missing or corrupt Arrow files, bad JSON)
    as one :class:`UserError` naming the setting and the path."""
    import datasets

    try:
        return datasets.load_from_disk(local)
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        raise UserError(
            f"{key}: {display}: not a readable datasets save_to_disk directory ({type(exc).__name__}: {text})"
        ) from None


def _load_hub(path: str, key: str = "data.path", subset: str = "", revision: str = "", display: str = ""):
    """``datasets.load_dataset(path, subset, revision=...)`` as a DatasetDict; $HF_TOKEN (gated or
    private datasets) is read by datasets itself. Failures are one UserError naming what was asked."""
    import datasets

    from trainer_lib.storage import redact

    asked = "".join(f", {name} {value!r}" for name, value in (("subset", subset), ("revision", revision)) if value)
    try:
        obj = datasets.load_dataset(path, subset or None, revision=revision or None)
    except Exception as exc:
        text = " ".join(str(exc).split())[:400]
        raise UserError(
            redact(
                f"{key}: could not load '{display or path}'{asked} with datasets.load_dataset: "
                f"{type(exc).__name__}: {text}"
            )
        ) from None
    if isinstance(obj, datasets.Dataset):
        obj = datasets.DatasetDict({"train": obj})
    return obj


def iter_source(path: str, split: str | None = None, key: str = "data.path") -> Iterator[Row]:
    """``(location, row)`` for every row of ``path`` (its train split if it has several)."""
    yield from open_source(path, key).rows(split)


# --------------------------------------------------------------------------- readers


def _file_rows(local: str, kind: str, display: str) -> Iterator[Row]:
    if kind == "jsonl":
        yield from _jsonl_rows(local, display)
    elif kind == "json":
        with _open_text(local, display) as fh:
            text = fh.read()
        _check_utf8(text, display)
        yield from _json_rows(text, display)
    elif kind == "csv":
        yield from _csv_rows(local, display)
    elif kind == "txt":
        yield from _txt_rows(local, display)
    elif kind == "parquet":
        yield from _parquet_rows(local, display)
    else:  # pragma: no cover
        raise ValueError(kind)


def _object(value, location: str) -> dict:
    if not isinstance(value, dict):
        raise DataError(location, None, "a JSON object", value)
    return value


def _jsonl_rows(local: str, display: str) -> Iterator[Row]:
    with _open_text(local, display) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            _check_utf8(line, display, lineno)
            location = f"{display}:{lineno}"
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise DataError(location, None, f"valid JSON ({exc.msg} at column {exc.colno})") from None
            yield location, _object(value, location)


def _txt_rows(local: str, display: str) -> Iterator[Row]:
    """One ``{"text": line}`` per line, as ``datasets.load_dataset("text", ...)`` reads a corpus."""
    with _open_text(local, display) as fh:
        for lineno, line in enumerate(fh, 1):
            _check_utf8(line, display, lineno)
            yield f"{display}:{lineno}", {"text": line.rstrip("\r\n")}


_WS = re.compile(r"[ \t\n\r]*")


def _json_rows(text: str, display: str) -> Iterator[Row]:
    """Rows of a JSON document (list, or object with a "data" list) with their start lines."""
    decoder = json.JSONDecoder()
    pos = {"at": 0, "line": 1}

    def ws(i: int) -> int:
        return _WS.match(text, i).end()

    def line(i: int) -> int:
        pos["line"] += text.count("\n", pos["at"], i)
        pos["at"] = i
        return pos["line"]

    def fail(msg: str, i: int):
        raise json.JSONDecodeError(msg, text, i)

    def array(i: int):  # text[i] == "["; yields rows, returns the index after "]"
        i = ws(i + 1)
        if text.startswith("]", i):
            return i + 1
        while True:
            value, end = decoder.raw_decode(text, i)
            location = f"{display}:{line(i)}"
            yield location, _object(value, location)
            i = ws(end)
            if text.startswith(",", i):
                i = ws(i + 1)
            elif text.startswith("]", i):
                return i + 1
            else:
                fail("Expecting ',' delimiter", i)

    shape = 'a JSON list of objects or {"data": [...]}'
    try:
        i = ws(0)
        if text.startswith("[", i):
            i = yield from array(i)
        elif text.startswith("{", i):
            found = False
            i = ws(i + 1)
            while not text.startswith("}", i):
                if not text.startswith('"', i):
                    fail("Expecting property name enclosed in double quotes", i)
                name, i = decoder.raw_decode(text, i)
                i = ws(i)
                if not text.startswith(":", i):
                    fail("Expecting ':' delimiter", i)
                i = ws(i + 1)
                if name == "data" and text.startswith("[", i):
                    i = yield from array(i)
                    found = True
                else:
                    _, i = decoder.raw_decode(text, i)
                i = ws(i)
                if text.startswith(",", i):
                    i = ws(i + 1)
                elif not text.startswith("}", i):
                    fail("Expecting ',' delimiter", i)
            i += 1
            if not found:
                raise DataError(display, None, shape + ' (no "data" list found)')
        elif i >= len(text):
            return
        else:
            value, i = decoder.raw_decode(text, i)
            raise DataError(display, None, shape, value)
        if ws(i) != len(text):
            fail("Extra data", ws(i))
    except json.JSONDecodeError as exc:
        raise DataError(f"{display}:{exc.lineno}", None, f"valid JSON ({exc.msg} at column {exc.colno})") from None


def _csv_rows(local: str, display: str) -> Iterator[Row]:
    """CSV rows, typed per column so that every row of a column has the same type.

    Text columns of the formats (text, prompt, completion, chosen, rejected, messages, and
    alpaca's and sharegpt's instruction, input, output, system, history, conversations) stay
    strings, unless every non-empty cell of the column is a JSON list (conversations).
    Other columns become bool (true/false), int or float when all their non-empty cells
    are; empty cells in those columns are null. Anything else stays a string.
    """
    with _open_text(local, display) as fh:
        text = fh.read()
    _check_utf8(text, display)
    reader = csv.reader(io.StringIO(text, newline=""))
    header, records, last = None, [], 0
    for record in reader:
        start, last = last + 1, reader.line_num
        if not record or (len(record) == 1 and not record[0].strip()):
            continue
        if header is None:
            header = [h.strip() for h in record]
            continue
        location = f"{display}:{start}"
        if len(record) != len(header):
            raise DataError(location, None, f"{len(header)} comma-separated fields like the header, got {len(record)}")
        records.append((location, record))
    if header is None:
        return
    columns = [_csv_convert(name, [r[j] for _, r in records]) for j, name in enumerate(header)]
    for i, (location, _) in enumerate(records):
        yield location, {name: col[i] for name, col in zip(header, columns)}


def _csv_convert(name: str, cells: list[str]) -> list:
    filled = [c for c in cells if c.strip()]
    if name in _TEXT_COLUMNS:
        if filled and all(c.lstrip().startswith("[") for c in filled):
            try:
                decoded = [json.loads(c) if c.strip() else [] for c in cells]
            except json.JSONDecodeError:
                return cells
            if all(isinstance(d, list) for d in decoded):
                return decoded
        return cells
    if not filled:
        return cells
    low = [c.strip().lower() for c in filled]
    if all(c in ("true", "false") for c in low):
        return [c.strip().lower() == "true" if c.strip() else None for c in cells]
    if all(_INT.match(c) for c in low):
        return [int(c) if c.strip() else None for c in cells]
    try:
        [float(c) for c in low]
    except ValueError:
        return cells
    return [float(c) if c.strip() else None for c in cells]


def _parquet_rows(local: str, display: str) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(local)
    except Exception as exc:
        raise DataError(display, None, f"a readable Parquet file ({exc})") from None
    index = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{display}:row {index}", row
            index += 1


def _dataset_rows(obj, display: str, split: str | None) -> Iterator[Row]:
    import datasets

    if isinstance(obj, datasets.DatasetDict):
        if split not in obj:
            raise UserError(f"data.path: {display}: no split '{split}' (has {', '.join(obj)})")
        ds, prefix = obj[split], f"{display}[{split}]"
    else:
        ds, prefix = obj, display
    index = 0
    for batch in ds.iter(batch_size=1024):
        names = list(batch)
        for values in zip(*(batch[n] for n in names)):
            yield f"{prefix}:row {index}", dict(zip(names, values))
            index += 1


__all__ = [
    "Source",
    "open_source",
    "load_saved",
    "iter_source",
    "is_prepared_dir",
    "is_saved_dataset",
    "FILE_KINDS",
    "EVAL_SPLITS",
    "STATS_FILE",
    "DATASET_DICT_FILE",
]
