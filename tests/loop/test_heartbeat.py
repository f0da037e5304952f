"""heartbeat.json: running, finished, failed, and stale once a SIGKILLed stage stops beating."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env
from tests.stages.training.rl_helpers import LENGTH_REWARD, write_prompts
from trainer_lib.dashboard.runs import find_runs, summarize
from trainer_lib.loop.heartbeat import Heartbeat, run_state


def test_run_state_reads_the_heartbeat():
    now = 1000.0
    beat = {"state": "running", "updated": now - 5, "interval_s": 10.0}
    assert run_state(beat, finished=False, now=now) == "running"
    assert run_state({**beat, "updated": now - 31}, finished=False, now=now) == "stale"  # 3 intervals missed
    assert run_state({**beat, "updated": now - 29}, finished=False, now=now) == "running"
    assert run_state({**beat, "state": "preempted", "updated": 0}, finished=False, now=now) == "preempted"
    assert run_state({**beat, "state": "failed"}, finished=False, now=now) == "failed"
    assert run_state({**beat, "updated": 0}, finished=True, now=now) == "finished"  # the model is complete
    assert run_state(None, finished=False) == "unknown"
    assert run_state({"state": "running", "updated": "soon"}, finished=False) == "unknown"
    assert run_state({"state": "exploded"}, finished=False) == "unknown"


def test_a_heartbeat_beats_until_it_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_HEARTBEAT_S", "0.1")
    beat = Heartbeat(str(tmp_path), "sft", total_steps=10, config={"lr": 0.1})
    beat.start(0)
    first = json.loads((tmp_path / "heartbeat.json").read_text())
    beat.step(4)
    time.sleep(0.5)
    later = json.loads((tmp_path / "heartbeat.json").read_text())
    assert later["updated"] > first["updated"] and later["step"] == 4 and later["state"] == "running"
    beat.end("finished")
    beat.end("failed")  # (only the first end counts)
    final = json.loads((tmp_path / "heartbeat.json").read_text())
    assert final["state"] == "finished" and final["config"] == {"lr": 0.1} and final["pid"] == os.getpid()
    time.sleep(0.3)
    assert json.loads((tmp_path / "heartbeat.json").read_text())["updated"] == final["updated"]  # no more beats


def test_a_stage_whose_loop_raises_says_failed(tiny_model_dir, tmp_path):
    from trainer_lib.cli import main

    reward = tmp_path / "reward.py"
    reward.write_text(
        "def reward(prompts, completions, trainer_state, **kw):\n"
        "    if trainer_state.global_step >= 2:\n"
        "        raise RuntimeError('the reward server went away')\n"
        "    return [0.0] * len(completions)\n"
    )
    out = tmp_path / "grpo"
    args = ["grpo", f"model.path={tiny_model_dir}", f"data.path={write_prompts(tmp_path / 'p.jsonl')}"]
    args += [
        f"output_dir={out}",
        f"reward.functions={reward}:reward",
        "rollout.n=2",
        "prompts_per_step=2",
        "batch_size=4",
    ]
    args += ["rollout.max_new_tokens=4", "max_steps=5", "logging_steps=1", "save_steps=0", "data.eval_fraction=0"]
    with pytest.raises(RuntimeError, match="went away"):
        main(args)
    beat = json.loads((out / "heartbeat.json").read_text())
    assert beat["state"] == "failed" and beat["step"] == 2
    assert summarize(find_runs([str(tmp_path)])["0/grpo"])["status"] == "failed"


def test_a_sigkilled_stage_shows_as_stale(tiny_model_dir, tmp_path):
    out = tmp_path / "grpo"
    args = [sys.executable, "-m", "trainer_lib.cli", "grpo", f"model.path={tiny_model_dir}"]
    args += [
        f"data.path={write_prompts(tmp_path / 'p.jsonl')}",
        f"output_dir={out}",
        f"reward.functions={LENGTH_REWARD}",
    ]
    args += ["rollout.n=2", "prompts_per_step=2", "batch_size=4", "rollout.max_new_tokens=4", "max_steps=100000"]
    args += ["save_steps=0", "logging_steps=1", "data.eval_fraction=0", "report_to=none"]
    env = {**clean_env(), "POSTTRAIN_HEARTBEAT_S": "0.2", "OMP_NUM_THREADS": "1", "POSTTRAIN_NO_PROGRESS": "1"}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    path = out / "heartbeat.json"
    try:
        deadline = time.monotonic() + 120
        while not (path.exists() and json.loads(path.read_text())["step"] >= 2):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no heartbeat at step 2 within 120 s"
            time.sleep(0.1)
        run = find_runs([str(tmp_path)])["0/grpo"]
        assert summarize(run)["status"] == "running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    killed = json.loads(path.read_text())
    time.sleep(1.0)  # five beats missed
    assert json.loads(path.read_text()) == killed and killed["state"] == "running"
    row = summarize(find_runs([str(tmp_path)])["0/grpo"])
    assert row["status"] == "stale" and row["stage"] == "grpo" and row["step"] >= 2


def test_an_error_inside_failing_ends_the_heartbeat_failed(tmp_path):
    beat = Heartbeat(str(tmp_path), "dpo", total_steps=3)
    beat.start(0)
    with pytest.raises(ValueError), beat.failing():
        raise ValueError("the step-0 evaluation's reward function is broken")
    assert json.loads((tmp_path / "heartbeat.json").read_text())["state"] == "failed"
    with beat.failing():
        pass  # (nothing raised: nothing changes)
    beat.end("finished")
    assert json.loads((tmp_path / "heartbeat.json").read_text())["state"] == "failed"
