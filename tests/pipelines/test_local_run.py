"""The whole bootstrap -> prepare -> sft DAG through kfp.local with a tiny model (~30 s)."""

import json
import os
import tempfile

import pytest

from pipelines.commands import posttrain

SMALL = [
    'demo_overrides=["n_code_train=80", "n_code_eval=8", "n_safety_train=24", "n_safety_sft=24", "n_safety_eval=8"]',
    'tiny_model_overrides=["hidden_size=32", "num_layers=1", "vocab_size=400"]',
    "max_length=256",
    "batch_size=4",
]


@pytest.mark.slow
def test_local_run_trains_and_records_the_latest_run(tmp_path, capsys):
    rc = posttrain(
        [
            "pipeline",
            "run",
            "--root",
            str(tmp_path / "local"),
            *SMALL,
            "sft_max_steps=3",
            "sft_overrides=logging_steps=1",
            "sft_config_yaml=eval_steps: 2\nlogging_steps: 9\n",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]

    record = json.loads((tmp_path / "latest" / "run.json").read_text())
    assert record["pipeline"] == "posttrain-sft"
    assert record["parameters"]["sft_max_steps"] == 3 and record["parameters"]["sft_lr"] == 1e-4  # defaults too
    assert os.path.dirname(record["run_dir"]) == str(tmp_path / "local")
    model_dir = record["outputs"]["model"]["path"]
    assert model_dir.startswith(record["run_dir"]) and model_dir in out
    assert os.path.realpath(tmp_path / "latest" / "model") == model_dir

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "latest" / "model")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert AutoTokenizer.from_pretrained(tmp_path / "latest" / "model").vocab_size <= 400

    metrics = record["outputs"]["metrics"]["metadata"]
    assert metrics["steps"] == 3 and metrics["eval_loss"] > 0 and metrics["train.loss"] > 0
    logs = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
    assert [r["step"] for r in logs if r["split"] == "train"] == [1, 2, 3]  # sft_overrides beat the YAML
    assert [r["step"] for r in logs if r["split"] == "eval"] == [0, 2, 3]  # sft_config_yaml reached sft

    # checkpoints (optimizer state) live under the pipeline root, where a retried task finds them; the
    # Model artifact holds only the final model
    assert not os.path.exists(os.path.join(model_dir, "checkpoints"))
    (checkpoints,) = (tmp_path / "local" / "checkpoints").glob("sft-*")
    assert (checkpoints / "step-00000003" / "COMPLETE").is_file()

    # the model leaves the pipeline exported (FP32, FP16 + INT8, parity checked) and published as Triton version 1
    tasks = record["tasks"]
    exported = next(t["exported"] for t in tasks.values() if "exported" in t)
    parity = json.loads(open(os.path.join(exported, "parity.json")).read())
    assert parity["fp32"]["prefill"]["max_abs_diff"] < 1e-3
    repository = next(t["repository"] for name, t in tasks.items() if name.startswith("deploy"))
    assert os.path.isfile(os.path.join(repository, "posttrain", "config.pbtxt"))
    assert os.path.isfile(os.path.join(repository, "posttrain", "1", "model.onnx"))


@pytest.mark.slow
@pytest.mark.extended
def test_local_run_with_a_search_trains_sft_with_the_best_trials_values(tmp_path, capsys):
    """posttrain-sft with sft_search: a tune task of two short trials before SFT (~45 s), whose best learning
    rate the SFT task trains with, for the run's own number of steps."""
    search = tmp_path / "search.yaml"
    search.write_text(
        "overrides: {max_steps: 2, eval_steps: 1}\n"  # the trials only
        "space: {lr: {low: 1.0e-4, high: 1.0e-2, log: true}}\n"
        "objective: {metric: eval_loss, direction: minimize}\n"
        "n_trials: 2\npruner: {kind: none}\n"
    )
    root = ["--root", str(tmp_path / "local")]
    rc = posttrain(["pipeline", "run", *root, *SMALL, "sft_max_steps=3", f"sft_search=@{search}"])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    tasks = json.loads((tmp_path / "latest" / "run.json").read_text())["tasks"]
    results = json.loads(open(tasks["tune"]["results"]).read())
    assert [t["state"] for t in results["trials"]] == ["complete", "complete"]
    best = results["best"]
    assert f"tune: best trial {best['trial']}: eval_loss = " in out
    assert os.path.isfile(tasks["tune"]["best_config"]) and os.path.isfile(tasks["tune"]["report"])
    trained = json.load(open(os.path.join(tasks["train"]["output_model"], "lineage.json")))["stages"][-1]["config"]
    assert trained["lr"] == best["params"]["lr"] and trained["max_steps"] == 3


@pytest.mark.slow
def test_failed_local_run_exits_1_and_keeps_latest(tmp_path, capsys):
    (tmp_path / "latest").mkdir()
    (tmp_path / "latest" / "run.json").write_text("{}")
    rc = posttrain(
        ["pipeline", "run", "--root", str(tmp_path / "local"), *SMALL, f"base_model={tmp_path / 'no-such-model'}"]
    )
    assert rc == 1
    assert "failed" in capsys.readouterr().err
    assert (tmp_path / "latest" / "run.json").read_text() == "{}"


