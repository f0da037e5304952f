"""Online DPO on two processes: ranks whose prompts tie keep stepping with the ranks that have pairs, a step
where every prompt ties on both ranks takes no optimizer step, and the counts add up over the ranks."""

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.paused_cli import worker_env
from tests.stages.training.rl_helpers import weights, write_prompts

pytestmark = [pytest.mark.distributed, pytest.mark.extended]  # about 30 s on 2 busy cores

# Rank 1's completions all score 0.5 (each of its prompts ties); rank 0's score a hash of the text (no ties);
# at the second step (global_step 1) every completion on both ranks scores 0.5.
RANKED_TIES = """
import os
import zlib

def reward(prompts, completions, trainer_state=None, **kwargs):
    if os.environ["RANK"] == "1" or (trainer_state is not None and trainer_state.global_step == 1):
        return [0.5] * len(completions)
    return [zlib.crc32(c[0]["content"].encode()) / 2**32 for c in completions]
"""


def test_ties_on_one_rank_and_a_step_without_pairs(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=16)
    (tmp_path / "ranked_ties.py").write_text(RANKED_TIES)
    out = tmp_path / "out"
    argv = [
        f"model.path={tiny_model_dir}",
        f"data.path={prompts}",
        f"output_dir={out}",
        f"reward.functions={tmp_path / 'ranked_ties.py'}:reward",
        "rollout.n=3",
        "prompts_per_step=4",  # 2 per rank
        "batch_size=1",  # 2 micro-batches per rank and step
        "rollout.max_new_tokens=8",
        "max_steps=3",
        "lr=1e-2",
        "logging_steps=1",
        "save_steps=0",
        "eval_steps=0",
        "seed=3",
        "report_to=[none]",
    ]
    command = [sys.executable, "-m", "trainer_lib.cli", "online-dpo", "--nproc", "2", *argv]
    done = subprocess.run(command, cwd=REPO, env=worker_env(tmp_path), timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "world size 2" in done.stdout

    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    # rank 0's two pairs at steps 1 and 3, rank 1's two ties; step 2: all four tie
    assert [(r["pairs/trained"], r["pairs/ties_skipped"]) for r in train] == [(2, 2), (0, 4), (2, 2)]
    assert train[0]["loss"] == pytest.approx(0.6931472, abs=1e-5)  # the policy is the reference at step 1
    assert "loss" not in train[1] and "pairs/reward_margin" not in train[1]  # no pair, no update
    assert train[2]["pairs/reward_margin"] > 0 and "loss" in train[2]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["pairs_trained"], summary["ties_skipped"]) == (4, 8)
    trained, start = weights(out), weights(tiny_model_dir)
    assert any(not torch.equal(trained[k], start[k]) for k in start)
