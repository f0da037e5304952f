"""The hostile-code corpus through the ``code_execution`` reward inside a real GRPO step.

One step of ``posttrain grpo`` (a real process, secrets in its environment) whose reward source is
the library's code execution reward scoring, for every prompt, one corpus program and one honest
solution (tests/rewards/corpus_execution.py). Afterwards: the trainer finished its step and saved
its model, every hostile program scored 0 and every honest one 1 (no verdict forged, none lost),
nothing outside the sandbox changed, and no secret reached the outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO, clean_env
from tests.sandbox.test_sandbox import ADD_PROBLEM, CORPUS, _assert_nothing_changed, _fill, outside  # noqa: F401

REWARD = os.path.join(REPO, "tests", "rewards", "corpus_execution.py") + ":reward"


def test_hostile_corpus_in_a_grpo_step(tiny_model_dir, outside, tmp_path):  # noqa: F811
    subs, sentinel, world, listener, marker = outside
    tests = [ADD_PROBLEM["test"] + "\ncheck(add)\n"]
    rows = tmp_path / "prompts.jsonl"
    with open(rows, "w", encoding="utf-8") as fh:
        for path in CORPUS:
            fh.write(
                json.dumps(
                    {
                        "prompt": [{"role": "user", "content": f"Write add(a, b). ({path.stem})"}],
                        "program": _fill(path.read_text(), subs),
                        "tests": tests,
                    }
                )
                + "\n"
            )
    verdicts, out = tmp_path / "verdicts.jsonl", tmp_path / "grpo"
    env = clean_env()
    env.update(
        PYTHONPATH=REPO,
        OMP_NUM_THREADS="1",
        CORPUS_VERDICTS=str(verdicts),
        AWS_SECRET_ACCESS_KEY="corpus-grpo-secret",
        HF_TOKEN="corpus-grpo-token",
    )
    n = len(CORPUS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_lib.cli",
            "grpo",
            f"model.path={tiny_model_dir}",
            f"data.path={rows}",
            f"output_dir={out}",
            f"reward.functions={REWARD}",
            "rollout.n=2",
            f"prompts_per_step={n}",
            f"batch_size={2 * n}",
            "rollout.max_new_tokens=4",
            "max_steps=1",
            "data.eval_fraction=0",
            "save_steps=1",
            "lr=1e-3",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    # the trainer survived its step: model and a complete checkpoint written
    assert (out / "model.safetensors").is_file() and (out / "summary.json").is_file()
    assert (out / "checkpoints" / "step-00000001" / "COMPLETE").is_file()
    # every program has its verdict: hostile 0, honest 1 (a forged or lost verdict shows here)
    (rewards,) = [json.loads(line) for line in verdicts.read_text().splitlines()]
    assert len(rewards) == 2 * n
    scored = {}
    for i, value in enumerate(rewards):
        scored.setdefault("honest" if i % 2 else "hostile", []).append(value)
    assert scored["honest"] == [1.0] * n
    assert sorted(scored["hostile"]) == [0.0] * n, rewards
    # the step trained on those rewards
    (record,) = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert abs(record["reward"] - 0.5) < 1e-6
    _assert_nothing_changed(sentinel, world, listener, marker)
    for secret in ("corpus-grpo-secret", "corpus-grpo-token"):
        assert secret not in done.stdout + done.stderr
        assert all(
            secret not in p.read_text(errors="replace")
            for p in out.rglob("*")
            if p.is_file() and p.suffix in (".json", ".jsonl", ".txt")
        )
