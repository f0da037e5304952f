"""A real search whose objective comes from an evaluate run on each trial's model: SFT on a tiny model,
2 trials, each followed by ``posttrain evaluate`` on 3 held-out code tasks; each trial's value is its
evaluate run's metrics.json figure (about a minute on two loaded cores: extended); and a search killed by
SIGKILL mid-evaluate, on fake_stage.py and a real evaluate, which a rerun finishes (under 30 s)."""

import json
import os
import signal

import pytest

from tests.runner.tune.test_optuna_study import marked_processes, wait_for
from tests.runner.tune.tune_helpers import run_tune, search_file, start_tune


@pytest.mark.extended
def test_a_search_ranked_by_an_evaluate_metric_takes_each_trials_evaluate_figure(
    tmp_path, tiny_model_dir, chat_jsonl, demo_dir
):
    tasks = open(os.path.join(demo_dir, "code_tasks_eval.jsonl")).read().splitlines()[:3]
    (tmp_path / "tasks.jsonl").write_text("\n".join(tasks) + "\n")
    overrides = {
        "model.path": tiny_model_dir,
        "data.path": chat_jsonl,
        "max_steps": 2,
        "batch_size": 4,
        "eval_steps": 0,
        "save_steps": 0,
        "report_to": ["none"],
    }
    path = search_file(
        tmp_path,
        fake=False,
        stage="sft",
        overrides=overrides,
        space={"lr": {"low": 1e-4, "high": 1e-2, "log": True}},
        objective={"metric": "style_violations_mean", "direction": "minimize"},
        evaluate={"tasks.path": str(tmp_path / "tasks.jsonl"), "tasks.max_new_tokens": 16, "humaneval.enabled": False},
        n_trials=2,
        parallel=2,
        pruner={"kind": "median"},
    )
    done = run_tune(path, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    found = json.loads((tmp_path / "search" / "results.json").read_text())
    assert [t["state"] for t in found["trials"]] == ["complete", "complete"]
    for row in found["trials"]:
        trial_dir = tmp_path / "search" / "trials" / f"{row['number']:04d}"
        evaluated = json.loads((trial_dir / "evaluate" / "metrics.json").read_text())
        assert evaluated["paths"]["trial"] == str(trial_dir)
        assert row["value"] == evaluated["models"]["trial"]["style_violations_mean"]
    assert found["best"]["value"] == min(row["value"] for row in found["trials"])


def test_a_search_killed_mid_evaluate_retries_the_trial(tmp_path, tiny_model_dir, demo_dir):
    """SIGKILL to the search's process group while a trial's evaluate runs: nothing of it is left running,
    and a rerun runs that trial again (stage and evaluate) with the same values."""
    tasks = open(os.path.join(demo_dir, "code_tasks_eval.jsonl")).read().splitlines()[:2]
    (tmp_path / "tasks.jsonl").write_text("\n".join(tasks) + "\n")
    path = search_file(
        tmp_path,
        objective={"metric": "task_pass_rate"},
        evaluate={"tasks.path": str(tmp_path / "tasks.jsonl"), "tasks.max_new_tokens": 8, "humaneval.enabled": False},
        n_trials=1,
        parallel=1,
    )
    env = {**os.environ, "POSTTRAIN_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "FAKE_STAGE_MODEL": tiny_model_dir}
    search = start_tune(path, env)
    evaluating = tmp_path / "search" / "trials" / "0000" / "evaluate" / "trial.log"
    try:
        wait_for(evaluating.exists, 120, "trial 0's evaluate")
        assert marked_processes(tmp_path)
    finally:
        os.killpg(search.pid, signal.SIGKILL)
        search.wait()
    wait_for(lambda: not marked_processes(tmp_path), 10, "the evaluate's processes to end")
    assert not (evaluating.parent / "metrics.json").exists()

    done = run_tune(path, env={"OMP_NUM_THREADS": "1", "FAKE_STAGE_MODEL": tiny_model_dir})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    trials = json.loads((tmp_path / "search" / "results.json").read_text())["trials"]
    assert [(t["number"], t["state"], t["retry_of"]) for t in trials] == [(0, "interrupted", None), (1, "complete", 0)]
    assert trials[1]["params"] == trials[0]["params"]
    evaluated = json.loads((tmp_path / "search" / "trials" / "0001" / "evaluate" / "metrics.json").read_text())
    assert trials[1]["value"] == evaluated["models"]["trial"]["task_pass_rate"]
    assert not marked_processes(tmp_path)
