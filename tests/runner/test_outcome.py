"""trainer_lib.runner.outcome: what the train and evaluate components report, read without KFP."""

import json

import torch
from safetensors.torch import save_file

from trainer_lib.runner.outcome import evaluation, last_logged, move_tensorboard, trained_model


def _trained_dir(tmp_path, events=True):
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.zeros(3, 4), "b": torch.zeros(4)}, str(model / "model.safetensors"))
    rows = [
        {"step": 1, "split": "train", "time": 0.1, "loss": 2.0},
        {"step": 1, "split": "eval", "loss": 3.0},
        {"step": 2, "split": "train", "time": 0.2, "loss": 1.0, "lr": 0.1},
    ]
    (model / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if events:
        (model / "tensorboard").mkdir()
        (model / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"event")
    return model


def test_last_logged_reads_the_last_record_of_a_split(tmp_path):
    model = _trained_dir(tmp_path)
    assert last_logged(str(model), "train") == {"loss": 1.0, "lr": 0.1}
    assert last_logged(str(model), "eval") == {"loss": 3.0}
    assert last_logged(str(tmp_path / "missing")) == {}


def test_a_trained_model_is_described_its_metrics_gathered_and_its_events_moved_out(tmp_path):
    model = _trained_dir(tmp_path)
    summary = {
        "stage": "reward",
        "steps": 2,
        "loss": 0.5,
        "eval": {"accuracy": 0.75},
        "reward_stats": {"reward_mean": 0.1, "reward_std": 1.2},
        "output_dir": str(model),  # not a description of the model
    }
    trained = trained_model(summary, str(model), str(tmp_path / "tb"))
    assert trained.parameters == 16
    assert trained.metadata == {
        "parameters": 16,
        "stage": "reward",
        "steps": 2,
        "loss": 0.5,
        "reward_mean": 0.1,
        "reward_std": 1.2,
    }
    assert trained.metrics == {**summary, "train": {"loss": 1.0, "lr": 0.1}}
    # the events are the TensorBoard artifact's now, and the model holds only the model
    assert [p.name for p in (tmp_path / "tb").iterdir()] == ["events.out.tfevents.1.host"]
    assert not (model / "tensorboard").exists() and (model / "model.safetensors").is_file()


def test_a_run_without_tensorboard_leaves_an_empty_artifact(tmp_path):
    model = _trained_dir(tmp_path, events=False)
    move_tensorboard(str(model), str(tmp_path / "tb"))
    assert (tmp_path / "tb").is_dir() and not any((tmp_path / "tb").iterdir())


def test_an_evaluation_gives_its_gate_and_ui_metrics_and_copies_its_report(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    result = {
        "models": {"base": {"task_pass_rate": 0.25, "humaneval_pass@1": 0.5, "judge": "rules"}, "sft": {"n": 3}},
        "candidate": "sft",
        "baseline": "base",
        "gate": {"passed": True, "rules": []},
    }
    (results / "metrics.json").write_text(json.dumps(result))
    (results / "report.html").write_text("<html>report</html>")
    (results / "summary.md").write_text("# summary")
    out = evaluation(str(results), str(tmp_path / "report.html"), str(tmp_path / "summary.md"))
    assert out.gate_passed is True
    assert out.metrics == {
        "base_task_pass_rate": 0.25,
        "base_humaneval_pass_at_1": 0.5,
        "sft_n": 3.0,
        "gate_passed": 1.0,
    }
    assert (tmp_path / "report.html").read_text() == "<html>report</html>"
    assert (tmp_path / "summary.md").read_text() == "# summary"
