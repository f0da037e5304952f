"""A child that starts a process group of its own gets none of its parent's group variables."""

import os
import subprocess
import sys

from trainer_lib.engine.process_group import LAUNCHER_ENV, own_group_env

PARENT = {
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "49499",
    "POSTTRAIN_SOLO_PID": "123",
    "TORCHELASTIC_RUN_ID": "r1",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "HF_HOME": "/cache",
}


def test_the_group_variables_are_dropped_and_the_rest_kept():
    assert own_group_env(PARENT) == {"HF_HOME": "/cache"}
    assert {"RANK", "MASTER_PORT", "POSTTRAIN_SOLO_PID"} <= set(LAUNCHER_ENV)


def test_a_child_started_with_it_sees_no_group(monkeypatch):
    for key, value in PARENT.items():
        monkeypatch.setenv(key, value)
    code = "import os; print(sorted(k for k in os.environ if k in {keys!r} or k.startswith('TORCHELASTIC')))"
    keys = set(PARENT) - {"HF_HOME"}
    seen = subprocess.run(
        [sys.executable, "-c", code.format(keys=keys)], env=own_group_env(), capture_output=True, text=True, check=True
    ).stdout
    assert seen.strip() == "[]"
    assert os.environ["MASTER_PORT"] == "49499"  # the parent's own environment is left as it is
