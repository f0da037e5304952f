"""Runs for the dashboard's tests, made by the real stages on a tiny model, and a dashboard process.

``dashboard_runs`` is a runs folder with two pipeline roots:

    pipeline-a/grpo        a finished GRPO run, logged every step, samples included; one of its prompts
                           carries HTML that must stay text (<script>, <img onerror>)
    pipeline-a/grpo-lr     the same run with another learning rate (for compare)
    pipeline-a/evaluate    a finished evaluation whose gate fails one rule
    pipeline-b/broken      a damaged run: a truncated metrics.jsonl line, no summary.json, a heartbeat that
                           stopped beating, a checkpoint without its COMPLETE marker
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.stages.training.rl_helpers import LENGTH_REWARD, one_thread

INJECTED = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> say hi'


def grpo_args(model, data, out, *extra) -> list[str]:
    return [
        "grpo",
        f"model.path={model}",
        f"data.path={data}",
        f"output_dir={out}",
        f"reward.functions={LENGTH_REWARD}",
        "rollout.n=4",
        "prompts_per_step=2",
        "rollout.max_new_tokens=12",
        "batch_size=8",
        "logging_steps=1",
        "data.eval_fraction=0",
        "save_steps=0",
        "report_to=none",
        *extra,
    ]


def write_prompts(path) -> str:
    rows = [{"prompt": [{"role": "user", "content": INJECTED}]}]
    rows += [{"prompt": [{"role": "user", "content": f"Name a color, number {i}."}]} for i in range(7)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="session")
def dashboard_runs(tmp_path_factory, tiny_model_dir, demo_dir):
    from trainer_lib.cli import main

    root = tmp_path_factory.mktemp("dashboard") / "runs"
    prompts = write_prompts(root.parent / "prompts.jsonl")
    with one_thread():
        assert main(grpo_args(tiny_model_dir, prompts, root / "pipeline-a" / "grpo", "max_steps=4", "lr=1e-3")) == 0
        assert main(grpo_args(tiny_model_dir, prompts, root / "pipeline-a" / "grpo-lr", "max_steps=4", "lr=3e-3")) == 0
        data = root.parent / "eval-data"
        data.mkdir()
        tasks = [json.loads(line) for line in open(os.path.join(demo_dir, "code_tasks_eval.jsonl"))][:2]
        (data / "code_tasks_eval.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        args = [
            "evaluate",
            f"models=base={tiny_model_dir},tuned={root / 'pipeline-a' / 'grpo'}",
            "baseline=base",
            f"tasks.path={data / 'code_tasks_eval.jsonl'}",
            f"output_dir={root / 'pipeline-a' / 'evaluate'}",
            "humaneval.enabled=false",
            "tasks.max_new_tokens=8",
            "sandbox_workers=1",
            # the same pass rate cannot beat itself by 0.5: this rule fails
            "gate.rules=task_pass_rate>=baseline+0.5",
        ]
        assert main(args) == 0
    broken = root / "pipeline-b" / "broken"
    (broken / "checkpoints" / "step-00000002").mkdir(parents=True)
    (broken / "checkpoints" / "step-00000002" / "model.pt").write_bytes(b"half")
    lines = [json.dumps({"step": s, "split": "train", "loss": 2.0 / s, "tokens": 100}) for s in (1, 2, 3)]
    (broken / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "split": "tra')
    beat = {
        "state": "running",
        "stage": "sft",
        "step": 3,
        "total_steps": 10,
        "pid": 1,
        "host": "gone",
        "started": time.time() - 600,
        "updated": time.time() - 500,
        "interval_s": 10.0,
        "config": {"lr": 1e-4},
    }
    (broken / "heartbeat.json").write_text(json.dumps(beat))
    return root


class DashboardProcess:
    """``posttrain dashboard`` in a subprocess on a free port; ``url`` once it listens."""

    def __init__(self, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer_lib.cli", "dashboard", "--http-port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()
        found = re.search(r"http://[^:]+:(\d+)/", line)
        if not found:
            self.proc.kill()
            raise AssertionError(f"dashboard did not start: {line}{self.proc.stdout.read()}")
        self.url = f"http://127.0.0.1:{found.group(1)}/"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def dashboard():
    started: list[DashboardProcess] = []

    def start(*args: str, env: dict | None = None) -> DashboardProcess:
        started.append(DashboardProcess(*args, env=env))
        return started[-1]

    yield start
    for process in started:
        process.close()