CANARIES = {
    "AWS_ACCESS_KEY_ID": "CanaryKeyId7f3a9c1e",
    "AWS_SECRET_ACCESS_KEY": "canary-secret-5b2d8e41f0",
    "HF_TOKEN": "hf_canary0token9d1c4b7a",
}


def _canary_hits(tmp_path, bucket: str, captured: str) -> tuple[list[str], int]:
    """Where any canary value occurs: every file under ``tmp_path`` (run directories, executor outputs,
    artifacts, logs, metrics, reports, run.json, caches, temporary files), every object in the bucket,
    and the captured output. Also how many files and objects were searched."""
    import boto3

    needles = [value.encode() for value in CANARIES.values()]
    hits, searched = [f"output: {v}" for v in CANARIES.values() if v in captured], 0
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink():
            searched += 1
            data = path.read_bytes()
            hits += [f"{path}: {n.decode()}" for n in needles if n in data]
    s3 = boto3.client("s3")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            searched += 1
            data = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            hits += [f"s3://{bucket}/{obj['Key']}: {n.decode()}" for n in needles if n in data]
    return hits, searched


@pytest.mark.slow
def test_local_run_of_the_whole_dag_evaluates_releases_exports_and_deploys(tmp_path, capfd, monkeypatch, s3_bucket):
    """posttrain-all with tiny settings: every stage, list parameters (reward functions) included, the gate
    judged on the user's held-out tasks, the release published to S3.

    It also runs with the S3 credentials and HF_TOKEN set to canary values (the release uses them), and
    temporary files and caches inside ``tmp_path``: afterwards no file, object or output holds a canary."""
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (this process read TMPDIR already)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")  # the release registers there
    (tmp_path / "tmp").mkdir()
    tasks = tmp_path / "my_tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "task_id": f"t{i}",
                    "prompt": f"Define f(x) that returns x + {i}.",
                    "tests": [f"assert f(1) == {1 + i}"],
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    rc = posttrain(
        [
            "pipeline",
            "run",
            "--pipeline",
            "posttrain-all",
            "--root",
            str(tmp_path / "local"),
            *SMALL,
            f"eval_tasks={tasks}",
            "sft_max_steps=2",
            "dpo_max_steps=2",
            "reward_max_steps=2",
            "rl_max_steps=2",
            "rollout_n=2",
            "max_new_tokens=8",
            "humaneval_limit=1",
            'gate_rules=["task_pass_rate>=0"]',
            'served_gate_rules=["task_pass_rate>=candidate-1"]',
            'reward_functions=["code_execution", "code_style"]',
            "model_name=demo",
            'rl_overrides=["prompts_per_step=2", "save_steps=0"]',
            'evaluate_overrides=["safety.limit=4"]',
            f"release_uri=s3://{s3_bucket}/releases/demo",
        ]
    )
    captured = capfd.readouterr()
    out = captured.out
    assert rc == 0, out[-3000:]
    record = json.loads((tmp_path / "latest" / "run.json").read_text())
    assert record["evaluation"]["gate_passed"] is True
    metrics = json.loads((tmp_path / "latest" / "metrics.json").read_text())
    assert set(metrics["models"]) == {"base", "sft", "dpo", "grpo", "grpo_int8"}  # and the INT8 model to be served
    served = metrics["gate"]["served"]
    assert (served["label"], served["variant"], served["passed"]) == ("grpo_int8", "int8", True)
    assert [rule["rule"] for rule in served["rules"]] == ["task_pass_rate>=candidate-1"]
    assert metrics["data"]["tasks"] == {"path": str(tasks), "count": 3, "chat": "auto"}  # the user's, not the demo's
    tasks = record["tasks"]
    grpo_dir = next(
        t["output_model"]
        for name, t in tasks.items()
        if "output_model" in t and json.load(open(os.path.join(t["output_model"], "summary.json")))["stage"] == "grpo"
    )
    summary = json.load(open(os.path.join(grpo_dir, "summary.json")))
    assert summary["steps"] == 2  # the reward list reached the stage: it trained with both functions
    logged = [json.loads(line) for line in open(os.path.join(grpo_dir, "metrics.jsonl"))]
    assert {"rewards/code_execution", "rewards/code_style"} <= set(logged[-1])
    repository = next(t["repository"] for name, t in tasks.items() if name.startswith("deploy"))
    assert os.path.isfile(os.path.join(repository, "demo", "1", "model.onnx"))
    # runs/latest points at what `make demo` serves: the repository and the HF model that was exported
    assert os.path.realpath(tmp_path / "latest" / "repository") == repository
    assert os.path.realpath(tmp_path / "latest" / "exported_model") == grpo_dir

    from trainer_lib import storage

    released = json.loads(storage.read_text(f"s3://{s3_bucket}/releases/demo/release.json"))  # canary credentials
    stages = released["lineage"]["stages"]
    assert [stage["stage"] for stage in stages][-1] == "grpo" and stages[-1]["config"], stages
    assert released["registry"]["version"] == 1
    assert storage.exists(f"s3://{s3_bucket}/releases/demo/README.md")  # the model card
    probe = tmp_path / "probe.txt"  # one planted hit: the search does find what it looks for
    probe.write_text(f"token={CANARIES['HF_TOKEN']}")
    hits, searched = _canary_hits(tmp_path, s3_bucket, captured.out + captured.err)
    assert searched > 100 and hits == [f"{probe}: {CANARIES['HF_TOKEN']}"], hits
