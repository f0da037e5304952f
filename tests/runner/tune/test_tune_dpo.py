"""A real search: DPO on a tiny model, 4 trials of a few steps, 2 at once; the best config, run again
with its seed, gives the best trial's figure. About a minute on two loaded cores: extended."""

import json

import pytest

from tests.runner.tune.tune_helpers import run_tune, search_file
from tests.stages.training.test_dpo import synthetic_pairs, write_jsonl


@pytest.mark.extended
def test_dpo_search_and_its_best_config_reproduces_the_best_figure(tmp_path):
    from trainer_lib.demo.tiny_model import make_tiny_model

    train, held_out = synthetic_pairs(16, seed=0), synthetic_pairs(8, seed=1)
    texts = [r["prompt"][0]["content"] + " " + r["chosen"][0]["content"] for r in train] * 10
    make_tiny_model(str(tmp_path / "model"), texts, vocab_size=300, num_layers=2, hidden_size=64)
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "eval.jsonl", held_out)
    overrides = {
        "model.path": str(tmp_path / "model"),
        "data.path": str(tmp_path / "train.jsonl"),
        "data.eval_path": str(tmp_path / "eval.jsonl"),
        "batch_size": 4,
        "eval_batch_size": 8,
        "max_steps": 4,
        "eval_steps": 2,
        "save_steps": 0,
        "report_to": ["none"],
    }
    space = {"lr": {"low": 1e-4, "high": 1e-2, "log": True}, "warmup_steps": {"low": 0, "high": 2}}
    path = search_file(
        tmp_path,
        fake=False,
        overrides=overrides,
        space=space,
        objective={"metric": "eval_loss", "direction": "minimize"},
        pruner={"kind": "median", "startup_trials": 1},
    )
    done = run_tune(path, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((tmp_path / "search" / "results.json").read_text())
    assert len([t for t in found["trials"] if t["state"] in ("complete", "pruned")]) == 4
    best = found["best"]
    trial_summary = json.loads((tmp_path / "search" / "trials" / f"{best['trial']:04d}" / "summary.json").read_text())
    assert trial_summary["eval"]["loss"] == best["value"]

    from trainer_lib.cli import main

    assert main(["dpo", "--config", best["config"]]) == 0
    rerun = json.loads((tmp_path / "search" / "best" / "summary.json").read_text())
    assert rerun["eval"]["loss"] == pytest.approx(best["value"], rel=1e-6, abs=1e-7)
