"""A NaN/inf loss or gradient stops a training stage at its step; the last good checkpoint stays.

The fault is a real divergence, not a test hook: SFT on the tiny model with lr=1e30 takes one
finite step, then its gradient becomes NaN. :meth:`trainer_lib.loop.cadence.Cadence.check_finite`
(every training stage goes through it) must stop the run there, before that step is saved.
"""

import json
import math
import os

import torch

from tests.test_bad_inputs import assert_one_error_line, run_cli


def test_sft_divergence_stops_with_the_step_and_keeps_the_checkpoint(tiny_model_dir, chat_jsonl, tmp_path):
    out = tmp_path / "sft"
    proc = run_cli(
        "sft",
        [
            f"model.path={tiny_model_dir}",
            f"data.path={chat_jsonl}",
            f"output_dir={out}",
            "max_steps=6",
            "save_steps=1",
            "logging_steps=1",
            "lr=1e30",
            "batch_size=4",
            "data.eval_fraction=0",
            "report_to=none",
        ],
    )
    line = assert_one_error_line(
        proc, ("sft: step 2:", "not finite", "grad_norm=nan", "last complete checkpoint is step 1")
    )
    assert "step 1" in line
    checkpoints = out / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["step-00000001"]  # step 2 was never saved
    marker = json.loads((checkpoints / "step-00000001" / "COMPLETE").read_text())
    assert marker["step"] == 1
    states = torch.load(checkpoints / "step-00000001" / "mp_rank_00_model_states.pt", weights_only=False)
    weights = states["module"]
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    assert not (out / "model.safetensors").exists()  # no final model from a failed run
    logged = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["split"] == "train"] == [1]
    assert all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
