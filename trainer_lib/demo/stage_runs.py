"""What the demo drivers share (:mod:`~trainer_lib.demo.agent`, :mod:`~trainer_lib.demo.distill_demo`,
:mod:`~trainer_lib.demo.online_dpo_demo`): one ``posttrain`` stage run in a subprocess, and the stages a
finished ``make demo`` run trained."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time


def posttrain(stage: str, out: str, settings: list[str], who: str, label: str = "") -> float:
    """``posttrain <stage> settings... output_dir=out`` in a subprocess, offline, on one torch thread unless
    ``OMP_NUM_THREADS`` says otherwise (a tiny model's ops are too small to split), its output appended to
    ``<out's folder>/<label>.log`` (``label``: out's name), so a resumed run keeps the first attempt's log.
    Exits naming the log when the stage fails; returns its seconds and prints them after ``who``."""
    label = label or os.path.basename(out)
    log_path = os.path.join(os.path.dirname(out), f"{label}.log")
    started = time.time()
    command = [sys.executable, "-m", "trainer_lib.cli", stage, *settings, f"output_dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}
    with open(log_path, "a", encoding="utf-8") as log:
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode != 0:
            sys.exit(f"{who}: posttrain {stage} ({label}) failed; see {log_path}")
    seconds = time.time() - started
    print(f"{who}: {label}: {seconds:.0f} s", flush=True)
    return seconds


def demo_stages(run: str) -> dict[str, dict]:
    """The config each train task of the ``make demo`` run ``run`` recorded (its lineage's last stage), by the
    stage its summary names, with its output folder as ``dir``."""
    stages = {}
    for summary in sorted(glob.glob(os.path.join(run, "train*", "output_model", "summary.json"))):
        folder = os.path.dirname(summary)
        with open(os.path.join(folder, "lineage.json"), encoding="utf-8") as fh:
            config = json.load(fh)["stages"][-1]["config"]
        with open(summary, encoding="utf-8") as fh:
            stages[json.load(fh)["stage"]] = {**config, "dir": folder}
    return stages
