"""A rank killed in a two-process run ends the job quickly, in one line, and the rerun resumes bit-exact.

The workers are real torchrun processes (gloo on CPU). Rank 1 is held by :mod:`tests.paused_cli`'s
audit hook (installed in that worker through a ``sitecustomize`` module on its PYTHONPATH) as it
creates the directory of step 4's checkpoint, so rank 0 is waiting on it in a collective; the test
SIGKILLs rank 1 there and times the launcher's exit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from tests.conftest import REPO
from tests.paused_cli import worker_env
from trainer_lib.engine.checkpoint import MARKER, tag_for

pytestmark = pytest.mark.distributed

ARGS = [
    "batch_size=2",
    "data.max_length=64",
    "data.packing=false",
    "lr=3e-3",
    "seed=1",
    "max_steps=6",
    "save_steps=2",
    "save_total_limit=2",
    "logging_steps=1",
    "eval_steps=0",
]


def _posttrain(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "sft", "--nproc", "2", *argv],
        cwd=REPO,
        env=env,
        timeout=300,
        capture_output=True,
        text=True,
    )


def _weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


@pytest.fixture(scope="module")
def killed(tiny_model_dir, chat_jsonl, tmp_path_factory):
    """A two-process run whose rank 1 was SIGKILLed at step 4's checkpoint: its argv, directories, the
    launcher's exit status and output, the seconds from the kill to its exit, and the two workers."""
    tmp_path = tmp_path_factory.mktemp("dead_rank")
    argv = [f"model.path={tiny_model_dir}", f"data.path={chat_jsonl}", *ARGS]
    out, ready, log = tmp_path / "run", tmp_path / "held", tmp_path / "killed.log"
    env = worker_env(tmp_path, HOLD_RANK="1", HOLD_EVENT="mkdir", HOLD_PATTERN=tag_for(4) + "$", HOLD_READY=str(ready))
    env["POSTTRAIN_COLLECTIVE_TIMEOUT_S"] = "24"  # a waiting rank says so after 24 / 8 = 3 s
    with open(log, "w") as fh:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "trainer_lib.cli", "sft", "--nproc", "2", *argv, f"output_dir={out}"],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():
            if launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"rank 1 never reached step 4 (exit {launcher.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        waiting = f"rank 0: still saving checkpoint {tag_for(4)} (its barriers wait for every rank)"
        while waiting not in log.read_text():  # no silent wait: rank 0, in the save's barrier, says so
            if launcher.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"rank 0 never said it waits (exit {launcher.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        children = psutil.Process(launcher.pid).children(recursive=True)
        workers = {int(p.environ()["RANK"]): p for p in children if p.environ().get("RANK")}
        assert sorted(workers) == [0, 1]
        killed_at = time.monotonic()
        workers[1].kill()
        launcher.wait(timeout=60)  # bounded: the survivor never hangs in its collective
        took = time.monotonic() - killed_at
    finally:
        launcher.kill()
        launcher.wait()
    return dict(
        argv=argv, tmp=tmp_path, out=out, code=launcher.returncode, log=log.read_text(), took=took, workers=workers
    )


def test_a_killed_rank_ends_the_job_in_one_line(killed):
    text = killed["log"]
    assert killed["code"] == 1, text[-3000:]
    assert killed["took"] < 30, f"{killed['took']:.1f} s"
    errors = [line for line in text.splitlines() if "error:" in line]
    assert errors[-1] == (
        f"error: rank 1 (pid {killed['workers'][1].pid}) was killed by SIGKILL; the other rank(s) 0 were stopped; "
        "the job ended. Run the same command again to resume from the last complete checkpoint."
    ), text[-3000:]
    # the survivor, if its broken collective fails before torchrun stops it, says so in one line too
    assert all(line.startswith("error: rank 0: a collective with the other ranks failed") for line in errors[:-1])
    waiting = (
        f"rank 0: still saving checkpoint {tag_for(4)} (its barriers wait for every rank) (a collective gives up "
        "after 24 s, $POSTTRAIN_COLLECTIVE_TIMEOUT_S)"
    )
    assert waiting in text.splitlines(), [repr(line) for line in text.splitlines() if "still saving" in line]
    assert "Traceback" not in text, text[-3000:]  # neither torchrun's ChildFailedError nor the survivor's
    assert not killed["workers"][0].is_running()
    assert os.path.exists(killed["out"] / "checkpoints" / tag_for(2) / MARKER)
    assert not os.path.exists(killed["out"] / "summary.json")


