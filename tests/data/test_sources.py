"""Every source type yields the same rows, with FILE:LINE / FILE:row N locations."""

import csv
import json
from types import SimpleNamespace

import pytest

from trainer_lib.data.dataset import build_dataset
from trainer_lib.data.sources import iter_source, open_source
from trainer_lib.errors import DataError, UserError

ROWS = [
    {
        "prompt": "def add(a, b):",
        "completion": " return a + b",
        "label": True,
        "margin": 0.5,
        "task_id": 1,
        "tests": "assert add(1, 2) == 3",
    },
    {
        "prompt": "def sub(a, b):",
        "completion": " return a + b",
        "label": False,
        "margin": 1.25,
        "task_id": 2,
        "tests": "assert sub(3, 2) == 1",
    },
    {
        "prompt": "Say hi, with a comma",
        "completion": 'hi, "you"\nbye',
        "label": True,
        "margin": 2.0,
        "task_id": 3,
        "tests": "",
    },
]


def data_cfg(path, **kw):
    base = dict(path=str(path), format="auto", eval_path=None, eval_fraction=0.0, max_length=512)
    return SimpleNamespace(**{**base, **kw})


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_all(tmp_path, rows):
    """The same rows as every supported source type."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {"jsonl": write_jsonl(tmp_path / "d.jsonl", rows)}
    paths["json"] = tmp_path / "d.json"
    paths["json"].write_text(json.dumps(rows, indent=2))
    paths["json_data"] = tmp_path / "d_data.json"
    paths["json_data"].write_text(json.dumps({"version": 1, "data": rows}))
    paths["parquet"] = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"])
    paths["csv"] = tmp_path / "d.csv"
    with open(paths["csv"], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    paths["saved_dataset"] = tmp_path / "saved_ds"
    datasets.Dataset.from_list(rows).save_to_disk(str(paths["saved_dataset"]))
    paths["saved_dict"] = tmp_path / "saved_dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(paths["saved_dict"]))
    paths["dir"] = tmp_path / "shards"
    paths["dir"].mkdir()
    write_jsonl(paths["dir"] / "a.jsonl", rows[:2])
    write_jsonl(paths["dir"] / "b.jsonl", rows[2:])
    return paths


def test_every_source_reads_the_same_rows(tmp_path):
    paths = write_all(tmp_path, ROWS)
    fingerprints = set()
    for kind, path in paths.items():
        rows = [row for _, row in iter_source(str(path))]
        assert rows == ROWS, kind
        dd, stats = build_dataset(data_cfg(path), seed=0)
        assert stats["format"] == "unpaired_preference"
        assert dd["train"].to_list() == ROWS, kind
        fingerprints.add(stats["fingerprint"])
    assert len(fingerprints) == 1


def test_locations(tmp_path):
    paths = write_all(tmp_path, ROWS)

    def locs(kind):
        return [loc for loc, _ in iter_source(str(paths[kind]))]

    jsonl = str(paths["jsonl"])
    assert locs("jsonl") == [f"{jsonl}:1", f"{jsonl}:2", f"{jsonl}:3"]
    js = str(paths["json"])  # indent=2: each object starts on its own line
    starts = [i + 1 for i, line in enumerate(paths["json"].read_text().splitlines()) if line == "  {"]
    assert locs("json") == [f"{js}:{n}" for n in starts]
    csv_path = str(paths["csv"])  # header is line 1; row 3 has a quoted newline
    assert locs("csv") == [f"{csv_path}:2", f"{csv_path}:3", f"{csv_path}:4"]
    pq_path = str(paths["parquet"])
    assert locs("parquet") == [f"{pq_path}:row 0", f"{pq_path}:row 1", f"{pq_path}:row 2"]
    saved = str(paths["saved_dict"])
    assert locs("saved_dict")[2] == f"{saved}[train]:row 2"
    assert locs("saved_dataset")[0] == f"{paths['saved_dataset']}:row 0"
    assert locs("dir")[2] == f"{paths['dir'] / 'b.jsonl'}:1"


def test_blank_lines_and_bom_in_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('\ufeff{"text": "a"}\n\n   \n{"text": "b"}\n')
    assert list(iter_source(str(path))) == [(f"{path}:1", {"text": "a"}), (f"{path}:4", {"text": "b"})]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "a"}\n{"text": "b"}\n{"text": }\n', "3: expected valid JSON (Expecting value at column 10)"),
        ('{"text": "a"}\n{"text": "b"\n', "2: expected valid JSON (Expecting ',' delimiter at column 13)"),
        ('{"text": "a"}\n[1, 2]\n', "2: expected a JSON object, got list [1, 2]"),
    ],
)
def test_invalid_jsonl(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError) as exc:
        list(iter_source(str(path)))
    assert str(exc.value) == f"{path}:{message}"


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '[\n  {"text": "a"},\n  {"text": "b"}\n  {"text": "c"}\n]',
            ":4: expected valid JSON (Expecting ',' delimiter at column 3)",
        ),
        ('[\n  {"text": "a"},\n  "b"\n]', ":3: expected a JSON object, got str 'b'"),
        ('{"rows": []}', ': expected a JSON list of objects or {"data": [...]} (no "data" list found)'),
        ('"text"', ": expected a JSON list of objects or {\"data\": [...]}, got str 'text'"),
        ('[{"text": "a"}] x', ":1: expected valid JSON (Extra data at column 17)"),
    ],
)
def test_invalid_json(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError) as exc:
        list(iter_source(str(path)))
    assert str(exc.value) == f"{path}{message}"


def test_csv_conversations_and_typing(tmp_path):
    path = tmp_path / "c.csv"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["messages", "score", "flag", "note"])
        w.writerow([json.dumps(msgs), "1", "TRUE", "007"])
        w.writerow([json.dumps(msgs[:1]), "", "false", "x"])
    rows = [r for _, r in iter_source(str(path))]
    assert rows == [
        {"messages": msgs, "score": 1, "flag": True, "note": "007"},
        {"messages": msgs[:1], "score": None, "flag": False, "note": "x"},
    ]


def test_csv_field_count_error(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("text,kind\na,b\nc\n")
    with pytest.raises(DataError) as exc:
        list(iter_source(str(path)))
    assert str(exc.value) == f"{path}:3: expected 2 comma-separated fields like the header, got 1"


def test_dataset_dict_eval_split_is_used(tmp_path):
    import datasets

    path = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([{"text": f"t{i}"} for i in range(5)]),
            "validation": datasets.Dataset.from_list([{"text": "v0"}]),
        }
    ).save_to_disk(str(path))
    src = open_source(str(path))
    assert (src.kind, src.train_split, src.eval_split) == ("saved", "train", "validation")
    dd, stats = build_dataset(data_cfg(path, eval_fraction=0.5), seed=0)
    assert list(dd["eval"]["text"]) == ["v0"] and len(dd["train"]) == 5
    assert stats["eval_source"] == f"{path}[validation]"


def test_missing_and_unsupported_paths(tmp_path):
    with pytest.raises(UserError, match=r"data.path: .*/nope.jsonl: no such file or directory"):
        open_source(str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.xml").write_text("hi")
    with pytest.raises(UserError, match="unsupported file type"):
        open_source(str(tmp_path / "x.xml"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="directory has no"):
        open_source(str(tmp_path / "empty"), key="data.eval_path")


def test_directory_of_split_files_keeps_its_eval_split(tmp_path):
    """HF's data-files layout: train.jsonl + eval.jsonl is a two-split source, not one concatenation."""
    import json

    from trainer_lib.config import DataConfig
    from trainer_lib.data.dataset import build_dataset
    from trainer_lib.data.sources import open_source

    folder = tmp_path / "prefs"
    folder.mkdir()
    for split, n in (("train", 6), ("eval", 2)):
        with open(folder / f"{split}.jsonl", "w") as fh:
            for i in range(n):
                fh.write(json.dumps({"prompt": f"{split} q{i}", "chosen": "yes", "rejected": "no"}) + "\n")
    source = open_source(str(folder))
    assert source.splits == ["eval", "train"] and source.eval_split == "eval"
    dd, stats = build_dataset(DataConfig(path=str(folder)), seed=0)
    assert sorted(dd["eval"]["prompt"]) == ["eval q0", "eval q1"]
    assert len(dd["train"]) == 6 and stats["rows"] == {"train": 6, "eval": 2}
