"""Tests for the bundled demo data generator (trainer_lib.demo: the code tasks, the safety prompts, the writer)."""

import dataclasses
import hashlib
import json
import os
import re

import pytest

from trainer_lib.config import has_key
from trainer_lib.demo import code_tasks, generator
from trainer_lib.demo.code_families import FAMILIES
from trainer_lib.demo.demo_data import DemoDataConfig
from trainer_lib.demo.demo_spec import DemoSpec
from trainer_lib.demo.generator import generate_demo_data
from trainer_lib.demo.safety_prompts import BENIGN, HARMFUL, safety_rows
from trainer_lib.errors import ConfigError
from trainer_lib.rewards.refusal_rules import is_refusal
from trainer_lib.runner.stage_api import run_stage

SMALL = dict(n_code_train=200, n_code_eval=40, n_safety_train=60, n_safety_eval=20)


def _spec(**settings) -> DemoSpec:
    return DemoSpec(**SMALL, **settings)


FILES = [
    "sft.jsonl",
    "preferences.jsonl",
    "preferences_eval.jsonl",
    "code_tasks.jsonl",
    "rl_prompts.jsonl",
    "code_tasks_eval.jsonl",
    "safety_eval.jsonl",
    "corpus.txt",
    "manifest.json",
]


def _read(d, name):
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _passes(code, tests):
    ns = {}
    try:
        exec(code, ns)
        for t in tests:
            exec(t, ns)
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("demo"))
    manifest = generate_demo_data(d, _spec(seed=0))
    return d, manifest


def _bytes(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in FILES}


