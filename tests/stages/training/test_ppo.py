"""PPO on a tiny model: a custom reward rises, actor/critic/KL state resume bit-exactly."""

import json
import os
import shutil

import pytest
import torch

from tests.stages.training.rl_helpers import (
    mean_sampled_reward,
    run_rl,
    weights,
    write_prompts,
    write_reward_adapter,
)

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("rl") / "prompts.jsonl")


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A (randomly initialised) reward model with stored reward statistics, as the reward stage writes."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer_lib.models.heads import STATS_FILE

    out = tmp_path_factory.mktemp("rm")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / STATS_FILE).write_text(json.dumps({"reward_mean": 0.1, "reward_std": 0.5}))
    return str(out)


def _ppo(model, data, out, *extra):
    run_rl("ppo", model, data, out, 5, *extra)


def test_ppo_raises_a_custom_reward(tiny_model_dir, prompts, tmp_path):
    out = tmp_path / "ppo"
    _ppo(tiny_model_dir, prompts, out, "max_steps=20", "lr=1e-2", "ppo_epochs=2", "save_steps=0")
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    for key in (
        "reward",
        "kl",
        "kl_coef",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "explained_variance",
        "value_loss",
        "policy_loss",
        "response_length",
        "generate_time",
        "generate_tokens_per_s",
        "train_time",
        "grad_norm",
        "critic_grad_norm",
    ):
        assert key in train[-1], key
    assert train[-1]["value_loss"] < train[0]["value_loss"]
    assert train[-1]["grad_norm"] != train[-1]["critic_grad_norm"]  # two engines, two norms


def test_resume_restores_actor_critic_and_kl_controller(tiny_model_dir, reward_model_dir, prompts, tmp_path, capsys):
    """Reward model + function (critic initialised from the reward model), adaptive KL, 2 mini-batches,
    a critic-only first step:
    losing everything after the step-3 checkpoint and rerunning gives the same weights and KL coefficient."""
    out = tmp_path / "run"
    args = (
        "max_steps=5",
        "save_steps=3",
        "save_total_limit=0",
        f"reward.model_path={reward_model_dir}",
        "reward.weights=1,0.5",
        "kl.adaptive=true",
        "kl.target=0.5",
        "kl.horizon=50",
        "kl.estimator=k3",
        "mini_batch_size=8",
        "ppo_epochs=2",
        "lr=1e-2",
        "freeze_actor_steps=1",
    )
    _ppo(tiny_model_dir, prompts, out, *args)
    reference = weights(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kl_coef"] != 0.05  # the controller moved
    assert os.path.isdir(out / "checkpoints" / "step-00000003" / "critic")
    shutil.rmtree(out / "checkpoints" / "step-00000005")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    _ppo(tiny_model_dir, prompts, out, *args)
    assert "resuming at step 3" in capsys.readouterr().out
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    assert json.loads((out / "summary.json").read_text())["kl_coef"] == summary["kl_coef"]
    records = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert "rewards/reward_model" in records[-1] and "rewards/reward" in records[-1]


def test_multi_adapter_ppo_trains_only_the_adapters_and_value_head(tiny_model_dir, prompts, tmp_path):
    """multi_adapter=true with a LoRA reward model of the same base: one frozen base for all four roles.
    The reward rises; in the final checkpoint the base weights and the reward adapter are bitwise
    unchanged, the policy adapter, value adapter and value head moved; the output is the policy adapter.
    (LoRA on lm_head: the tiny model's small tied embeddings bound its logits, so only there can a
    LoRA make it stop early.)"""
    from safetensors.torch import load_file

    reward_dir = write_reward_adapter(tiny_model_dir, tmp_path / "rm")
    out = tmp_path / "ppo"
    _ppo(
        tiny_model_dir,
        prompts,
        out,
        "multi_adapter=true",
        "lora.r=8",
        "lora.alpha=16",
        "lora.target_modules=q_proj,v_proj,lm_head",
        "lora.merge=false",
        f"reward.model_path={reward_dir}",
        "reward.weights=1,0.1",
        "max_steps=20",
        "lr=2e-2",
        "critic_lr=1e-2",
        "ppo_epochs=2",
        "save_steps=20",
    )
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    assert os.path.exists(out / "adapter_model.safetensors") and not os.path.exists(out / "value")
    saved = load_file(out / "adapter_model.safetensors")
    assert saved and not any("value" in k or "reward" in k for k in saved)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert train[-1]["value_loss"] < train[0]["value_loss"] and "critic_lr" in train[-1]

    checkpoint = out / "checkpoints" / "step-00000020"
    assert not os.path.exists(checkpoint / "critic")  # one engine
    state = torch.load(checkpoint / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    base, reward = weights(tiny_model_dir), load_file(os.path.join(reward_dir, "adapter_model.safetensors"))
    moved = set()
    for key, value in state.items():
        if ".lora_" in key and ".reward." in key:
            assert torch.equal(value, reward[key.replace(".reward.", ".")]), key
        elif ".lora_" in key or key.startswith("value_head."):
            moved.add(key.split(".lora_")[-1].split(".")[1] if ".lora_" in key else "value_head")
            if ".lora_B" in key or key.startswith("value_head."):
                initial = (
                    torch.zeros_like(value)
                    if ".default." in key
                    else reward[key.replace(".value.", ".")]
                    if ".lora_B" in key
                    else reward["base_model.model.score.weight"]
                )
                assert not torch.equal(value, initial), key
        elif key == "reward_head.weight":
            assert torch.equal(value, reward["base_model.model.score.weight"])
        else:
            name = key.removeprefix("base_model.model.").replace(".base_layer", "")
            assert torch.equal(value, base.get(name, base["model.embed_tokens.weight"])), key
    assert moved == {"default", "value", "value_head"}
