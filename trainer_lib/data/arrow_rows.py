"""Normalized rows -> Arrow files on disk a batch at a time, with one schema across every split.

Memory holds one batch of rows, whatever the size of the data set. Each batch is typed on its own
(so a column that is null or integer in one batch and text or float in another is fine); when the
splits are finished the batch schemas are unified (null -> any type, int -> float, ...) and every
batch is cast to that schema as it is copied into its split's file. The splits come back as
memory-mapped ``datasets.Dataset`` objects, each row with its location (for error messages) and a
sha256 of its normalized value (for the data fingerprint and the duplicate filter) in two extra
columns, :data:`LOCATION` and :data:`DIGEST`.
"""

from __future__ import annotations

import hashlib
import json
import os

from trainer_lib.errors import UserError

LOCATION = "__posttrain_location__"
DIGEST = "__posttrain_digest__"
INTERNAL = (LOCATION, DIGEST)


def _arrow_errors() -> tuple:
    import pyarrow as pa

    return (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError)


def row_digest(row: dict) -> bytes:
    """sha256 of a normalized row as JSON (keys sorted): equal rows, equal digests."""
    return hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode()).digest()


class RowWriter:
    """Collects ``(split, location, row)`` into Arrow part files of ``batch_rows`` rows under ``directory``;
    :meth:`finish` returns ``{split: Dataset}``. ``source`` names the data in type errors."""

    def __init__(self, directory: str, source: str, batch_rows: int = 8192):
        self.directory, self.source, self.batch_rows = directory, source, batch_rows
        self.columns: dict[str, None] = {}  # format fields first, then extras in first-seen order
        self.buffers: dict[str, list[tuple[str, dict, bytes]]] = {}
        self.parts: dict[str, list[str]] = {}
        self.rows: dict[str, int] = {}
        os.makedirs(directory, exist_ok=True)

    def open_split(self, split: str) -> None:
        """Make ``split`` exist (possibly with no rows)."""
        self.buffers.setdefault(split, [])
        self.parts.setdefault(split, [])
        self.rows.setdefault(split, 0)

    def add(self, split: str, location: str, row: dict, fields: tuple[str, ...], digest: bytes) -> None:
        if not self.columns:
            self.columns.update(dict.fromkeys(fields))
        self.columns.update(dict.fromkeys(row))
        self.open_split(split)
        self.buffers[split].append((location, row, digest))
        self.rows[split] += 1
        if len(self.buffers[split]) >= self.batch_rows:
            self._flush(split)

    def _type_error(self, column: str, exc: Exception) -> UserError:
        return UserError(f"{self.source}: column '{column}': values do not share one type across rows ({exc})")

    def _flush(self, split: str) -> None:
        import pyarrow as pa

        buffer = self.buffers[split]
        if not buffer:
            return
        arrays = {}
        for column in self.columns:
            try:
                arrays[column] = pa.array([row.get(column) for _, row, _ in buffer])
            except _arrow_errors() as exc:
                raise self._type_error(column, exc) from None
        arrays[LOCATION] = pa.array([loc for loc, _, _ in buffer], pa.string())
        arrays[DIGEST] = pa.array([d for _, _, d in buffer], pa.binary(32))
        table = pa.table(arrays)
        path = os.path.join(self.directory, f"{split}-part{len(self.parts[split]):05d}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        self.parts[split].append(path)
        buffer.clear()

    def _schema(self):
        """One schema for every part: each column's types unified, in column order, then the internal ones."""
        import pyarrow as pa

        types: dict[str, list] = {c: [] for c in self.columns}
        for paths in self.parts.values():
            for path in paths:
                with pa.memory_map(path) as source:
                    schema = pa.ipc.open_stream(source).schema
                for column in self.columns:
                    if schema.get_field_index(column) >= 0:
                        types[column].append(schema.field(column).type)
        fields = []
        for column, found in types.items():
            try:
                unified = pa.unify_schemas(
                    [pa.schema([pa.field(column, t)]) for t in found] or [pa.schema([pa.field(column, pa.null())])],
                    promote_options="permissive",
                )
            except _arrow_errors() as exc:
                raise self._type_error(column, exc) from None
            fields.append(unified.field(column))
        return pa.schema(fields + [pa.field(LOCATION, pa.string()), pa.field(DIGEST, pa.binary(32))])

    def _conform(self, table, schema):
        import pyarrow as pa

        columns = []
        for field in schema:
            if table.schema.get_field_index(field.name) < 0:
                columns.append(pa.nulls(table.num_rows, field.type))
                continue
            column = table.column(field.name)
            try:
                columns.append(column.cast(field.type) if column.type != field.type else column)
            except _arrow_errors() as exc:
                raise self._type_error(field.name, exc) from None
        return pa.Table.from_arrays(columns, schema=schema)

    def finish(self) -> dict:
        """``{split: memory-mapped Dataset}``; the part files are merged into one file per split."""
        import datasets
        import pyarrow as pa

        for split in self.buffers:
            self._flush(split)
        schema = self._schema()
        out = {}
        for split, paths in self.parts.items():
            path = os.path.join(self.directory, f"{split}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                for part in paths:
                    with pa.memory_map(part) as source:
                        writer.write_table(self._conform(pa.ipc.open_stream(source).read_all(), schema))
                    os.remove(part)
            out[split] = datasets.Dataset.from_file(path)
        return out


def fingerprint(fmt: str, splits: dict) -> str:
    """sha256 of the format and of every row of every split, in order (``splits``: name -> Dataset with
    the row digests of :data:`DIGEST`)."""
    h = hashlib.sha256(fmt.encode())
    for name, ds in splits.items():
        h.update(f"\0split:{name}\0".encode())
        digests = ds.select_columns([DIGEST]).with_format("arrow")
        for batch in digests.iter(batch_size=65536):
            h.update(b"".join(batch.column(DIGEST).to_pylist()))
    return h.hexdigest()