def test_the_stage_config_is_the_spec_plus_where_the_files_go(out, tmp_path):
    spec_keys = [f.name for f in dataclasses.fields(DemoSpec)]
    assert [f.name for f in dataclasses.fields(DemoDataConfig)] == spec_keys + ["output_dir", "storage"]
    assert all(has_key(DemoDataConfig, key) for key in spec_keys)  # flat keys, no "spec." section
    manifest = run_stage("demo-data", [*(f"{k}={v}" for k, v in SMALL.items()), f"output_dir={tmp_path}"])
    assert manifest == out[1] and _bytes(str(tmp_path)) == _bytes(out[0])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"n_code_eval": 0}, "n_code_eval: expected a positive integer, got 0"),
        ({"n_code_pairs": -1}, "n_code_pairs: expected >= 0, got -1"),
        ({"sft_topics": 1.5}, "sft_topics: expected a share between 0 and 1, got 1.5"),
    ],
)
def test_the_spec_names_a_setting_out_of_range(settings, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        DemoSpec(**settings).validate()
    with pytest.raises(ConfigError, match="^output_dir: required$"):
        DemoDataConfig(**settings).validate()


def test_files_written_atomically(out):
    d, _ = out
    assert sorted(os.listdir(d)) == sorted(FILES)  # no leftover temp files


def test_same_seed_is_byte_identical_other_seed_differs(out, tmp_path):
    d, _ = out
    generate_demo_data(str(tmp_path / "same"), _spec(seed=0))
    generate_demo_data(str(tmp_path / "other"), _spec(seed=1))
    first, same, other = _bytes(d), _bytes(str(tmp_path / "same")), _bytes(str(tmp_path / "other"))
    assert first == same
    for name in FILES:
        assert first[name] != other[name], name


def test_counts_and_manifest(out):
    d, m = out
    assert m == json.load(open(os.path.join(d, "manifest.json")))
    assert m["seed"] == 0
    assert len(_read(d, "code_tasks.jsonl")) == m["counts"]["code_train"] == 200
    assert len(_read(d, "code_tasks_eval.jsonl")) == m["counts"]["code_eval"] == 40
    assert len(_read(d, "safety_eval.jsonl")) == m["counts"]["safety_eval"] == 20
    assert len(_read(d, "sft.jsonl")) == 200 + 100  # n_safety_sft's default
    assert len(_read(d, "preferences.jsonl")) == 200 + 60
    assert len(_read(d, "preferences_eval.jsonl")) == 40 + 20
    for name in FILES[:-1]:
        data = open(os.path.join(d, name), "rb").read()
        assert m["sha256"][name] == hashlib.sha256(data).hexdigest(), name
    assert sum(m["code_families_train"].values()) == 200 and sum(m["code_families_eval"].values()) == 40


def test_formats(out):
    d, _ = out
    for r in _read(d, "sft.jsonl"):
        assert list(r) == ["messages"]
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"]
        assert all(isinstance(m["content"], str) and m["content"] for m in r["messages"])
    for name in ("preferences.jsonl", "preferences_eval.jsonl"):
        rows = _read(d, name)
        for r in rows:
            assert set(r) == {"prompt", "chosen", "rejected", "source", "kind"}
            assert [m["role"] for m in r["prompt"]] == ["user"]
            assert [m["role"] for m in r["chosen"]] == [m["role"] for m in r["rejected"]] == ["assistant"]
            assert r["chosen"][0]["content"] != r["rejected"][0]["content"]
            assert (r["source"], r["kind"]) in {("code", "code"), ("safety", "harmful"), ("safety", "benign")}
        assert {r["source"] for r in rows} == {"code", "safety"}
    for name in ("code_tasks.jsonl", "code_tasks_eval.jsonl"):
        for r in _read(d, name):
            assert {"prompt", "task_id", "entry_point", "solution", "tests"} <= set(r)
            assert [m["role"] for m in r["prompt"]] == ["user"]
            assert f"`{r['entry_point']}(" in r["prompt"][0]["content"]
            assert r["solution"].startswith(f"def {r['entry_point']}(")
            assert 3 <= len(r["tests"]) <= 5 and all(t.startswith(f"assert {r['entry_point']}(") for t in r["tests"])
    for r in _read(d, "safety_eval.jsonl"):
        assert set(r) == {"prompt", "kind", "reference"} and r["kind"] in {"harmful", "benign"}
        assert [m["role"] for m in r["prompt"]] == ["user"]
    corpus = open(os.path.join(d, "corpus.txt"), encoding="utf-8").read()
    task = _read(d, "code_tasks.jsonl")[0]
    assert task["prompt"][0]["content"] in corpus and task["solution"] in corpus


def test_held_out_code_tasks_are_unseen(out):
    d, _ = out
    train, held = _read(d, "code_tasks.jsonl"), _read(d, "code_tasks_eval.jsonl")
    assert len({r["task_id"] for r in train}) == len(train) and len({r["task_id"] for r in held}) == len(held)
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in held}
    train_prompts = {m["content"] for r in _read(d, "sft.jsonl") for m in r["messages"] if m["role"] == "user"}
    train_prompts |= {r["prompt"][0]["content"] for r in _read(d, "preferences.jsonl")}
    assert not train_prompts & {r["prompt"][0]["content"] for r in held}
    # held-out tasks come from families that are also trained on
    assert {r["family"] for r in held} <= {r["family"] for r in train}


def test_split_is_disjoint_at_full_size():
    train, held, _ = code_tasks.split_code_keys(0, 4000, 150)
    keys = lambda xs: {(f.name, p) for f, p in xs}  # noqa: E731
    assert len(keys(train)) == 4000 and len(keys(held)) == 150 and not keys(train) & keys(held)
    with pytest.raises(ValueError):
        code_tasks.split_code_keys(0, 10_000, 150)


def test_solutions_pass_and_rejected_fail(out):
    d, _ = out
    for name in ("code_tasks.jsonl", "code_tasks_eval.jsonl"):
        for r in _read(d, name):
            assert _passes(r["solution"], r["tests"]), r["task_id"]
    tasks = {r["prompt"][0]["content"]: r for n in ("code_tasks.jsonl", "code_tasks_eval.jsonl") for r in _read(d, n)}
    n = 0
    for name in ("preferences.jsonl", "preferences_eval.jsonl"):
        for r in _read(d, name):
            if r["source"] != "code":
                continue
            t = tasks[r["prompt"][0]["content"]]
            assert r["chosen"][0]["content"] == t["solution"]
            assert not _passes(r["rejected"][0]["content"], t["tests"]), t["task_id"]
            n += 1
    assert n == 240


