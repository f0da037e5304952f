"""Stage configs are checked from the compiled DAG before anything runs, naming the task, stage and key."""

import time

import pytest

from pipelines.commands import posttrain
from pipelines.dag import PIPELINES
from pipelines.validate import ValidationError, validate


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_the_defaults_of_every_pipeline_validate(name):
    assert validate(PIPELINES[name], {}) >= 6  # bootstrap (2 stages), prepare, training, export, deploy...


@pytest.mark.parametrize(
    "params, task, message",
    [
        ({"dpo_overrides": ["betta=0.2"]}, "DPO", "betta: unknown key (did you mean 'beta'?)"),
        ({"rl_overrides": ["rollout.n=1"]}, "GRPO", "rollout.n: group methods need at least 2"),
        ({"sft_overrides": ["lr=fast"]}, "SFT", "lr: expected a number"),
        ({"evaluate_overrides": ["tasks.limit=-1"]}, "evaluate grpo", "tasks.limit: expected >= 0"),
        ({"export_overrides": ["int5=true"]}, "export grpo", "int5: unknown key"),
        ({"demo_overrides": ["n_code_train=0"]}, "bootstrap", "n_code_train: expected a positive integer"),
        ({"dpo_loss": "sigmoidd"}, "DPO", "loss: expected one of"),
        ({"sft_overrides": ["batch_size=big"]}, "SFT", "batch_size: expected an integer or 'auto', got 'big'"),
    ],
)
def test_a_bad_setting_names_the_task_stage_and_key(params, task, message):
    with pytest.raises(ValidationError, match=r"task '(.+)' \(posttrain \w[\w-]*\)") as info:
        validate(PIPELINES["posttrain-all"], params)
    assert f"task '{task}'" in str(info.value) and message in str(info.value)


def test_auto_batch_size_passes_through_a_stages_overrides():
    assert (
        validate(
            PIPELINES["posttrain-all"],
            {
                "sft_overrides": ["batch_size=auto", "global_batch_size=32"],
                "rl_overrides": ["batch_size=auto"],
                "dpo_overrides": ["batch_size=auto"],
            },
        )
        >= 6
    )


def test_only_the_branch_that_will_run_is_checked():
    rlhf = PIPELINES["posttrain-rlhf"]
    validate(rlhf, {"rl_algorithm": "ppo", "rl_overrides": ["kl.coef=0.1"]})  # a PPO key, PPO runs
    with pytest.raises(ValidationError, match="task 'GRPO'.*kl: unknown key"):
        validate(rlhf, {"rl_algorithm": "grpo", "rl_overrides": ["kl.coef=0.1"]})
    with pytest.raises(ValidationError, match="reward.functions: required"):  # no reward model, no functions
        validate(rlhf, {"use_reward_model": False, "reward_functions": []})


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_a_local_run_with_a_typo_fails_in_seconds_and_writes_nothing(tmp_path, capsys):
    start = time.monotonic()
    rc = posttrain(
        [
            "pipeline",
            "run",
            "--pipeline",
            "posttrain-all",
            "--root",
            str(tmp_path / "runs"),
            'dpo_overrides=["betta=0.2"]',
        ]
    )
    assert rc == 2 and time.monotonic() - start < 5
    assert "task 'DPO' (posttrain dpo): betta: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_submit_refuses_before_contacting_the_server(capsys):
    rc = posttrain(
        [
            "pipeline",
            "submit",
            "--host",
            "http://127.0.0.1:9",
            "--pipeline",
            "posttrain-dpo",
            'sft_overrides=["max_stepz=3"]',
        ]
    )
    assert rc == 2 and "max_stepz: unknown key" in capsys.readouterr().err
