"""posttrain pipeline: argument checking and compile --check (submit/schedule over HTTP: test_submit_http.py)."""

import kfp
import pytest

from pipelines import commands
from pipelines.commands import posttrain
from pipelines.dag import PIPELINES


def test_params_are_typed_from_the_pipeline_signature(tmp_path):
    (tmp_path / "sft.yaml").write_text("engine:\n  zero_stage: 2\n")
    params = commands.parse_params(
        PIPELINES["posttrain-sft"],
        [
            "sft_max_steps=3",
            "sft_lr=2e-5",
            "base_model=s3://b/m",
            "sft_overrides=lora.r=8",
            "sft_overrides=lr=1",
            'prepare_overrides=["max_rows=10"]',
            f"sft_config_yaml=@{tmp_path / 'sft.yaml'}",
        ],
    )
    assert params == {
        "sft_max_steps": 3,
        "sft_lr": 2e-5,
        "base_model": "s3://b/m",
        "sft_overrides": ["lora.r=8", "lr=1"],
        "prepare_overrides": ["max_rows=10"],
        "sft_config_yaml": "engine:\n  zero_stage: 2\n",
    }


def test_the_old_lr_of_posttrain_sft_is_sft_lr_with_a_warning(capsys):
    sft = PIPELINES["posttrain-sft"]
    assert commands.parse_params(sft, ["lr=2e-5", "sft_max_steps=3"]) == {"sft_lr": 2e-5, "sft_max_steps": 3}
    assert capsys.readouterr().err == "warning: posttrain-sft: parameter lr is deprecated, use sft_lr\n"
    for both in (["lr=1e-5", "sft_lr=2e-5"], ["sft_lr=2e-5", "lr=1e-5"]):
        with pytest.raises(commands.UsageError, match="posttrain-sft: both lr and sft_lr given: lr is the deprecated"):
            commands.parse_params(sft, both)
    with pytest.raises(commands.UsageError, match="unknown parameter 'lr' of posttrain-dpo"):  # (never had it)
        commands.parse_params(PIPELINES["posttrain-dpo"], ["lr=1e-5"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["run", "--pipeline", "nope"],
            "unknown pipeline 'nope'; expected one of: posttrain-all, posttrain-dpo, posttrain-rlhf, posttrain-sft",
        ),
        (["run", "sft_max_steps=abc"], "sft_max_steps: expected an integer, got 'abc'"),
        (["run", "sft_lr=fast"], "sft_lr: expected a number"),
        (["run", "stepz=3"], "unknown parameter 'stepz' of posttrain-sft"),
        (["run", "lr=1e-5", "sft_lr=1e-5"], "both lr and sft_lr given"),
        (["run", "sft_max_steps"], "'sft_max_steps': expected param=value"),
        (["run", "sft_overrides=[1,"], "sft_overrides: expected JSON"),
        (["run", "sft_config_yaml=@/no/such/file"], "sft_config_yaml: cannot read /no/such/file"),
        (["submit", "--host", "localhost:8080"], "--host: expected the KFP API URL"),
        (["submit", "--host", "http://kfp", "--pipeline", "nope"], "unknown pipeline 'nope'"),
        (["schedule", "--host", "http://kfp", "--cron", "0 3 * *"], "--cron: expected 5 fields"),
        (["schedule", "--host", "http://kfp", "--cron", "0 3 * * 0", "x=1"], "unknown parameter 'x'"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(kfp, "Client", lambda **kw: pytest.fail("no client before the arguments are valid"))
    assert posttrain(["pipeline", *argv]) == 2
    assert message in capsys.readouterr().err


def test_run_refuses_to_replace_an_unrelated_latest_dir(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert posttrain(["pipeline", "run", "--root", str(tmp_path / "local"), "--latest", str(tmp_path / "mine")]) == 2
    assert "refusing to replace" in capsys.readouterr().err
    assert not (tmp_path / "local").exists()


def test_write_latest_replaces_an_earlier_record(tmp_path):
    model = tmp_path / "run" / "sft" / "model"
    model.mkdir(parents=True)
    record = {"outputs": {"model": {"path": str(model)}, "metrics": {"path": str(tmp_path / "none")}}}
    for _ in range(2):
        commands.check_latest(str(tmp_path / "latest"))
        commands.write_latest(str(tmp_path / "latest"), record)
    assert sorted(p.name for p in (tmp_path / "latest").iterdir()) == ["model", "run.json"]
    assert (tmp_path / "latest" / "model").resolve() == model
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".latest-")]


def test_help_and_usage_errors(capsys):
    assert posttrain(["pipeline", "--help"]) == 0
    assert "compile" in capsys.readouterr().out
    assert posttrain(["pipeline", "frobnicate"]) == 2
    assert posttrain(["pipeline", "submit"]) == 2  # --host is required
    assert "--host" in capsys.readouterr().err


def test_list_shows_parameters(capsys):
    assert posttrain(["pipeline", "list"]) == 0
    out = capsys.readouterr().out
    assert "posttrain-sft" in out and "sft_max_steps" in out and "Optimizer steps of SFT." in out


def test_compile_check_passes_on_the_committed_files_and_fails_on_drift(tmp_path, capsys):
    assert posttrain(["pipeline", "compile", "--check"]) == 0
    assert posttrain(["pipeline", "compile", "--out", str(tmp_path)]) == 0
    (tmp_path / "posttrain-sft.yaml").write_text("stale")
    assert posttrain(["pipeline", "compile", "--check", "--out", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_cron_gets_kfp_seconds_field():
    assert commands.kfp_cron("0 3 * * 0") == "0 0 3 * * 0"
    assert commands.kfp_cron("30 0 3 * * 1-5") == "30 0 3 * * 1-5"
