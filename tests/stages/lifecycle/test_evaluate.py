"""posttrain evaluate on two tiny models with the demo data: files, metrics map, report, gate, component."""

import json
import os
import shutil

import pytest

from trainer_lib.cli import main

REQUIRED = ("task_pass_rate", "humaneval_pass@1", "harmless_rate", "over_refusal_rate")
INJECTED = "Please print <script>alert('x')</script> for me."


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir, demo_dir):
    """Two tiny models (the second with a training log to plot), a reward model, and eval data with
    an HTML-injection prompt."""
    from transformers import AutoModelForSequenceClassification

    from tests.conftest import CHAT_ROWS
    from trainer_lib.demo.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("evaluate")
    other = make_tiny_model(
        str(root / "other"),
        [q + " " + a for q, a in CHAT_ROWS] * 20,
        vocab_size=300,
        num_layers=2,
        hidden_size=64,
        seed=1,
    )
    log = [{"step": s, "split": "train", "loss": 3.0 / s, "lr": 1e-3, "reward": 0.1 * s} for s in range(1, 9)]
    log += [{"step": s, "split": "eval", "loss": 3.5 / s} for s in (4, 8)]
    (root / "other" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))

    reward = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    reward.config.pad_token_id = 0
    reward.save_pretrained(root / "rm")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (root / "rm" / name).write_bytes(open(os.path.join(tiny_model_dir, name), "rb").read())

    data = root / "data"
    data.mkdir()
    tasks = [json.loads(line) for line in open(os.path.join(demo_dir, "code_tasks_eval.jsonl"))][:3]
    (data / "code_tasks_eval.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    safety = [json.loads(line) for line in open(os.path.join(demo_dir, "safety_eval.jsonl"))]
    rows = [
        next(r for r in safety if r["kind"] == "harmful"),
        next(r for r in safety if r["kind"] == "benign"),
        {"prompt": [{"role": "user", "content": INJECTED}], "kind": "benign"},
    ]
    (data / "safety_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"base": tiny_model_dir, "other": other, "rm": str(root / "rm"), "data": str(data), "root": root}


def _args(setup, out, *extra):
    return [
        "evaluate",
        f"models=base={setup['base']},tuned={setup['other']}",
        "candidate=tuned",
        "baseline=base",
        f"data_dir={setup['data']}",
        f"output_dir={out}",
        "humaneval.limit=3",
        "humaneval.max_new_tokens=8",
        "tasks.max_new_tokens=12",
        "safety.max_new_tokens=12",
        "sandbox_workers=2",
        "samples_per_model=3",
        *extra,
    ]


def test_evaluate_writes_metrics_report_and_gate(setup, tmp_path, capsys):
    out = tmp_path / "eval"
    rules = "gate.rules=task_pass_rate>=baseline,harmless_rate>=0.0,over_refusal_rate<=baseline+0.5"
    assert main(_args(setup, out, rules, f"reward_model_path={setup['rm']}")) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("{\n") :])
    result = json.loads((out / "metrics.json").read_text())
    assert summary["gate_passed"] == result["gate"]["passed"] and summary["models"] == result["models"]

    assert list(result["models"]) == ["base", "tuned"]
    for label in ("base", "tuned"):
        metrics = result["models"][label]
        assert all(key in metrics for key in REQUIRED), metrics
        assert all(0.0 <= metrics[key] <= 1.0 for key in REQUIRED)
        assert "reward_mean" in metrics
    assert "reward_win_rate" in result["models"]["tuned"] and "reward_win_rate" not in result["models"]["base"]
    assert result["candidate"] == "tuned" and result["baseline"] == "base"
    assert result["judge"].startswith("refusal_rules")
    assert set(result["sandbox"]) >= {"network", "filesystem"}
    assert result["data"]["humaneval"]["problems"] == 3 and result["data"]["tasks"]["count"] == 3
    assert result["data"]["safety"] == {
        "path": os.path.join(setup["data"], "safety_eval.jsonl"),
        "harmful": 1,
        "benign": 2,
        "chat": "auto",
    }
    gate = result["gate"]
    assert [r["rule"] for r in gate["rules"]] == rules.split("=", 1)[1].split(",")
    assert gate["passed"] == all(r["passed"] for r in gate["rules"])
    assert gate["rules"][1]["passed"]  # harmless_rate >= 0 always holds

    for name in ("base_humaneval", "tuned_humaneval", "base_tasks", "tuned_tasks", "base_safety", "tuned_safety"):
        rows = [json.loads(line) for line in (out / "per_problem" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == 3
    assert all(
        len(r["samples"]) == 1
        for r in map(json.loads, (out / "per_problem" / "tuned_humaneval.jsonl").read_text().splitlines())
    )

    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 2  # the metrics chart and tuned's training curves
    assert "<script>" not in page and "&lt;script&gt;alert(" in page
    assert "gate PASSED" in page or "gate FAILED" in page
    assert (out / "summary.md").read_text().startswith("# Evaluation: gate ")

    beat = json.loads((out / "heartbeat.json").read_text())  # what the dashboard shows while it runs
    assert (beat["state"], beat["stage"], beat["step"], beat["total_steps"]) == ("finished", "evaluate", 4, 4)
    assert beat["config"]["reward_model_path"] == str(setup["rm"])


def test_a_failing_evaluation_leaves_a_failed_heartbeat(setup, tmp_path, capsys):
    """The second model's folder holds no weights: base generates, then loading tuned fails."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(setup["other"]):
        if name.endswith(".json"):  # its config and tokenizer, not its weights
            shutil.copy(os.path.join(setup["other"], name), broken / name)
    out = tmp_path / "eval"
    args = [
        a if not a.startswith("models=") else f"models=base={setup['base']},tuned={broken}" for a in _args(setup, out)
    ]
    assert main(args) != 0
    beat = json.loads((out / "heartbeat.json").read_text())
    assert (beat["state"], beat["step"], beat["total_steps"]) == ("failed", 1, 4)
    assert not (out / "metrics.json").exists()


def test_evaluate_component_logs_metrics_and_returns_gate(setup, tmp_path):
    from kfp import dsl

    from components.evaluate import evaluate

    artifacts = {
        "metrics": dsl.Metrics(uri=str(tmp_path / "metrics")),
        "report": dsl.HTML(uri=str(tmp_path / "r.html")),
        "summary": dsl.Markdown(uri=str(tmp_path / "s.md")),
        "results": dsl.Artifact(uri=str(tmp_path / "res")),
    }
    outputs = evaluate.python_func(
        candidate=dsl.Model(uri=setup["other"]),
        baseline=dsl.Model(uri=setup["base"]),
        eval_data=dsl.Dataset(uri=setup["data"]),
        candidate_label="tuned",
        baseline_label="sft",
        gate_rules=["task_pass_rate>=1.1"],
        overrides=["humaneval.enabled=false", "tasks.max_new_tokens=8", "safety.max_new_tokens=8"],
        **artifacts,
    )
    assert outputs.gate_passed is False  # a pass rate cannot exceed 1
    logged = artifacts["metrics"].metadata
    assert logged["gate_passed"] == 0.0 and {"tuned_task_pass_rate", "sft_harmless_rate"} <= set(logged)
    assert "data:image/png;base64," in (tmp_path / "r.html").read_text()
    assert (tmp_path / "s.md").read_text().startswith("# Evaluation: gate FAILED")
    assert json.loads((tmp_path / "res" / "metrics.json").read_text())["gate"]["passed"] is False


def test_tasks_samples_adds_the_pass_rate_over_sampled_answers(setup, tmp_path, capsys):
    out = tmp_path / "eval"
    extra = [
        "humaneval.enabled=false",
        "tasks.samples=3",
        "tasks.temperature=1.0",
        "gate.rules=task_sampled_pass_rate>=0",
    ]
    assert main(_args(setup, out, *extra)) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert result["data"]["tasks"]["samples"] == 3 and result["data"]["tasks"]["temperature"] == 1.0
    assert result["gate"]["rules"][0]["rule"] == "task_sampled_pass_rate>=0"
    for label in ("base", "tuned"):
        greedy = [json.loads(line) for line in (out / "per_problem" / f"{label}_tasks.jsonl").read_text().splitlines()]
        path = out / "per_problem" / f"{label}_tasks_sampled.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["task_id"] for r in rows] == [t["task_id"] for t in greedy for _ in range(3)]
        rate = result["models"][label]["task_sampled_pass_rate"]
        assert rate == pytest.approx(sum(r["passed"] for r in rows) / 9)
        # sampled at temperature 1, a random tiny model does not repeat one answer for every task
        assert any(len({r["completion"] for r in rows[i : i + 3]}) > 1 for i in range(0, 9, 3)), rows


@pytest.mark.parametrize(
    "override, message",
    [
        ("tasks.samples=2 tasks.temperature=0", "tasks.temperature"),
        ("gate.rules=task_pass_rate=>0.2", "gate.rules[0]"),
        ("gate.rules=humaneval_pass@10>=0.1", "gate.rules[0]"),
        ("candidate=dpo", "candidate"),
    ],
)
def test_evaluate_config_errors_name_the_key(setup, tmp_path, capsys, override, message):
    assert main(_args(setup, tmp_path / "x", *override.split())) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (tmp_path / "x").exists()


def test_evaluate_reads_and_writes_the_object_store(setup, s3_bucket):
    from trainer_lib import storage

    model, data, out = f"s3://{s3_bucket}/models/tuned", f"s3://{s3_bucket}/data", f"s3://{s3_bucket}/eval"
    storage.upload_dir(setup["other"], model)
    storage.upload_dir(setup["data"], data)
    args = [
        "evaluate",
        f"models=base={setup['base']},tuned={model}",
        f"data_dir={data}",
        f"output_dir={out}",
        "humaneval.enabled=false",
        "tasks.max_new_tokens=8",
        "safety.limit=1",
        "safety.max_new_tokens=8",
    ]
    assert main(args) == 0
    result = json.loads(storage.read_text(f"{out}/metrics.json"))
    assert result["candidate"] == "tuned" and result["baseline"] is None and result["gate"]["passed"]
    assert result["paths"]["tuned"] == model and result["data"]["tasks"]["path"] == f"{data}/code_tasks_eval.jsonl"
    assert "data:image/png;base64," in storage.read_text(f"{out}/report.html")  # tuned's curves came from s3
    assert storage.exists(f"{out}/summary.md") and storage.exists(f"{out}/per_problem/tuned_tasks.jsonl")
