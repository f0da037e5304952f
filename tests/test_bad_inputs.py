"""Bad inputs through the real CLI: exit code 2, one ``error:`` line naming where, nothing written.

Every case runs ``python -m trainer_lib.cli <stage> ...`` in a subprocess, as a user or a
pipeline component would. A case is its stage, the small files it writes, its arguments and
the words its error line must contain (the file and line and field, or the config key, or the
path). Most are data cases through ``posttrain prepare`` (no model); the model and reward cases
run the training stages on the tiny model and fail before the first step.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.conftest import clean_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def conv(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def parquet(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


MSG = {"messages": conv(("user", "q"), ("assistant", "a"))}
PROMPTS = jsonl(*({"prompt": conv(("user", f"question {i}"))} for i in range(4)))
WRONG_LENGTH_REWARD = "def reward(prompts, completions, **kw):\n    return [0.0] * (len(completions) - 1)\n"


@dataclass
class Case:
    id: str
    stage: str
    files: dict = field(default_factory=dict)  # name -> str | bytes | {"dir": ...}
    args: tuple = ()  # "{tmp}" and "{model}" are filled in
    expect: tuple = ()  # substrings of the error line
    data: str | None = "d.jsonl"  # data.path (None: not passed)
    logs: bool = False  # fails inside the loop: logs may exist, but no checkpoint or model


def prep(id, text, *expect, name="d.jsonl", args=()):
    return Case(id, "prepare", {name: text}, args, expect, data=name)


CASES = [
    # ---- encodings and file shapes
    prep("not_json", jsonl({"text": "a"}, "{not json"), "d.jsonl:2", "valid JSON"),
    prep("not_an_object", jsonl({"text": "a"}, "[1, 2]"), "d.jsonl:2", "a JSON object"),
    prep("invalid_utf8", b'{"text": "a"}\n{"text": "caf\xe9"}\n', "d.jsonl:2", "UTF-8"),
    prep("utf16", jsonl({"text": "a"}).encode("utf-16"), "d.jsonl", "UTF-16"),
    prep("invalid_utf8_json", b'[{"text": "a"},\n {"text": "\xff"}]', "d.json:2", "UTF-8", name="d.json"),
    prep("invalid_utf8_csv", b"text\nok\n\xfe\n", "d.csv:3", "UTF-8", name="d.csv"),
    prep("empty_file", "", "data.path", "d.jsonl", "no rows"),
    prep("json_not_a_list", '{"text": "a"}', "d.json", "JSON list of objects", name="d.json"),
    prep("unsupported_suffix", "text\n", "data.path", "d.xml", "unsupported file type", name="d.xml"),
    # ---- empty values
    prep("empty_strings", jsonl({"text": ""}, {"text": ""}), "data.path", "d.jsonl", "empty: 2"),
    prep(
        "whitespace_only",
        jsonl({"text": "  \n\t"}, {"prompt": " ", "completion": "x"}),
        "d.jsonl:2",
        "one format per file",
    ),
    prep(
        "whitespace_only_completions",
        jsonl({"prompt": "p", "completion": "  "}, {"prompt": "q", "completion": "\n"}),
        "data.path",
        "d.jsonl",
        "empty: 2",
    ),
    # ---- null and wrong-typed fields, every format
    prep("text_null", jsonl({"text": "a"}, {"text": None}), "d.jsonl:2", "field 'text'", "got null"),
    prep("text_int", jsonl({"text": 5}), "d.jsonl:1", "field 'text'", "expected string", "int 5"),
    prep("completion_null", jsonl({"prompt": "p", "completion": None}), "d.jsonl:1", "field 'completion'"),
    prep("prompt_list_of_ints", jsonl({"prompt": [1, 2], "completion": "c"}), "d.jsonl:1", "field 'prompt[0]'"),
    prep("messages_null", jsonl(MSG, {"messages": None}), "d.jsonl:2", "field 'messages'", "list of messages"),
    prep(
        "messages_content_int",
        jsonl({"messages": [{"role": "user", "content": 3}]}),
        "d.jsonl:1",
        "field 'messages[0].content'",
        "string",
    ),
    prep("messages_string", jsonl({"messages": "hello"}), "d.jsonl:1", "field 'messages'", "list of messages"),
    prep("chosen_int", jsonl({"prompt": "p", "chosen": 3, "rejected": "r"}), "d.jsonl:1", "field 'chosen'"),
    prep("rejected_null", jsonl({"prompt": "p", "chosen": "c", "rejected": None}), "d.jsonl:1", "field 'rejected'"),
    prep("label_not_bool", jsonl({"prompt": "p", "completion": "c", "label": "yes"}), "d.jsonl:1", "field 'label'"),
    prep(
        "unpaired_completion_int",
        jsonl({"prompt": "p", "completion": 7, "label": True}),
        "d.jsonl:1",
        "field 'completion'",
    ),
    prep("prompt_only_null", jsonl({"prompt": None}), "d.jsonl:1", "field 'prompt'"),
    prep("prompt_only_object", jsonl({"prompt": {"a": 1}}), "d.jsonl:1", "field 'prompt'"),
    # ---- columns
    prep("no_format_columns", jsonl({"query": "q", "response": "a"}), "d.jsonl:1", "columns of a known format"),
    prep("chosen_without_rejected", jsonl({"prompt": "p", "chosen": "c"}), "d.jsonl:1", "field 'rejected'"),
    prep("rejected_without_chosen", jsonl({"prompt": "p", "rejected": "r"}), "d.jsonl:1", "field 'chosen'"),
    prep(
        "later_row_misses_rejected",
        jsonl({"prompt": "p", "chosen": "c", "rejected": "r"}, {"prompt": "p", "chosen": "c2"}),
        "d.jsonl:2",
        "field 'rejected'",
    ),
    prep("mixed_formats", jsonl({"text": "a"}, MSG), "d.jsonl:2", "one format per file"),
    prep(
        "hh_rlhf_turns_do_not_alternate",
        jsonl(
            {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello.", "rejected": "\n\nHuman: Hi\n\nAssistant: Go away."},
            {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello.\n\nAssistant: Again.", "rejected": "\n\nHuman: Hi"},
        ),
        "d.jsonl:2",
        "field 'chosen'",
        "turn 3 is a second Assistant turn in a row",
    ),
    prep(
        "mixed_plain_and_conversational",
        jsonl(
            {"prompt": "p", "completion": "c"}, {"prompt": conv(("user", "p")), "completion": conv(("assistant", "c"))}
        ),
        "d.jsonl:2",
        "field 'prompt'",
        "plain text",
    ),
    prep(
        "chosen_equals_rejected",
        jsonl({"prompt": "p", "chosen": "same", "rejected": "same"}),
        "d.jsonl:1",
        "field 'rejected'",
        "different from 'chosen'",
    ),
    prep(
        "chosen_equals_rejected_conversation",
        jsonl({"chosen": conv(("user", "q"), ("assistant", "a")), "rejected": conv(("user", "q"), ("assistant", "a"))}),
        "d.jsonl:1",
        "field 'rejected'",
    ),
    prep(
        "unknown_role",
        jsonl({"messages": [{"role": "bot", "content": "hi"}]}),
        "d.jsonl:1",
        "field 'messages[0].role'",
        "'bot'",
    ),
    prep("empty_message_list", jsonl(MSG, {"messages": []}), "d.jsonl:2", "field 'messages'", "non-empty"),
    prep(
        "csv_missing_header",
        "hello there,general kenobi\nfoo,bar\n",
        "d.csv:2",
        "columns of a known format",
        name="d.csv",
    ),
    prep("csv_ragged_row", "prompt,completion\np,c\nonly one\n", "d.csv:3", "2 comma-separated fields", name="d.csv"),
    prep(
        "parquet_wrong_schema",
        parquet([{"id": 1, "score": 0.5}]),
        "d.parquet:row 0",
        "columns of a known format",
        name="d.parquet",
    ),
    prep("parquet_text_is_int", parquet([{"text": 1}]), "d.parquet:row 0", "field 'text'", name="d.parquet"),
    prep("parquet_corrupt", b"PAR1 this is not parquet", "d.parquet", "readable Parquet", name="d.parquet"),
    Case("saved_dir_bad_dict", "prepare", {"ds/dataset_dict.json": "{not json"}, (), ("data.path", "ds"), data="ds"),
    Case(
        "saved_dir_missing_arrow",
        "prepare",
        {"ds/state.json": json.dumps({"_data_files": [{"filename": "data.arrow"}]}), "ds/dataset_info.json": "{}"},
        (),
        ("data.path", "ds", "datasets"),
        data="ds",
    ),
    Case("dir_without_data", "prepare", {"ds/readme.md": "hi"}, (), ("data.path", "ds", "no .jsonl"), data="ds"),
    Case("data_path_missing", "prepare", {}, (), ("data.path", "nope.jsonl", "no such file"), data="nope.jsonl"),
    # ---- config
    prep("unknown_key", jsonl({"text": "a"}), "no_such_key", args=("no_such_key=1",)),
    prep("wrong_type", jsonl({"text": "a"}), "seed", args=("seed=abc",)),
    prep("bad_yaml", jsonl({"text": "a"}), "bad.yaml", args=("--config", "{tmp}/bad.yaml")),
    Case("sft_zero_steps", "sft", {"d.jsonl": jsonl(MSG)}, ("max_steps=0", "model.path={model}"), ("max_steps",)),
    Case("sft_negative_steps", "sft", {"d.jsonl": jsonl(MSG)}, ("max_steps=-3", "model.path={model}"), ("max_steps",)),
    Case("sft_lr_not_a_number", "sft", {"d.jsonl": jsonl(MSG)}, ("lr=fast", "model.path={model}"), ("lr",)),
    Case("sft_lr_nan", "sft", {"d.jsonl": jsonl(MSG)}, ("lr=nan", "model.path={model}"), ("lr",)),
    # ---- models
    Case(
        "model_path_missing",
        "sft",
        {"d.jsonl": jsonl(MSG)},
        ("model.path={tmp}/no_model",),
        ("model.path", "no_model", "does not exist"),
    ),
    Case(
        "prepare_model_path_missing",
        "prepare",
        {"d.jsonl": jsonl(MSG)},
        ("model.path={tmp}/no_model",),
        ("model.path", "no_model"),
    ),
    Case(
        "dir_not_a_model",
        "sft",
        {"d.jsonl": jsonl(MSG), "notmodel/readme.md": "hi"},
        ("model.path={tmp}/notmodel",),
        ("model.path", "notmodel"),
    ),
    Case(
        "tokenizer_only_dir",
        "sft",
        {"d.jsonl": jsonl(MSG), "tokonly": {"copy_model": "tokenizer"}},
        ("model.path={tmp}/tokonly", "max_steps=1"),
        ("model.path", "tokonly"),
    ),
    Case(
        "no_chat_template",
        "sft",
        {"d.jsonl": jsonl(MSG), "nochat": {"copy_model": "no_chat_template"}},
        ("model.path={tmp}/nochat", "max_steps=1"),
        ("model.path", "chat template"),
    ),
    Case(
        "sft_rows_too_long",
        "sft",
        {"d.jsonl": jsonl({"text": "a b c d e f g h i j k l m n o p " * 4})},
        ("model.path={model}", "data.max_length=8", "data.over_length=drop", "max_steps=1"),
        ("data.path", "d.jsonl", "too_long: 1"),
    ),
    Case(
        "prepare_rows_too_long",
        "prepare",
        {"d.jsonl": jsonl({"text": "a b c d e f g h i j k l m n o p " * 4})},
        ("model.path={model}", "data.max_length=8", "data.over_length=drop"),
        ("data.path", "d.jsonl", "too_long: 1"),
    ),
    Case(
        "dpo_gets_sft_data",
        "dpo",
        {"d.jsonl": jsonl(MSG)},
        ("model.path={model}", "max_steps=1"),
        ("data.path", "messages"),
    ),
    Case(
        "reward_gets_prompt_only",
        "reward",
        {"d.jsonl": PROMPTS},
        ("model.path={model}", "max_steps=1"),
        ("data.path", "prompt_only"),
    ),
    # ---- reward functions (GRPO)
    Case(
        "reward_module_missing",
        "grpo",
        {"d.jsonl": PROMPTS},
        ("model.path={model}", "reward.functions=no_such_module_xyz:reward", "max_steps=1"),
        ("reward.functions", "no_such_module_xyz"),
    ),
    Case(
        "reward_function_missing",
        "grpo",
        {"d.jsonl": PROMPTS, "rw.py": WRONG_LENGTH_REWARD},
        ("model.path={model}", "reward.functions={tmp}/rw.py:nothing_here", "max_steps=1"),
        ("reward.functions", "nothing_here"),
    ),
    Case(
        "reward_wrong_length",
        "grpo",
        {"d.jsonl": PROMPTS, "rw.py": WRONG_LENGTH_REWARD},
        (
            "model.path={model}",
            "reward.functions={tmp}/rw.py:reward",
            "max_steps=1",
            "rollout.n=2",
            "prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "batch_size=4",
        ),
        ("reward", "values"),
        logs=True,
    ),
]


def _copy_model(model: str, target: str, what: str) -> None:
    os.makedirs(target)
    for name in os.listdir(model):
        if what == "tokenizer" and not name.startswith(("tokenizer", "special_tokens", "chat_template")):
            continue
        if what == "no_chat_template" and name.startswith("chat_template"):
            continue
        shutil.copy(os.path.join(model, name), target)
    config = os.path.join(target, "tokenizer_config.json")
    if what == "no_chat_template" and os.path.exists(config):
        with open(config, encoding="utf-8") as fh:
            settings = json.load(fh)
        settings.pop("chat_template", None)
        with open(config, "w", encoding="utf-8") as fh:
            json.dump(settings, fh)


def _write_files(tmp, files: dict, model: str | None) -> None:
    for name, content in files.items():
        path = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(content, dict):
            _copy_model(model, path, content["copy_model"])
        elif isinstance(content, bytes):
            with open(path, "wb") as fh:
                fh.write(content)
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(content)


def run_cli(stage: str, args: list[str]) -> subprocess.CompletedProcess:
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", stage, *args], capture_output=True, text=True, env=env, timeout=300
    )


def assert_one_error_line(proc: subprocess.CompletedProcess, expect) -> str:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: "), err[-3000:]
    for word in expect:
        assert word in last, (word, last)
    return last


def needs_model(case: Case) -> bool:
    return any("{model}" in a for a in case.args) or any(isinstance(v, dict) for v in case.files.values())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, request):
    model = request.getfixturevalue("tiny_model_dir") if needs_model(case) else None
    tmp = str(tmp_path)
    files = dict(case.files)
    if case.id == "bad_yaml":
        files["bad.yaml"] = "data:\n  path: [unclosed\n"
    _write_files(tmp, files, model)
    out = tmp_path / "out"
    args = [a.format(tmp=tmp, model=model) for a in case.args]
    if case.data is not None:
        args.append(f"data.path={tmp}/{case.data}")
    args.append(f"output_dir={out}")
    if case.stage != "prepare":
        args += ["report_to=none", "save_steps=1", "logging_steps=1"]
    assert_one_error_line(run_cli(case.stage, args), case.expect)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []
    if case.logs:  # the logs of the failed run (metrics, the DeepSpeed config it got, its heartbeat saying it
        # failed); never a checkpoint or model
        if "heartbeat.json" in written:
            assert json.loads((out / "heartbeat.json").read_text())["state"] == "failed"
        written = [p for p in written if p not in ("metrics.jsonl", "ds_config.json", "heartbeat.json", "checkpoints")]
    assert not written, written
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temp dirs left


def test_utf8_bom_is_accepted(tmp_path):
    """A UTF-8 byte-order mark (what Windows tools write) is not an error, in JSONL, JSON and CSV."""
    import datasets

    for name, content in [
        ("d.jsonl", jsonl({"text": "a"}, {"text": "b"})),
        ("d.json", json.dumps([{"text": "a"}, {"text": "b"}])),
        ("d.csv", "text\na\nb\n"),
    ]:
        src = tmp_path / name
        src.write_bytes(b"\xef\xbb\xbf" + content.encode())
        out = tmp_path / f"out-{name}"
        proc = run_cli("prepare", [f"data.path={src}", f"output_dir={out}", "data.eval_fraction=0"])
        assert proc.returncode == 0, proc.stderr
        assert sorted(datasets.load_from_disk(str(out))["train"]["text"]) == ["a", "b"]


def test_over_length_rows_are_dropped_and_counted(tmp_path, tiny_model_dir):
    """With a tokenizer and ``data.over_length=drop``, ``prepare`` drops rows longer than data.max_length and
    counts them in stats.json (the default truncates them: tests/stages/lifecycle/test_prepare.py)."""
    src = tmp_path / "d.jsonl"
    src.write_text(jsonl({"text": "a b"}, {"text": "a b c d e f g h i j k l m n o p " * 4}))
    out = tmp_path / "out"
    proc = run_cli(
        "prepare",
        [
            f"data.path={src}",
            f"output_dir={out}",
            f"model.path={tiny_model_dir}",
            "data.max_length=8",
            "data.over_length=drop",
            "data.eval_fraction=0",
        ],
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["dropped"]["too_long"] == 1 and stats["rows"] == {"train": 1, "eval": 0}
