"""PPO's other objectives on a tiny model: A2C and NLPO raise a custom reward, NLPO's samples stay in its
mask and a resumed NLPO run ends bit-exact; settings they cannot honour are refused."""

import json
import os
import shutil

import pytest
import torch

from tests.conftest import repeatable
from tests.stages.training.rl_helpers import (
    mean_sampled_reward,
    run_rl,
    weights,
    write_prompts,
)
from trainer_lib.config.loader import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.ppo import PPOConfig

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("rl") / "prompts.jsonl")


def _ppo(model, data, out, *extra):
    run_rl("ppo", model, data, out, 5, "lr=1e-2", *extra)


def _train_records(out) -> list[dict]:
    return [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]


def _without_clock(record: dict) -> dict:
    return repeatable(record)


def test_a2c_raises_a_custom_reward(tiny_model_dir, prompts, tmp_path):
    out = tmp_path / "a2c"
    _ppo(tiny_model_dir, prompts, out, "objective=a2c", "max_steps=20", "save_steps=0")
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    train = _train_records(out)
    assert "clip_fraction" not in train[-1] and "policy_loss" in train[-1]  # no ratio, no clip
    assert train[-1]["value_loss"] < train[0]["value_loss"]
    assert json.loads((out / "summary.json").read_text())["objective"] == "a2c"


def test_nlpo_raises_a_custom_reward_inside_its_mask_and_resumes_bit_exact(tiny_model_dir, prompts, tmp_path):
    """20 steps, the masking policy copied every 4; losing everything after the step-15 checkpoint (whose
    masking policy was copied at step 12, so it is kept in the checkpoint) and rerunning ends the same."""
    out = tmp_path / "nlpo"
    args = (
        "objective=nlpo",
        "nlpo.top_p=0.7",
        "nlpo.mask_update_steps=4",
        "ppo_epochs=2",
        "max_steps=20",
        "save_steps=15",
        "save_total_limit=0",
    )
    _ppo(tiny_model_dir, prompts, out, *args)
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    train = _train_records(out)
    assert all(r["nlpo/off_mask_fraction"] == 0.0 for r in train)  # every sampled token in the update's mask
    assert all(r["nlpo/mask_tokens"] < 300 for r in train)  # of the 300-token vocabulary
    state = torch.load(out / "checkpoints" / "step-00000015" / "mp_rank_00_model_states.pt", weights_only=False)
    assert state["nlpo_masking_policy"]["copied_at"] == 12 and state["nlpo_masking_policy"]["weights"]

    reference = weights(out)
    shutil.rmtree(out / "checkpoints" / "step-00000020")
    os.remove(out / "model.safetensors")
    _ppo(tiny_model_dir, prompts, out, *args)
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    assert [_without_clock(r) for r in _train_records(out)] == [_without_clock(r) for r in train]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["objective=a2c", "ppo_epochs=2"], "objective=a2c: one update per rollout"),
        (["objective=a2c", "mini_batch_size=4"], "objective=a2c: one update per rollout"),
        (["objective=nlpo", "nlpo.top_p=0"], "nlpo.top_p"),
        (["objective=nlpo", "engine.zero_stage=3"], "objective=nlpo: not supported"),
        (["objective=nlpo", "multi_adapter=true", "lora.r=4"], "objective=nlpo: not supported"),
    ],
)
def test_settings_an_objective_cannot_honour_are_refused(overrides, message):
    base = ["model.path=m", "data.path=d", "output_dir=o", "reward.functions=f:g", "prompts_per_step=4", "rollout.n=2"]
    with pytest.raises(ConfigError, match=message):
        load_config(PPOConfig, overrides=[*base, *overrides])


def test_ppo_epochs_follows_the_objective_unless_set():
    base = ["model.path=m", "data.path=d", "output_dir=o", "reward.functions=f:g"]
    assert load_config(PPOConfig, overrides=base).ppo_epochs == 4
    assert load_config(PPOConfig, overrides=[*base, "objective=nlpo"]).ppo_epochs == 4
    assert load_config(PPOConfig, overrides=[*base, "objective=a2c"]).ppo_epochs == 1
    assert load_config(PPOConfig, overrides=[*base, "ppo_epochs=2"]).ppo_epochs == 2
