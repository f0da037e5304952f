"""What the model-, pipeline- and sequence-parallel tests share: a stage on N torchrun workers, its saved
weights and logged metrics, and a run killed with SIGKILL at the moment a held worker signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import REPO, repeatable


def stage_command(stage: str, argv: list[str], nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "trainer_lib.cli", stage, "--nproc", str(nproc), *argv]


def run_stage(stage: str, argv: list[str], env: dict, nproc: int = 2) -> str:
    """``posttrain <stage> --nproc N``; its output, after asserting that it exited 0."""
    done = subprocess.run(
        stage_command(stage, argv, nproc), cwd=REPO, env=env, timeout=300, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def weights(out) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(out, "model.safetensors"))


def metrics(out) -> list[dict]:
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")]
    return [repeatable(r) for r in rows]


def series(out, key: str, split: str = "train") -> list[float]:
    return [row[key] for row in metrics(out) if key in row and row["split"] == split]


def kill_when_held(command: list[str], env: dict, ready, timeout: float = 240) -> None:
    """Start ``command`` (a launcher whose held worker writes ``ready``, see tests.paused_cli), wait for the file,
    then SIGKILL every worker and the launcher."""
    launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while not ready.exists():
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stdout.read().decode()[-3000:]
            time.sleep(0.05)
        for worker in psutil.Process(launcher.pid).children(recursive=True):
            worker.send_signal(signal.SIGKILL)
    finally:
        launcher.kill()
        launcher.wait()
