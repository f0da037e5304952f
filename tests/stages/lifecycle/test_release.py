"""release: publishes only a model whose evaluation gate passed, marker last."""

import json

from trainer_lib.cli import main


def _evaluation(tmp_path, passed):
    path = tmp_path / "metrics.json"
    path.write_text(
        json.dumps(
            {
                "candidate": "dpo",
                "baseline": "sft",
                "models": {"dpo": {"task_pass_rate": 0.5}, "sft": {"task_pass_rate": 0.3}},
                "gate": {"passed": passed, "rules": [{"rule": "task_pass_rate>=baseline", "passed": passed}]},
            }
        )
    )
    return path


def _model(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    return model


def test_release_copies_model_and_writes_marker(tmp_path):
    model, target = _model(tmp_path), tmp_path / "released"
    args = ["release", f"model_path={model}", f"release_uri={target}", f"evaluation={_evaluation(tmp_path, True)}"]
    assert main(args) == 0
    assert (target / "model.safetensors").read_bytes() == b"weights"
    record = json.loads((target / "release.json").read_text())
    assert record["candidate"] == "dpo" and record["metrics"] == {"task_pass_rate": 0.5}


def test_failed_gate_publishes_nothing(tmp_path, capsys):
    model, target = _model(tmp_path), tmp_path / "released"
    args = ["release", f"model_path={model}", f"release_uri={target}", f"evaluation={_evaluation(tmp_path, False)}"]
    assert main(args) == 2
    assert "gate failed (task_pass_rate>=baseline)" in capsys.readouterr().err
    assert not target.exists()


def test_release_to_s3(s3_bucket, tmp_path):
    from trainer_lib import storage

    model = _model(tmp_path)
    uri = f"s3://{s3_bucket}/releases/v1"
    assert (
        main(["release", f"model_path={model}", f"release_uri={uri}", f"evaluation={_evaluation(tmp_path, True)}"]) == 0
    )
    assert storage.read_bytes(f"{uri}/model.safetensors") == b"weights"
    assert json.loads(storage.read_text(f"{uri}/release.json"))["gate"]["passed"] is True


def test_not_an_evaluation(tmp_path, capsys):
    bad = tmp_path / "metrics.json"
    bad.write_text("{}")
    assert (
        main(["release", f"model_path={_model(tmp_path)}", f"release_uri={tmp_path / 'r'}", f"evaluation={bad}"]) == 2
    )
    assert "is not an evaluate metrics.json" in capsys.readouterr().err