@pytest.mark.extended  # 3 more two-process runs; the one-process kill-resume cases cover the checkpoint code
def test_the_rerun_after_a_dead_rank_resumes_bit_exact(killed):
    argv, tmp_path, out = killed["argv"], killed["tmp"], killed["out"]
    plain = worker_env(tmp_path)
    rerun = _posttrain([*argv, f"output_dir={out}"], plain)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert re.search(r"resuming at step 2\b", rerun.stdout + rerun.stderr)
    reference = _posttrain([*argv, f"output_dir={tmp_path / 'reference'}"], plain)
    assert reference.returncode == 0, reference.stderr[-3000:]
    resumed, uninterrupted = _weights(out), _weights(tmp_path / "reference")
    assert resumed.keys() == uninterrupted.keys()
    for key in resumed:
        assert torch.equal(resumed[key], uninterrupted[key]), key


def test_the_launcher_blames_the_rank_that_died_not_those_it_stopped():
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from trainer_lib.engine.collectives import LOST_PEER_EXIT
    from trainer_lib.engine.launch import failure_line

    def failures(**codes):  # rank<N>=exit code (negative: killed by that signal)
        return {int(k[4:]): ProcessFailure(int(k[4:]), 100 + int(k[4:]), code, "<N/A>") for k, code in codes.items()}

    # rank 0 lost its peer (or was stopped by torchrun), rank 2 was stopped: rank 1's SIGKILL is the cause
    for survivor in (LOST_PEER_EXIT, -15):
        line, code = failure_line(failures(rank0=survivor, rank1=-9, rank2=-15))
        assert line.startswith("rank 1 (pid 101) was killed by SIGKILL; the other rank(s) 0, 2 were stopped;")
        assert code == 1
    # a rank that failed of its own accord keeps its status (2: a user error, printed by that rank)
    assert failure_line(failures(rank0=-15, rank1=2)) == (
        "rank 1 (pid 101) exited with status 2; the other rank(s) 0 were stopped",
        2,
    )


def test_the_collective_timeout_is_configurable(monkeypatch):
    from trainer_lib.engine.collectives import COLLECTIVE_TIMEOUT_ENV, collective_timeout
    from trainer_lib.errors import ConfigError

    monkeypatch.delenv(COLLECTIVE_TIMEOUT_ENV, raising=False)
    assert collective_timeout().total_seconds() == 600
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "45")
    assert collective_timeout().total_seconds() == 45
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "0")
    with pytest.raises(ConfigError, match="POSTTRAIN_COLLECTIVE_TIMEOUT_S: expected a positive number"):
        collective_timeout()


@pytest.mark.extended  # one more two-process run; the ranks' own SIGTERM handling is tests/engine/test_preemption.py
def test_sigterm_to_the_launcher_reaches_every_rank(tiny_model_dir, chat_jsonl, tmp_path):
    """A pod's SIGTERM goes to the `posttrain` process that started torchrun: the ranks get it too, save the
    same step and the launcher exits with the retryable status."""
    from trainer_lib.engine.preemption import PREEMPTED_EXIT

    out = tmp_path / "run"
    argv = [f"model.path={tiny_model_dir}", f"data.path={chat_jsonl}", *ARGS, f"output_dir={out}"]
    argv = [a for a in argv if not a.startswith(("max_steps=", "save_steps="))] + ["max_steps=40", "save_steps=10"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer_lib.cli", "sft", "--nproc", "2", *argv],
        cwd=REPO,
        env=worker_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log, deadline = out / "metrics.jsonl", time.monotonic() + 240
        while not (log.exists() and log.read_text().count('"split": "train"') >= 3):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0][-3000:]
            time.sleep(0.01)
        launcher.send_signal(signal.SIGTERM)
        output = launcher.communicate(timeout=120)[0]
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == PREEMPTED_EXIT, output[-3000:]
    assert "preempted: the launcher got SIGTERM and passed it on to every rank" in output
    stops = set(re.findall(r"stopped after step (\d+) of 40", output))
    assert len(stops) == 1, output[-3000:]
    assert (out / "checkpoints" / tag_for(int(stops.pop())) / MARKER).exists()
    assert "Traceback" not in output, output[-3000:]


def test_a_slow_wait_says_so_in_one_write(monkeypatch):
    """The ranks of a job share one log: a line written as text, then newline, merges with another rank's
    (seen as two ranks' waits on one line); each line goes in one write."""
    import io

    from trainer_lib.engine.collectives import COLLECTIVE_TIMEOUT_ENV, said_if_slow

    class Writes(io.StringIO):
        def __init__(self):
            super().__init__()
            self.calls = []

        def write(self, text):
            self.calls.append(text)
            return super().write(text)

    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "0.8")  # says so after 0.1 s
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setattr(sys, "stderr", Writes())
    with said_if_slow("saving checkpoint step-00000004"):
        deadline = time.monotonic() + 10
        while not sys.stderr.calls and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sys.stderr.calls == [
        "rank 3: still saving checkpoint step-00000004 (a collective gives up after 0.8 s, "
        "$POSTTRAIN_COLLECTIVE_TIMEOUT_S)\n"
    ]
    with said_if_slow("quick"):
        pass
    time.sleep(0.3)
    assert len(sys.stderr.calls) == 1  # a wait shorter than say_after() says nothing
