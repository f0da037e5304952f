"""No silent waits on the data cache: a stage blocked by another process's build says who it waits for,
then gives up with one error line after ``$POSTTRAIN_LOCK_WAIT_S``."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env
from trainer_lib.cli import main
from trainer_lib.storage import file_lock

ARGS = ["batch_size=2", "data.max_length=64", "max_steps=1", "save_steps=0", "eval_steps=0"]


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_a_stage_waiting_on_the_cache_lock_says_so_and_gives_up(
    tiny_model_dir, chat_jsonl, tmp_path, monkeypatch, caplog, capsys
):
    argv = ["sft", f"model.path={tiny_model_dir}", f"data.path={chat_jsonl}", *ARGS]
    ready = tmp_path / "held"
    env = {**clean_env(), "POSTTRAIN_CACHE": str(tmp_path / "cache")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    # the holder: a real sft run held (tests.paused_cli) as it creates the temp dir of its tokenized entry,
    # that is while it holds the entry's lock
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.paused_cli", "mkdir", r"/\.tokenized-[0-9a-f]+\.tmp-[^/]+$", str(ready)]
        + ["--", *argv, f"output_dir={tmp_path / 'holder'}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if holder.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the holder never built its cache entry: {holder.stderr.read()[-2000:]}")
            time.sleep(0.05)
        monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
        monkeypatch.setenv(file_lock.LOCK_WAIT_ENV, "2")
        caplog.set_level(logging.WARNING, logger="trainer_lib.data.cache")
        capsys.readouterr()
        started = time.monotonic()
        code = main([*argv, f"output_dir={tmp_path / 'waiter'}"])
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    lock = re.escape(str(tmp_path / "cache" / "data")) + r"/tokenized-[0-9a-f]+\.lock"
    who = rf"pid {holder.pid} on \S+, building tokenized {re.escape(chat_jsonl)} \[train\]"
    waiting = [r.getMessage() for r in caplog.records if "waiting for the lock" in r.getMessage()]
    assert len(waiting) == 1
    assert re.fullmatch(
        rf"data cache: waiting for the lock {lock}, held by {who} \(giving up after 2 s, "
        rf"\$POSTTRAIN_LOCK_WAIT_S\)",
        waiting[0],
    ), waiting[0]
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1
    assert re.fullmatch(
        rf"error: data cache: gave up after 2 s waiting for the lock {lock}, held by {who}; let that process "
        r"finish or stop it, or wait longer with \$POSTTRAIN_LOCK_WAIT_S",
        errors[0],
    ), errors[0]
    assert took < 30
    assert not (tmp_path / "waiter" / "summary.json").exists()


def test_the_wait_bound_must_be_a_positive_number(monkeypatch):
    monkeypatch.setenv(file_lock.LOCK_WAIT_ENV, "soon")
    with pytest.raises(Exception, match=r"POSTTRAIN_LOCK_WAIT_S: expected a positive number of seconds, got 'soon'"):
        file_lock.lock_wait_s()
    monkeypatch.setenv(file_lock.LOCK_WAIT_ENV, "90")
    assert file_lock.lock_wait_s() == 90.0