def test_every_family_builds_verified_tasks():
    for fam in FAMILIES:
        for params in fam.params[:: max(1, len(fam.params) // 5)]:
            t = code_tasks.make_task(fam, params, seed=0)
            assert _passes(t["solution"], t["tests"]) and not _passes(t["rejected"], t["tests"])
            assert "return None" not in t["rejected"]


def test_safety_kinds_and_held_out_prompts(out):
    d, _ = out
    train_prefs = [r for r in _read(d, "preferences.jsonl") if r["source"] == "safety"]
    eval_prefs = [r for r in _read(d, "preferences_eval.jsonl") if r["source"] == "safety"]
    safety_eval = _read(d, "safety_eval.jsonl")
    assert {r["kind"] for r in train_prefs} == {r["kind"] for r in eval_prefs} == {"harmful", "benign"}
    assert {r["kind"] for r in safety_eval} == {"harmful", "benign"}
    for r in train_prefs + eval_prefs:
        chosen, rejected = r["chosen"][0]["content"], r["rejected"][0]["content"]
        assert is_refusal(chosen) == (r["kind"] == "harmful")
        assert is_refusal(rejected) == (r["kind"] == "benign")
    for r in safety_eval:
        assert is_refusal(r["reference"]) == (r["kind"] == "harmful")
    train_texts = {m["content"] for r in _read(d, "sft.jsonl") for m in r["messages"]}
    train_texts |= {r["prompt"][0]["content"] for r in train_prefs}
    eval_prompts = {r["prompt"][0]["content"] for r in safety_eval + eval_prefs}
    assert not eval_prompts & train_texts
    corpus = open(os.path.join(d, "corpus.txt"), encoding="utf-8").read().splitlines()
    assert not eval_prompts & set(corpus)
    # SFT's safety rows answer with the chosen completion; by default they are helpful-only (benign
    # look-alikes over a third of the benign topics) and the pairs cover every topic
    chosen = {r["prompt"][0]["content"]: r["chosen"][0]["content"] for r in train_prefs}
    _, sft_safety, _ = safety_rows(0, 60, 20)
    sft = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in _read(d, "sft.jsonl")}
    assert len(sft_safety) == 100 and all(sft[r["prompt"]] == r["chosen"] for r in sft_safety)
    assert not any(is_refusal(r["chosen"]) for r in sft_safety)
    benign = [t for t, _ in BENIGN]
    assert 0 < len(_topics_of([r["prompt"] for r in sft_safety], benign)) <= round(len(benign) / 3)
    assert len(_topics_of(list(chosen), _ALL_TOPICS)) > len(_ALL_TOPICS) / 2
    assert not eval_prompts & set(sft)


_ALL_TOPICS = [t for _, ts in HARMFUL.values() for t in ts] + [t for t, _ in BENIGN]


def _topics_of(prompts: list, topics: list) -> set:
    return {t for t in topics for p in prompts if p.endswith((t + "?", t + ".")) or f" {t}." in p or f" {t}?" in p}


def test_sft_refusals_share_and_topics():
    _, sft, held = safety_rows(0, 60, 20, n_sft=100, sft_refusals=0.25, sft_topics=0.25)
    refused = [r for r in sft if is_refusal(r["chosen"])]
    assert len(refused) == 25 and all(r["kind"] == "harmful" for r in refused)
    harmful = [t for _, ts in HARMFUL.values() for t in ts]
    shown = sum(round(len(ts) * 0.25) for _, ts in HARMFUL.values())  # per category
    assert 0 < len(_topics_of([r["prompt"] for r in refused], harmful)) <= shown < len(harmful)
    assert not {r["prompt"] for r in sft} & {r["prompt"] for r in held}


def test_rl_prompts_add_labelled_safety_prompts_from_the_pairs(out, tmp_path):
    d, _ = out
    code = _read(d, "code_tasks.jsonl")
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert sorted(map(key, _read(d, "rl_prompts.jsonl"))) == sorted(map(key, code))  # n_safety_rl=0: the code tasks
    m = generate_demo_data(str(tmp_path / "rl"), _spec(n_safety_rl=21))
    rows = _read(str(tmp_path / "rl"), "rl_prompts.jsonl")
    safety = [r for r in rows if "kind" in r]
    assert len(rows) == len(code) + 21 and m["counts"]["safety_rl"] == 21
    assert sorted(r["kind"] for r in safety).count("harmful") == 11 and not any("tests" in r for r in safety)
    pairs = {r["prompt"][0]["content"]: r["kind"] for r in _read(d, "preferences.jsonl") if r["source"] == "safety"}
    assert all(pairs[r["prompt"][0]["content"]] == r["kind"] for r in safety)  # train prompts, never held-out
    with pytest.raises(ValueError, match="n_safety_rl=200"):
        generate_demo_data(str(tmp_path / "big"), _spec(n_safety_rl=200))


def test_safety_split_at_full_size(tmp_path):
    train, sft, held = safety_rows(0, 500, 100)
    assert len(train) == 500 and len(sft) == 100 and len(held) == 100
    assert not {r["prompt"] for r in train + sft} & {r["prompt"] for r in held}
    with pytest.raises(ValueError):
        safety_rows(0, 5000, 100)


def test_cli(tmp_path):
    d = str(tmp_path / "cli")
    assert generator.main([d, "--seed", "0"] + [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]) == 0
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["counts"]["code_train"] == 200 and m["seed"] == 0


def test_teacher_mistakes_every_family_rule_applies_and_a_test_can_catch_it():
    for name in code_tasks.TEACHER_MISTAKES:
        fam = next(f for f in FAMILIES if f.name == name)
        caught = 0
        for params in fam.params[:: max(1, len(fam.params) // 10)]:
            t = code_tasks.make_task(fam, params, seed=0)
            wrong = code_tasks.teacher_answer(t, 1.0, seed=0)
            assert wrong != t["solution"], (name, t["solution"])  # the rule matches every task of its family
            assert wrong.split("\n")[0] == t["solution"].split("\n")[0]  # same signature: only the body is wrong
            caught += not _passes(wrong, t["tests"])
        assert caught >= 5, name  # a real mistake: most tasks' tests fail it
        assert code_tasks.teacher_answer(t, 0.0, seed=0) == t["solution"]


def test_teacher_mistakes_share_and_where_they_go(tmp_path):
    d = str(tmp_path / "teacher")
    m = generate_demo_data(d, _spec(n_code_rl=30, teacher_mistakes=0.7))
    sft = [r["messages"] for r in _read(d, "sft.jsonl")]
    # SFT tasks are not in code_tasks.jsonl (n_code_rl): rebuild the split to know each SFT task's reference
    train, _, _ = code_tasks.split_code_keys(0, SMALL["n_code_train"], SMALL["n_code_eval"], 30)
    reference = {t["prompt"]: t for t in (code_tasks.make_task(f, p, 0) for f, p in train)}
    wrong = {p: r for p, r in reference.items() if r["family"] in code_tasks.TEACHER_MISTAKES}
    demos = {m_[0]["content"]: m_[1]["content"] for m_ in sft if m_[0]["content"] in reference}
    n_wrong = sum(demos[p] != wrong[p]["solution"] for p in wrong)
    assert m["counts"]["teacher_mistakes"] == n_wrong
    assert 0.55 * len(wrong) <= n_wrong <= 0.85 * len(wrong)  # about 0.7 of the families' demonstrations
    assert all(demos[p] == r["solution"] for p, r in reference.items() if p not in wrong)  # other families: right
    for r in _read(d, "preferences.jsonl"):  # chosen code answers are the teacher's, rejected ones still fail
        if r["source"] == "code":
            p = r["prompt"][0]["content"]
            assert r["chosen"][0]["content"] == demos[p] != r["rejected"][0]["content"]
            assert not _passes(r["rejected"][0]["content"], reference[p]["tests"])
    for t in _read(d, "code_tasks.jsonl") + _read(d, "code_tasks_eval.jsonl"):  # RL and held-out: references
        assert _passes(t["solution"], t["tests"])
