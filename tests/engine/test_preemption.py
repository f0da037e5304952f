"""SIGTERM's bound, and several ranks stopping together.

The bit-exact resume after SIGTERM at a step boundary, in the middle of a step and during a save is
in tests/engine/test_kill_resume.py; here: a stop that cannot finish within ``preemption.grace_s``
(the process held inside a save for good) still ends within that bound with status 75 and leaves no
checkpoint that resume would take; and under ``--nproc 2`` a SIGTERM to one rank, and one to the
launcher, each stop both ranks at the same step with a complete checkpoint of it, from which the
rerun ends bit-exact.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env
from tests.stages.training.rl_helpers import one_thread
from trainer_lib.cli import main
from trainer_lib.engine.checkpoint import MARKER, tag_for
from trainer_lib.engine.preemption import PREEMPTED_EXIT


def _sft(tiny_model_dir, chat_jsonl, out, *extra) -> list[str]:
    return [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        "batch_size=2",
        "data.max_length=64",
        "data.packing=false",
        "save_steps=2",
        "logging_steps=1",
        "lr=3e-3",
        "seed=1",
        f"output_dir={out}",
        *extra,
    ]


def _env() -> dict:
    env = clean_env()
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p))
    return env


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_a_stop_that_overruns_its_grace_period_exits_75_within_it(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    out, ready = tmp_path / "run", tmp_path / "held"
    argv = _sft(tiny_model_dir, chat_jsonl, out, "max_steps=6", "preemption.grace_s=2")
    held = f"{re.escape(str(out / 'checkpoints' / tag_for(4)))}/{MARKER}$"  # step 4's files written, never its marker
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.paused_cli", "rename", held, str(ready), "--", *argv],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.02)
        signalled = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=30)[0]
        took = time.monotonic() - signalled
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == PREEMPTED_EXIT, output[-3000:]
    assert 2.0 <= took < 10.0, took
    assert output.strip().splitlines()[-1].startswith("preempted: not stopped within preemption.grace_s=2 s")
    assert not (out / "checkpoints" / tag_for(4) / MARKER).exists()

    with one_thread():  # the retry: from step 2, the newest complete checkpoint
        assert main(argv) == 0
    assert "resuming at step 2" in capsys.readouterr().out


def _train_records(log) -> int:
    return log.read_text().count('"split": "train"') if log.exists() else 0


def _stop_with_sigterm(argv: list[str], cwd, to_rank1: bool, after: int) -> tuple[int, str]:
    """Start ``posttrain ... --nproc 2``; once ``after`` train records are logged, SIGTERM rank 1 alone
    or the launcher (as Kubernetes signals a pod's first process); its exit status and output."""
    import psutil

    log = cwd / "run" / "metrics.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer_lib.cli", *argv],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while _train_records(log) < after:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.01)
        if to_rank1:
            ranks = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
            assert len(ranks) == 1
            ranks[0].send_signal(signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, output


@pytest.mark.distributed
@pytest.mark.extended
def test_sigterm_under_nproc_stops_every_rank_at_the_same_step(tiny_model_dir, chat_jsonl, tmp_path):
    """SIGTERM to rank 1 alone (rank 0 learns of it in the step-end all-reduce), then to the launcher
    (which passes it on through torchrun to every rank): each time both ranks save that step and the
    job exits 75; the last rerun's weights equal an uninterrupted two-process run's."""
    from safetensors.torch import load_file

    common = ["--nproc", "2", "max_steps=60", "engine.zero_stage=2", "save_steps=20"]
    reference = _sft(tiny_model_dir, chat_jsonl, tmp_path / "reference", *common)
    argv = _sft(tiny_model_dir, chat_jsonl, tmp_path / "run", *common)
    command = [sys.executable, "-m", "trainer_lib.cli"]
    done = subprocess.run([*command, *reference], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    stopped = 0
    for to_rank1 in (True, False):
        code, output = _stop_with_sigterm(argv, tmp_path, to_rank1, after=stopped + 3)
        stops = re.findall(r"preempted: sft: SIGTERM: stopped after step (\d+) of 60", output)
        assert code == PREEMPTED_EXIT and stops and len(set(stops)) == 1, output[-3000:]  # (one line per rank)
        assert f"resuming at step {stopped}" in output or stopped == 0, output[-3000:]
        stopped = int(stops[0])
        assert 3 <= stopped < 60 and (tmp_path / "run" / "checkpoints" / tag_for(stopped) / MARKER).exists()

    again = subprocess.run([*command, *argv], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and f"resuming at step {stopped}" in again.stdout, again.stderr[-3000:]
    a, b = load_file(tmp_path / "reference" / "model.safetensors"), load_file(tmp_path / "run" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
