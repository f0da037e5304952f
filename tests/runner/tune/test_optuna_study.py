"""The search itself, on fake_stage.py (a trial in well under a second): trials in parallel, a failed
trial recorded with its reason, pruning, the results, and a search killed with SIGKILL that a rerun
finishes without an orphan process (also when it dies between a trial's start and the reaper's knowing
it)."""

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from tests.conftest import REPO
from tests.runner.tune.tune_helpers import run_tune, search_file, start_tune


def results(tmp_path) -> dict:
    return json.loads((tmp_path / "search" / "results.json").read_text())


def starts(tmp_path, number: int) -> int:
    path = tmp_path / "search" / "trials" / f"{number:04d}" / "starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_search_records_a_failed_trial_and_writes_the_best_config(tmp_path):
    path = search_file(tmp_path)
    done = run_tune(path, env={"FAKE_STAGE_FAIL_TRIAL": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    found = results(tmp_path)
    states = {t["number"]: t["state"] for t in found["trials"]}
    assert states == {0: "complete", 1: "failed", 2: "complete", 3: "complete"}
    failed = found["trials"][1]
    assert "loss or gradient is not finite" in failed["reason"]
    assert "trial 1 (" in done.stdout and "failed: dpo: step 1: loss or gradient is not finite" in done.stdout
    complete = [t for t in found["trials"] if t["state"] == "complete"]
    best = max(complete, key=lambda t: t["value"])
    assert found["best"]["trial"] == best["number"] and found["best"]["value"] == best["value"]
    # best.yaml is a config posttrain dpo takes, with the best trial's values and seed
    from trainer_lib.runner.stage_api import stage_config

    cfg = stage_config("dpo", config_files=[found["best"]["config"]])
    assert cfg.lr == best["params"]["lr"] and cfg.beta == best["params"]["beta"] and cfg.seed == best["seed"]
    assert cfg.output_dir == str(tmp_path / "search" / "best")
    report = (tmp_path / "search" / "report.html").read_text()
    assert "Parameter importances" in report and "data:image/png;base64," in report
    assert set(found["importances"]) == {"lr", "beta"}
    # a rerun finds the count done: nothing runs again
    again = run_tune(path, env={"FAKE_STAGE_FAIL_TRIAL": "1"})
    assert again.returncode == 0 and "0 of 4 trials to run" in again.stdout
    assert [starts(tmp_path, n) for n in range(4)] == [1, 1, 1, 1]


def test_median_pruner_stops_trials_worse_than_the_median_at_the_same_step(tmp_path):
    path = search_file(tmp_path, parallel=1, n_trials=3, pruner={"kind": "median", "startup_trials": 1})
    done = run_tune(path, env={"FAKE_STAGE_WORSE_EACH_TRIAL": "1", "FAKE_STAGE_STEP_S": "0.1"})
    assert done.returncode == 0, done.stderr[-2000:]
    trials = results(tmp_path)["trials"]
    assert [t["state"] for t in trials] == ["complete", "pruned", "pruned"]
    assert trials[1]["pruned_at"] == 2 and not (tmp_path / "search" / "trials" / "0001" / "summary.json").exists()


def marked_processes(tmp_path) -> list[int]:
    """Processes whose environment names a trial config under tmp_path."""
    needle = f"POSTTRAIN_TUNE_TRIAL={tmp_path}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_search_killed_by_sigkill_leaves_no_process_and_a_rerun_finishes_it(tmp_path):
    path = search_file(tmp_path, n_trials=4, parallel=2)
    env = {**os.environ, "POSTTRAIN_NO_PROGRESS": "1", "FAKE_STAGE_STEP_S": "0.3", "FAKE_STAGE_CHILD": "1"}
    search = start_tune(path, env)
    trials = tmp_path / "search" / "trials"
    try:
        # one trial finished, a later one mid-way (it has started, with eval records, and no summary)
        wait_for(lambda: (trials / "0000" / "summary.json").exists(), 60, "trial 0")
        running = lambda: [  # noqa: E731
            d.name
            for d in sorted(trials.iterdir())
            if (d / "metrics.jsonl").exists() and not (d / "summary.json").exists()
        ]
        wait_for(running, 60, "a running trial")
        assert marked_processes(tmp_path)
    finally:
        os.killpg(search.pid, signal.SIGKILL)
        search.wait()
    interrupted = running()
    finished = [d.name for d in sorted(trials.iterdir()) if (d / "summary.json").exists()]
    # the reaper kills the trials' process groups, their children too (a trial that got away would leave
    # fake_stage's child sleeping 300 s); the bound is for a loaded machine, not for the reaper's speed
    wait_for(lambda: not marked_processes(tmp_path), 60, "the trials' processes to end")

    done = run_tune(path, env={"FAKE_STAGE_STEP_S": "0.02"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "were running when the search stopped: queued again" in done.stdout
    found = results(tmp_path)["trials"]
    counted = [t for t in found if t["state"] in ("complete", "pruned", "failed")]
    assert len(counted) == 4 and all(t["state"] == "complete" for t in counted)
    by_number = {t["number"]: t for t in found}
    for name in interrupted:
        assert by_number[int(name)]["state"] == "interrupted"
        retries = [t for t in found if t["retry_of"] == int(name)]
        assert len(retries) == 1 and retries[0]["state"] == "complete"
        assert retries[0]["params"] == by_number[int(name)]["params"]
    for name in finished:
        assert starts(tmp_path, int(name)) == 1, f"finished trial {name} ran again"
    assert not marked_processes(tmp_path)


def test_a_search_that_dies_before_the_reaper_has_a_trial_leaves_it_unrun(tmp_path):
    """The window between a trial's start and the reaper's knowing its group, where the search above can
    be killed: here the search dies in it for sure (``on_start`` exits), and the trial never runs its
    command, as it waits for a go-ahead that only comes after ``on_start``."""
    ran = tmp_path / "ran"
    trial = f"open({str(ran)!r}, 'w')"
    script = "\n".join(
        [
            "import os, sys",
            "from trainer_lib.runner.tune.trial_process import TrialProcess",
            f"command = [sys.executable, '-c', {trial!r}]",
            f"TrialProcess(command, {str(tmp_path / 'trial')!r}, marker={str(tmp_path / 'config.yaml')!r},"
            " on_start=lambda pgid: os._exit(9))",
        ]
    )
    search = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert search.returncode == 9, search.stderr[-2000:]
    wait_for(lambda: not marked_processes(tmp_path), 60, "the held trial to end")
    assert not ran.exists()


def test_trial_timeout_fails_the_trial_with_its_reason(tmp_path):
    path = search_file(tmp_path, n_trials=1, parallel=1, trial_timeout_s=0.5)
    done = run_tune(path, env={"FAKE_STAGE_STEP_S": "1"})
    assert done.returncode == 1 and "no trial finished" in done.stdout
    (trial,) = results(tmp_path)["trials"]
    assert trial["state"] == "failed" and trial["reason"] == "timed out after 0.5 s (trial_timeout_s)"
    assert results(tmp_path)["best"] is None
    assert yaml.safe_load(open(path))["n_trials"] == 1


def test_the_pruner_reads_pruner_metric_the_way_pruner_direction_says(tmp_path):
    """The trials get worse each time in logps/accuracy; read as a metric to minimize, they look better,
    so the median pruner stops none of them (with the objective's direction it stops both, above)."""
    pruner = {"kind": "median", "startup_trials": 1, "metric": "logps/accuracy", "direction": "minimize"}
    path = search_file(tmp_path, parallel=1, n_trials=3, pruner=pruner)
    done = run_tune(path, env={"FAKE_STAGE_WORSE_EACH_TRIAL": "1", "FAKE_STAGE_STEP_S": "0.1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert [t["state"] for t in results(tmp_path)["trials"]] == ["complete", "complete", "complete"]
