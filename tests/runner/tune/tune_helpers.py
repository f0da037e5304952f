"""Search files for the tests of ``posttrain tune``: a DPO search whose trials run the real stage or
fake_stage.py."""

import os
import subprocess
import sys

import yaml

from tests.conftest import REPO

FAKE_STAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_stage.py")


def search_file(tmp_path, fake: bool = True, **changes) -> str:
    """A tune.yaml of a DPO search over lr and beta ranked by logps/accuracy, with ``changes`` laid over
    its top-level keys (``space``, ``objective`` and ``overrides`` replace theirs whole)."""
    search = {
        "stage": "dpo",
        "overrides": {
            "model.path": str(tmp_path / "model"),
            "data.path": str(tmp_path / "train.jsonl"),
            "data.eval_path": str(tmp_path / "eval.jsonl"),
            "max_steps": 6,
            "eval_steps": 2,
        },
        "space": {"lr": {"low": 1.0e-4, "high": 1.0e-1, "log": True}, "beta": {"low": 0.05, "high": 0.5}},
        "objective": {"metric": "logps/accuracy", "direction": "maximize"},
        "n_trials": 4,
        "parallel": 2,
        "output_dir": str(tmp_path / "search"),
        "heartbeat_s": 2,
        "pruner": {"kind": "none"},
        **({"trial_command": [sys.executable, FAKE_STAGE]} if fake else {}),
        **changes,
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(search))
    return str(path)


def run_tune(path: str, *overrides: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``posttrain tune --config path`` in a process of its own (it installs signal handlers)."""
    return subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "tune", "--config", path, *overrides],
        cwd=REPO,
        env={**os.environ, "POSTTRAIN_NO_PROGRESS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_tune(path: str, env: dict) -> subprocess.Popen:
    """``posttrain tune --config path`` in a session of its own (its process group is what a kill hits), quiet."""
    return subprocess.Popen(
        [sys.executable, "-m", "trainer_lib.cli", "tune", "--config", path],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
