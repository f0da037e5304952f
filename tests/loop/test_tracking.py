"""report_to: metrics and the run's config reach MLflow (read back with mlflow's own search); clear errors."""

import importlib.util
import json
import os

import pytest

from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.loop.tracking import Tracker, check_reporters
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = ["model.path=m", "data.path=d", "output_dir=o"]


def _runs(uri: str, experiment: str = "posttrain"):
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        return mlflow.search_runs(experiment_names=[experiment])
    finally:
        mlflow.set_tracking_uri(None)


def test_an_sft_run_reports_to_a_local_mlflow_store(tiny_model_dir, chat_jsonl, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    out = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                f"model.path={tiny_model_dir}",
                f"data.path={chat_jsonl}",
                f"output_dir={out}",
                "max_steps=6",
                "batch_size=2",
                "lr=3e-3",
                "data.max_length=64",
                "logging_steps=2",
                "save_steps=0",
                "report_to=mlflow,tensorboard",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    final_loss = [r for r in records if r["split"] == "train"][-1]["loss"]
    runs = _runs(f"sqlite:///{out}/mlflow.db")  # the default store: next to metrics.jsonl
    assert len(runs) == 1 and runs["status"][0] == "FINISHED"
    assert runs["metrics.train/loss"][0] == pytest.approx(final_loss)
    assert "metrics.eval/loss" in runs
    assert runs["params.lr"][0] == "0.003" and runs["params.engine.zero_stage"][0] == "0"
    assert os.listdir(out / "tensorboard")


def test_the_tracker_follows_mlflow_environment(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/shared.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "nightly")
    tracker = Tracker(str(tmp_path / "run"), report_to=["mlflow"], params={"lr": 0.1, "reward.functions": ["a:b"]})
    tracker.log(1, {"loss": 2.0, "reward/my.mod:fn": 0.5})
    tracker.log(2, {"loss": 1.0, "note": "text is not a metric"})
    tracker.close()
    runs = _runs(uri, "nightly")
    assert runs["metrics.train/loss"][0] == 1.0 and runs["metrics.train/reward/my.mod_fn"][0] == 0.5
    assert runs["params.reward.functions"][0] == "['a:b']"
    assert not os.path.exists(tmp_path / "run" / "tensorboard")  # only what report_to names


def test_report_to_is_checked():
    assert load_config(SFTConfig, None, REQUIRED).report_to == ["tensorboard"]  # the default, as before
    assert load_config(SFTConfig, None, [*REQUIRED, "report_to=none"]).report_to == ["none"]
    with pytest.raises(ConfigError, match="report_to: expected some of tensorboard, mlflow, wandb, none, got 'all'"):
        load_config(SFTConfig, None, [*REQUIRED, "report_to=all"])
    with pytest.raises(ConfigError, match="report_to: none means no tracker"):
        load_config(SFTConfig, None, [*REQUIRED, "report_to=none,mlflow"])


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_without_the_package_is_a_clear_error(capsys):
    with pytest.raises(UserError, match="report_to: wandb needs the wandb package, which is not installed"):
        check_reporters(["wandb"])
    assert main(["sft", *REQUIRED, "report_to=wandb"]) == 2
    assert "report_to: wandb needs the wandb package" in capsys.readouterr().err
