"""``posttrain prepare`` end to end (in-process CLI), filters, split, load_training_data."""

import json
from types import SimpleNamespace

import pytest

from trainer_lib import cli
from trainer_lib.data.dataset import load_training_data
from trainer_lib.errors import UserError


def conv(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run_prepare(capsys, *args):
    rc = cli.main(["prepare", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def data_cfg(path, **kw):
    base = dict(path=str(path), format="auto", eval_path=None, eval_fraction=0.0, max_length=512)
    return SimpleNamespace(**{**base, **kw})


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    """A word-level tokenizer (1 token per word/punctuation, no special tokens) + chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["one two three four five six seven user assistant : hi"],
        trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"]),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    path = tmp_path_factory.mktemp("tok") / "model"
    fast.save_pretrained(str(path))
    return path


# --------------------------------------------------------------------------- happy path


def test_prepare_cli_writes_dataset_and_stats(tmp_path, capsys):
    import datasets

    rows = [{"messages": conv(("user", f"q{i}"), ("assistant", f"a{i}")), "task_id": i} for i in range(8)]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = tmp_path / "prepared"
    rc, stdout, err = run_prepare(capsys, f"data.path={src}", f"output_dir={out}", "data.eval_fraction=0.25", "seed=3")
    assert rc == 0, err
    stats = json.loads((out / "stats.json").read_text())
    assert json.loads(stdout) == stats
    assert stats["format"] == "messages" and stats["conversational"] is True
    assert stats["source"] == str(src) and stats["seed"] == 3
    assert stats["rows_read"] == 8 and stats["rows"] == {"train": 6, "eval": 2}
    assert stats["dropped"] == {"empty": 0, "duplicate": 0, "too_long": 0}
    assert stats["token_lengths"] is None and len(stats["fingerprint"]) == 64
    dd = datasets.load_from_disk(str(out))
    assert set(dd) == {"train", "eval"}
    assert sorted(list(dd["train"]["task_id"]) + list(dd["eval"]["task_id"])) == list(range(8))
    assert dd["train"][0]["messages"] == rows[dd["train"][0]["task_id"]]["messages"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "prepared"]  # no temp dirs


def test_prepare_main_and_rerun_replaces_output(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": "b"}])
    out = tmp_path / "out"
    assert cli.main(["prepare", f"data.path={src}", f"output_dir={out}"]) == 0
    src2 = write_jsonl(tmp_path / "d2.jsonl", [{"prompt": "p"}])
    assert cli.main(["prepare", f"data.path={src2}", f"output_dir={out}"]) == 0
    assert json.loads((out / "stats.json").read_text())["format"] == "prompt_only"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "d2.jsonl", "out"]
    capsys.readouterr()


def test_refuses_to_overwrite_unrelated_dir(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    out = tmp_path / "home"
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={out}")
    assert rc == 2 and "is not a prepared dataset; refusing to overwrite it" in err
    assert [p.name for p in out.iterdir()] == ["precious.txt"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["output_dir=x"],
            "error: data.path: required, expected a dataset path (or data.dataset: names in dataset_info.json)\n",
        ),
        (["data.path=x.jsonl"], "error: output_dir: required, expected a local path or URL (s3://, gs://...)\n"),
        (
            ["data.path=x.jsonl", "output_dir=x", "data.format=chat"],
            "error: data.format: expected one of ['auto', 'text', 'prompt_completion', 'messages', "
            "'preference', 'unpaired_preference', 'prompt_only', 'alpaca', 'sharegpt', 'hh_rlhf', 'gsm8k', "
            "'mbpp'], got 'chat'\n",
        ),
        (["data.path=x.jsonl", "output_dir=x", "max_rows=-1"], "error: max_rows: expected >= 0, got -1\n"),
    ],
)
def test_config_errors(capsys, args, message):
    rc, _, err = run_prepare(capsys, *args)
    assert (rc, err) == (2, message)


# --------------------------------------------------------------------------- errors


GOOD_PREF = {"prompt": "p", "chosen": "c", "rejected": "r"}
GOOD_MSG = {"messages": conv(("user", "u"), ("assistant", "a"))}


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            [GOOD_PREF, {"prompt": "p", "chosen": None, "rejected": "r"}],
            "{src}:2: field 'chosen': expected string, got null",
        ),
        (
            [GOOD_PREF, GOOD_PREF, '{"prompt": "p", "chosen": "c", "rejected": }'],
            "{src}:3: expected valid JSON (Expecting value at column 44)",
        ),
        (
            [GOOD_MSG] * 6 + [{"text": "hello"}],
            "{src}:7: expected a 'messages' row like {src}:1 (one format per file), got a 'text' row with columns text",
        ),
        (
            [{"prompt": "p", "completion": "c", "label": True}, {"prompt": "p", "completion": "c", "label": "yes"}],
            "{src}:2: field 'label': expected bool (true/false or 0/1), got str 'yes'",
        ),
        (
            [{**GOOD_PREF, "margin": 1}, {**GOOD_PREF, "margin": "high"}],
            "{src}:2: field 'margin': expected number like {src}:1 (one type per column), got str 'high'",
        ),
        (
            [
                {"prompt": conv(("user", "q")), "completion": conv(("assistant", "a"))},
                {"prompt": "q", "completion": "a"},
            ],
            "{src}:2: field 'prompt': expected list of messages (rows are conversations like {src}:1), got str 'q'",
        ),
        (
            [{"messages": conv(("user", "u"), ("robot", "a"))}],
            "{src}:1: field 'messages[1].role': expected one of system, user, assistant, tool, got str 'robot'",
        ),
        (
            [{"query": "q", "response": "a"}],
            "{src}:1: expected the columns of a known format: text | prompt+completion | messages | "
            "prompt+chosen+rejected (or chosen+rejected) | prompt+completion+label | prompt | "
            "instruction+output (alpaca) | conversations (sharegpt) | question+answer (gsm8k) | "
            "text+code+test_list (mbpp), got list ['query', 'response']",
        ),
        (
            [{"chosen": "yes", "rejected": "no"}],
            "{src}:1: field 'rejected': expected to start with the same prompt as 'chosen' (no 'prompt' "
            "column, so the prompt is their common prefix), got str 'no'",
        ),
    ],
)
def test_bad_rows_exit_2_without_output(tmp_path, capsys, lines, message):
    src = write_jsonl(tmp_path / "data.jsonl", lines)
    out = tmp_path / "out"
    rc, stdout, err = run_prepare(capsys, f"data.path={src}", f"output_dir={out}")
    assert rc == 2
    assert err == "error: " + message.format(src=src) + "\n"
    assert stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_parquet_error_names_row_index(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD_PREF, GOOD_PREF, {"prompt": "p", "chosen": "c", "rejected": None}]), src)
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={tmp_path / 'out'}")
    assert (rc, err) == (2, f"error: {src}:row 2: field 'rejected': expected string, got null\n")
    assert not (tmp_path / "out").exists()


def test_forced_format(tmp_path, capsys):
    src = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "p1", "completion": "c1"}, {"prompt": "p2", "completion": "c2"}]
    )
    out = tmp_path / "out"
    rc, stdout, _ = run_prepare(capsys, f"data.path={src}", f"output_dir={out}", "data.format=prompt_only")
    assert rc == 0 and json.loads(stdout)["format"] == "prompt_only"
    dd, fmt = load_training_data(data_cfg(out), seed=0)  # the forced format survives reloading
    assert fmt == "prompt_only" and dd["train"].column_names == ["prompt", "completion"]
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={tmp_path / 'o2'}", "data.format=text")
    assert (rc, err) == (2, f"error: {src}:1: field 'text': expected string, got null\n")


# --------------------------------------------------------------------------- filters


def test_filters_are_counted(tmp_path, capsys, tiny_tokenizer):
    rows = [
        {"text": "one two"},
        {"text": ""},
        {"text": " \n "},
        {"text": "one two"},
        {"text": "one two three"},
        {"text": "one two three four five six"},
        {"text": "one two three", "kind": "dup"},
        {"text": "four"},
    ]
    src = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out"
    rc, stdout, err = run_prepare(
        capsys,
        f"data.path={src}",
        f"output_dir={out}",
        "data.eval_fraction=0",
        f"model.path={tiny_tokenizer}",
        "data.max_length=5",
        "data.over_length=drop",
    )
    assert rc == 0, err
    stats = json.loads(stdout)
    assert stats["dropped"] == {"empty": 2, "duplicate": 2, "too_long": 1} and stats["truncated"] == 0
    assert stats["rows_read"] == 8 and stats["rows"] == {"train": 3, "eval": 0}
    assert stats["token_lengths"] == {"min": 1, "mean": 2.0, "max": 3}
    assert stats["max_length"] == 5 and stats["tokenizer"] == str(tiny_tokenizer)
    import datasets

    prepared = datasets.load_from_disk(str(out))
    assert list(prepared["train"]["text"]) == ["one two", "one two three", "four"]
    assert len(prepared["eval"]) == 0 and prepared["eval"].features == prepared["train"].features

    # by default an over-length row is kept, counted, and left for training to truncate
    args = [f"data.path={src}", f"output_dir={tmp_path / 'o1'}", "data.eval_fraction=0", f"model.path={tiny_tokenizer}"]
    rc, stdout, err = run_prepare(capsys, *args, "data.max_length=5")
    stats = json.loads(stdout)
    assert stats["dropped"] == {"empty": 2, "duplicate": 2, "too_long": 0} and stats["truncated"] == 1
    assert stats["rows"]["train"] == 4 and stats["token_lengths"]["max"] == 6
    assert "data: 1 rows longer than data.max_length=5 tokens are truncated to it when tokenized" in err
    assert "data: 2 exact duplicate rows dropped (to keep them: posttrain prepare drop_duplicates=false" in err
    assert "data: 2 rows with an empty text field dropped" in err

    # without a model no length filter; the filters can be switched off
    rc, stdout, err = run_prepare(
        capsys,
        f"data.path={src}",
        f"output_dir={tmp_path / 'o2'}",
        "drop_empty=false",
        "drop_duplicates=false",
        "data.eval_fraction=0",
    )
    stats = json.loads(stdout)
    assert stats["dropped"] == {"empty": 0, "duplicate": 0, "too_long": 0} and stats["rows"]["train"] == 8
    assert stats["token_lengths"] is None and "dropped" not in err


def test_length_of_conversations_uses_chat_template(tmp_path, capsys, tiny_tokenizer):
    # "user: hi\nassistant: one two\n" -> user : hi assistant : one two = 7 tokens
    short = {"messages": conv(("user", "hi"), ("assistant", "one two"))}
    long = {"messages": conv(("user", "hi"), ("assistant", "one two three four"))}  # 9 tokens
    pref = {
        "prompt": conv(("user", "hi")),
        "chosen": conv(("assistant", "one")),
        "rejected": conv(("assistant", "one two three")),
    }  # max(6, 8)
    src = write_jsonl(tmp_path / "m.jsonl", [short, long])
    rc, stdout, err = run_prepare(
        capsys,
        f"data.path={src}",
        f"output_dir={tmp_path / 'o'}",
        f"model.path={tiny_tokenizer}",
        "data.max_length=8",
        "data.over_length=drop",
        "data.eval_fraction=0",
    )
    assert rc == 0, err
    stats = json.loads(stdout)
    assert stats["dropped"]["too_long"] == 1 and stats["token_lengths"] == {"min": 7, "mean": 7.0, "max": 7}
    src = write_jsonl(tmp_path / "p.jsonl", [pref])
    rc, stdout, err = run_prepare(
        capsys,
        f"data.path={src}",
        f"output_dir={tmp_path / 'o2'}",
        f"model.path={tiny_tokenizer}",
        "data.eval_fraction=0",
    )
    assert rc == 0, err
    assert json.loads(stdout)["token_lengths"]["max"] == 8


def test_max_rows(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": f"t{i}"} for i in range(10)] + ["{broken"])
    rc, stdout, err = run_prepare(
        capsys, f"data.path={src}", f"output_dir={tmp_path / 'o'}", "max_rows=4", "data.eval_fraction=0.5"
    )
    assert rc == 0, err
    assert json.loads(stdout)["rows"] == {"train": 2, "eval": 2}


# --------------------------------------------------------------------------- split


def _eval_texts(tmp_path, capsys, src, seed, name):
    import datasets

    out = tmp_path / name
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={out}", "data.eval_fraction=0.2", f"seed={seed}")
    assert rc == 0, err
    dd = datasets.load_from_disk(str(out))
    return list(dd["train"]["text"]), list(dd["eval"]["text"])


def test_split_is_deterministic_by_seed(tmp_path, capsys):
    texts = [f"row {i}" for i in range(20)]
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    train_a, eval_a = _eval_texts(tmp_path, capsys, src, 0, "a")
    train_b, eval_b = _eval_texts(tmp_path, capsys, src, 0, "b")
    train_c, eval_c = _eval_texts(tmp_path, capsys, src, 1, "c")
    assert (train_a, eval_a) == (train_b, eval_b)
    assert eval_a != eval_c
    assert len(eval_a) == len(eval_c) == 4
    assert sorted(train_a + eval_a) == sorted(texts)
    assert train_a == [t for t in texts if t not in eval_a]  # original order kept
    a = json.loads((tmp_path / "a" / "stats.json").read_text())
    b = json.loads((tmp_path / "b" / "stats.json").read_text())
    c = json.loads((tmp_path / "c" / "stats.json").read_text())
    assert a["fingerprint"] == b["fingerprint"] != c["fingerprint"]


@pytest.mark.parametrize(
    "n, fraction, expected", [(2, 0.01, (1, 1)), (1, 0.5, (1, 0)), (5, 0.0, (5, 0)), (3, 0.9, (1, 2))]
)
def test_split_sizes(n, fraction, expected):
    from trainer_lib.data.dataset import split_indices

    train, evl = split_indices(n, fraction, seed=0)
    assert (len(train), len(evl)) == expected
    assert sorted(train + evl) == list(range(n))


def test_eval_path_replaces_split(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": f"t{i}"} for i in range(5)])
    ev = write_jsonl(tmp_path / "e.jsonl", [{"text": "e0"}, {"text": "e1"}, {"text": "e0"}])
    rc, stdout, err = run_prepare(
        capsys, f"data.path={src}", f"output_dir={tmp_path / 'o'}", f"data.eval_path={ev}", "data.eval_fraction=0.5"
    )
    assert rc == 0, err
    stats = json.loads(stdout)
    assert stats["rows"] == {"train": 5, "eval": 2} and stats["eval_source"] == str(ev)
    assert stats["rows_read"] == 8 and stats["dropped"]["duplicate"] == 1
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": "c"}])
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={tmp_path / 'o2'}", f"data.eval_path={bad}")
    assert rc == 2 and err.startswith(f"error: {bad}:1: expected a 'text' row like {src}:1")


# --------------------------------------------------------------------------- load_training_data


def test_load_training_data_prepared_and_raw_agree(tmp_path, capsys):
    rows = [
        {
            "chosen": conv(("user", f"q{i}"), ("assistant", "good")),
            "rejected": conv(("user", f"q{i}"), ("assistant", "bad")),
            "margin": float(i),
        }
        for i in range(10)
    ]
    src = write_jsonl(tmp_path / "pref.jsonl", rows)
    out = tmp_path / "prepared"
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={out}", "data.eval_fraction=0.3", "seed=7")
    assert rc == 0, err
    prepared, fmt_a = load_training_data(data_cfg(out, eval_fraction=0.3), seed=7)
    raw, fmt_b = load_training_data(data_cfg(src, eval_fraction=0.3), seed=7)
    assert fmt_a == fmt_b == "preference"
    for split in ("train", "eval"):
        assert prepared[split].to_list() == raw[split].to_list()
    assert len(raw["eval"]) == 3
    assert raw["train"][0]["prompt"] == conv(("user", "q0"))
    assert raw["train"][0]["chosen"] == conv(("assistant", "good"))

    allowed = ("text", "prompt_completion", "messages")
    for path in (out, src):
        with pytest.raises(UserError) as exc:
            load_training_data(data_cfg(path), seed=0, allowed_formats=allowed, stage="SFT")
        assert str(exc.value) == "data.path: SFT needs one of text, prompt_completion, messages; got preference"
    with pytest.raises(UserError, match="^data.path: this stage needs one of text; got preference$"):
        load_training_data(data_cfg(src), seed=0, allowed_formats=("text",))
    dd, fmt = load_training_data(data_cfg(out), seed=0, allowed_formats=("preference",))
    assert fmt == "preference"


def test_a_prepared_dataset_honours_split_eval_split_and_max_rows(tmp_path, capsys):
    """A judge trained on a prepared dataset's eval half and measured on its train half (data.split=eval
    data.eval_split=train), each cut to data.max_rows, as the DPO recipe's judge is; a split the dataset
    lacks is named."""
    rows = [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad"} for i in range(20)]
    src = write_jsonl(tmp_path / "pref.jsonl", rows)
    out = tmp_path / "prepared"
    rc, _, err = run_prepare(capsys, f"data.path={src}", f"output_dir={out}", "data.eval_fraction=0.5", "seed=1")
    assert rc == 0, err
    whole, _ = load_training_data(data_cfg(out, split="", eval_split="", max_rows=0), seed=0)
    swapped, _ = load_training_data(data_cfg(out, split="eval", eval_split="train", max_rows=0), seed=0)
    assert (
        swapped["train"].to_list() == whole["eval"].to_list() and swapped["eval"].to_list() == whole["train"].to_list()
    )
    cut, _ = load_training_data(data_cfg(out, split="eval", eval_split="train", max_rows=4), seed=0)
    assert (
        cut["train"].to_list() == whole["eval"].to_list()[:4] and cut["eval"].to_list() == whole["train"].to_list()[:4]
    )
    from trainer_lib.data.dataset import training_data

    prints = [
        training_data(data_cfg(out, split=a, eval_split=b, max_rows=m), seed=0).fingerprints["train"]
        for a, b, m in (("", "", 0), ("eval", "train", 0), ("eval", "train", 4))
    ]
    assert len(set(prints)) == 3  # nothing tokenized for one selection is reused for another
    with pytest.raises(UserError, match="data.split: .* has no split 'test'"):
        load_training_data(data_cfg(out, split="test", eval_split="", max_rows=0), seed=0)


def test_prepare_a_prepared_dir_keeps_its_split(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(6)])
    rc, first, err = run_prepare(
        capsys, f"data.path={src}", f"output_dir={tmp_path / 'a'}", "data.eval_fraction=0.5", "data.format=prompt_only"
    )
    assert rc == 0, err
    rc, second, err = run_prepare(capsys, f"data.path={tmp_path / 'a'}", f"output_dir={tmp_path / 'b'}", "seed=5")
    assert rc == 0, err
    first, second = json.loads(first), json.loads(second)
    assert second["format"] == "prompt_only" and second["eval_source"] == f"{tmp_path / 'a'}[eval]"
    assert second["fingerprint"] == first["fingerprint"] and second["rows"] == first["rows"]


def test_load_training_data_prepared_with_eval_path(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": f"t{i}"} for i in range(4)])
    out = tmp_path / "prepared"
    assert run_prepare(capsys, f"data.path={src}", f"output_dir={out}", "data.eval_fraction=0")[0] == 0
    ev = write_jsonl(tmp_path / "e.jsonl", [{"text": "e0"}, {"text": " "}])
    dd, fmt = load_training_data(data_cfg(out, eval_path=str(ev)), seed=0)
    assert list(dd["train"]["text"]) == ["t0", "t1", "t2", "t3"] and list(dd["eval"]["text"]) == ["e0"]
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}])
    dd, _ = load_training_data(data_cfg(out, eval_path=str(empty)), seed=0)
    assert len(dd["eval"]) == 0 and dd["eval"].features == dd["train"].features


def test_prepare_s3_round_trip(tmp_path, capsys, s3_bucket):
    from trainer_lib import storage

    local = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(6)])
    storage.upload_file(str(local), f"s3://{s3_bucket}/raw/d.jsonl")
    out = f"s3://{s3_bucket}/prepared/run1"
    rc, stdout, err = run_prepare(
        capsys, f"data.path=s3://{s3_bucket}/raw/d.jsonl", f"output_dir={out}", "data.eval_fraction=0.5"
    )
    assert rc == 0, err
    assert json.loads(stdout)["rows"] == {"train": 3, "eval": 3}
    dd, fmt = load_training_data(data_cfg(out), seed=0)
    raw, _ = load_training_data(data_cfg(local, eval_fraction=0.5), seed=0)
    assert fmt == "prompt_completion" and dd["train"].to_list() == raw["train"].to_list()
    # a bad row on s3 names the s3 location
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": None}])
    storage.upload_file(str(bad), f"s3://{s3_bucket}/raw/bad.jsonl")
    rc, _, err = run_prepare(
        capsys, f"data.path=s3://{s3_bucket}/raw/bad.jsonl", f"output_dir=s3://{s3_bucket}/prepared/run2"
    )
    assert (rc, err) == (2, f"error: s3://{s3_bucket}/raw/bad.jsonl:1: field 'completion': expected string, got null\n")
    assert not storage.exists(f"s3://{s3_bucket}/prepared/run2")
