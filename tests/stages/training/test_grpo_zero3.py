"""GRPO under ZeRO-3 on two processes: rollouts generate with weights fetched layer by layer
(transformers' synced_gpus), so ranks whose completions end at different lengths keep stepping together."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import clean_env
from tests.stages.training.rl_helpers import weights, write_prompts

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # about 70 s on 2 busy cores

# A reward that records, per rank, the token length of each completion it scores.
RECORDING_REWARD = """
import json, os

def reward(prompts, completions, completion_ids, **columns):
    with open(os.environ["LENGTHS_LOG"], "a") as fh:
        fh.write(json.dumps({"rank": int(os.environ["RANK"]), "lengths": [len(ids) for ids in completion_ids]}) + "\\n")
    return [float(len(ids)) / 16 for ids in completion_ids]
"""


def test_zero3_grpo_generates_without_gathering_the_policy(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=20)
    (tmp_path / "recording.py").write_text(RECORDING_REWARD)
    out, lengths_log = tmp_path / "out", tmp_path / "lengths.jsonl"
    # "e" as a stop string ends each random completion after a different number of tokens; 3 held-out
    # prompts in chunks of 1 give the ranks 2 and 1 evaluation rollouts (the second rank repeats one)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_lib.cli",
            "grpo",
            "--nproc",
            "2",
            f"model.path={tiny_model_dir}",
            f"data.path={prompts}",
            f"output_dir={out}",
            f"reward.functions={tmp_path / 'recording.py'}:reward",
            "rollout.n=2",
            "prompts_per_step=4",
            "rollout.max_new_tokens=12",
            "rollout.stop=e",
            "rollout.batch_size=1",
            "batch_size=4",
            "max_steps=2",
            "lr=1e-2",
            "save_steps=0",
            "eval_steps=0",
            "data.eval_fraction=0.15",
            "engine.zero_stage=3",
            "seed=3",
        ],
        cwd=tmp_path,
        env={**clean_env(), "LENGTHS_LOG": str(lengths_log)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    records = [json.loads(line) for line in lengths_log.read_text().splitlines()]
    # rollout.batch_size=1: the i-th completion of each rank came from the same synced generate call
    lengths = {rank: [n for r in records if r["rank"] == rank for n in r["lengths"]] for rank in (0, 1)}
    assert len(lengths[0]) == len(lengths[1]) and lengths[0] != lengths[1], lengths  # calls ended apart
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and "eval_reward" in summary
    trained, initial = weights(out), weights(tiny_model_dir)
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)
    assert os.path.exists(out / "config.json")
