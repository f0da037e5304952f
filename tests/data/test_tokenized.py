"""Tokenization through datasets.map: the same examples with any number of workers as row by row,
cached by content, tokenizer, max_length; prepare reuses its build from another output dir."""

import json
import logging

import pytest

from trainer_lib import cli
from trainer_lib.data.preference_batches import tokenize_pair
from trainer_lib.data.tokenize import is_trainable, tokenize_sft
from trainer_lib.data.tokenized import tokenize_split


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "data"


@pytest.fixture(scope="module")
def tokenizer():
    from trainer_lib.demo.tiny_model import train_tokenizer

    return train_tokenizer(["What is two plus two? Four. Five. Name a color. Blue. Say hello."] * 4, vocab_size=300)


def conv(*turns):
    return [{"role": role, "content": text} for role, text in turns]


def chat_rows(n: int) -> list[dict]:
    words = ["Four.", "Five.", "Blue.", "Say hello.", "What is two plus two?"]
    return [
        {
            "messages": conv(
                ("user", words[i % 5]),
                ("assistant", words[(i + 1) % 5] * (1 + i % 4)),
                ("user", words[(i + 2) % 5]),
                ("assistant", "" if i % 7 == 0 else words[i % 3]),
            )
        }
        for i in range(n)
    ]


def test_workers_give_the_examples_of_row_by_row_tokenization(tokenizer):
    import datasets

    rows = chat_rows(40) + [{"messages": conv(("user", "hi"), ("assistant", ""))}]  # nothing to learn: dropped
    ds = datasets.Dataset.from_list(rows)
    one = tokenize_split(ds, None, "sft", "messages", tokenizer, 24, num_workers=1).to_list()
    two = tokenize_split(ds, None, "sft", "messages", tokenizer, 24, num_workers=2).to_list()
    expected = [
        ex | {"length": len(ex["input_ids"])}
        for ex in (tokenize_sft(row, "messages", tokenizer, 24) for row in rows)
        if is_trainable(ex)
    ]
    assert one == two == expected and 20 < len(expected) < len(rows)
    assert max(ex["length"] for ex in one) == 24  # truncated to max_length

    pairs = datasets.Dataset.from_list(
        [
            {
                "prompt": f"What is two plus two? {i}",
                "chosen": " Four.",
                "rejected": " Five." * (i % 3 + 1),
                "margin": float(i) if i % 2 else None,
            }
            for i in range(20)
        ]
    )
    one = tokenize_split(pairs, None, "pairs", "preference", tokenizer, 16, num_workers=1).to_list()
    two = tokenize_split(pairs, None, "pairs", "preference", tokenizer, 16, num_workers=2).to_list()
    expected = [tokenize_pair(row, tokenizer, 16) for row in pairs]
    assert one == two == [{"margin": None} | ex for ex in expected]


def test_second_tokenization_is_a_cache_hit_and_any_change_misses(tokenizer, cache_dir, caplog):
    import datasets

    from trainer_lib.demo.tiny_model import train_tokenizer

    caplog.set_level(logging.INFO, logger="trainer_lib.data.cache")
    ds = datasets.Dataset.from_list(chat_rows(12))

    def entries():
        return sorted(p.name for p in cache_dir.iterdir() if p.name.startswith("tokenized-") and "." not in p.name)

    first = tokenize_split(ds, "content-1", "sft", "messages", tokenizer, 32).to_list()
    built = entries()
    assert len(built) == 1
    mtime = (cache_dir / built[0]).stat().st_mtime_ns
    caplog.clear()
    assert tokenize_split(ds, "content-1", "sft", "messages", tokenizer, 32, num_workers=2).to_list() == first
    assert "data cache: reusing" in caplog.text and entries() == built
    assert (cache_dir / built[0]).stat().st_mtime_ns == mtime  # untouched

    other_template = train_tokenizer(
        ["What is two plus two? Four. Five. Name a color. Blue. Say hello."] * 4, vocab_size=300
    )
    other_template.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tokenize_split(ds, "content-1", "sft", "messages", tokenizer, 16)  # max_length
    tokenize_split(ds, "content-2", "sft", "messages", tokenizer, 32)  # data
    tokenize_split(ds, "content-1", "sft", "messages", other_template, 32)  # tokenizer
    assert len(entries()) == 4


# --------------------------------------------------------------------------- prepare


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prepare_again_into_another_dir_reuses_the_build(tmp_path, tokenizer, cache_dir, capsys, caplog):
    import datasets

    caplog.set_level(logging.INFO, logger="trainer_lib.data.cache")
    model = tmp_path / "tok"
    tokenizer.save_pretrained(str(model))
    src = write_jsonl(tmp_path / "chat.jsonl", chat_rows(30) + chat_rows(2))  # 2 duplicates
    common = [f"data.path={src}", f"model.path={model}", "data.max_length=64", "data.eval_fraction=0.2"]
    assert cli.main(["prepare", *common, f"output_dir={tmp_path / 'a'}"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["dropped"]["duplicate"] == 2 and first["truncated"] > 0 and first["dropped"]["too_long"] == 0
    caplog.clear()
    assert cli.main(["prepare", *common, f"output_dir={tmp_path / 'b'}", "data.num_workers=2"]) == 0
    assert "data cache: reusing" in caplog.text and json.loads(capsys.readouterr().out) == first
    a, b = (datasets.load_from_disk(str(tmp_path / name)) for name in "ab")
    assert all(a[s].to_list() == b[s].to_list() for s in ("train", "eval"))


def test_prepare_with_two_workers_matches_one_and_keeps_row_locations(tmp_path, tokenizer, capsys, monkeypatch):
    import datasets

    model = tmp_path / "tok"
    tokenizer.save_pretrained(str(model))
    src = write_jsonl(tmp_path / "chat.jsonl", chat_rows(30))
    outs = []
    for workers in (1, 2):
        monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / f"cache{workers}"))
        out = tmp_path / f"out{workers}"
        assert (
            cli.main(
                [
                    "prepare",
                    f"data.path={src}",
                    f"model.path={model}",
                    "data.max_length=64",
                    "data.over_length=drop",
                    f"output_dir={out}",
                    f"data.num_workers={workers}",
                ]
            )
            == 0
        )
        outs.append((json.loads(capsys.readouterr().out), datasets.load_from_disk(str(out))["train"].to_list()))
    assert outs[0] == outs[1] and outs[0][0]["token_lengths"]["max"] <= 64 and outs[0][0]["dropped"]["too_long"] > 0

    # a row the chat template refuses, found by a worker process: the error names its line
    tokenizer = tokenizer.__class__.from_pretrained(str(model))
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('no system turns') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    tokenizer.save_pretrained(str(model))
    bad = write_jsonl(tmp_path / "bad.jsonl", chat_rows(30) + [{"messages": conv(("system", "s"), ("user", "u"))}])
    rc = cli.main(
        ["prepare", f"data.path={bad}", f"model.path={model}", f"output_dir={tmp_path / 'bad'}", "data.num_workers=2"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.endswith(
        f"error: {bad}:31: expected a conversation the tokenizer's chat template accepts (no system turns)\n"
    )
