"""Online DPO on a tiny model: the judge picks each prompt's best and worst completion, ties are skipped and
counted, the loss is DPO's on the pairs (checked by hand), the policy trains, resume is bit-exact."""

import json
import math
import os
import shutil

import pytest
import torch

from tests.stages.training.rl_helpers import (
    LENGTH_REWARD,
    mean_sampled_reward,
    run_rl,
    weights,
    write_prompts,
)
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.online_dpo import OnlineDPOConfig, pick_pairs

pytestmark = pytest.mark.usefixtures("single_thread")

#: even prompt rows all score 0.5 (every completion ties); odd rows score a hash of the text (no ties)
TIE_REWARD = """
import zlib

def reward(prompts, completions, row, **kwargs):
    return [0.5 if r % 2 == 0 else zlib.crc32(c[0]["content"].encode()) / 2**32 for r, c in zip(row, completions)]
"""


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("online_dpo") / "prompts.jsonl")


@pytest.fixture(scope="module")
def tie_reward(tmp_path_factory):
    path = tmp_path_factory.mktemp("tie_reward") / "tie_reward.py"
    path.write_text(TIE_REWARD)
    return f"{path}:reward"


def _online_dpo(model, data, out, *extra):
    run_rl("online-dpo", model, data, out, 3, *extra)


def _records(out, split="train"):
    return [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == split]


def test_pick_pairs_takes_best_and_worst_and_finds_ties():
    rewards = [0.1, 0.9, 0.5, 0.2, 1.0, 1.0, 1.0, 1.0, 0.3, 0.3, 0.35, 0.3]  # 3 groups of 4
    pairs = pick_pairs(rewards, 4, 0.0)
    assert pairs.chosen == [1, 4, 10] and pairs.rejected == [0, 4, 8]  # the first of equals
    assert pairs.kept == [True, False, True]
    assert pairs.chosen_reward == pytest.approx([0.9, 1.0, 0.35]) and pairs.rejected_reward[0] == 0.1
    assert pick_pairs(rewards, 4, 0.1).kept == [True, False, False]  # a gap of 0.05 is a tie at 0.1


def test_the_loss_is_dpo_on_the_pairs_by_hand(tiny_model_dir):
    """Sequence log-probs summed over each completion (a forward of prompt + completion, log-softmax read at the
    completion's tokens), then -log sigma(beta * h) against a different reference model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.rl.rollout import generate, token_logprobs
    from trainer_lib.stages.training.dpo import select_objective
    from trainer_lib.stages.training.online_dpo import pair_rollout, summed_logps

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn_like(param, generator=torch.Generator().manual_seed(1)))
    questions = [[{"role": "user", "content": q}] for q in ("Say hello.", "Name a color.")]
    rollout = generate(policy, tokenizer, [encode_prompt(tokenizer, q) for q in questions], n=3, max_new_tokens=8)
    pairs = pick_pairs([0.0, 2.0, 1.0, 5.0, 3.0, 4.0], 3, 0.0)
    assert (pairs.chosen, pairs.rejected) == ([1, 3], [0, 4])

    def by_hand(model, row: int) -> float:
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        response = rollout.response_ids[row][rollout.response_mask[row].bool()].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0].float()
        logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
        return float(sum(logprobs[t, token] for t, token in enumerate(response)))

    cfg = load_config(
        OnlineDPOConfig,
        None,
        ["model.path=m", "data.path=d", "output_dir=o", f"reward.functions={LENGTH_REWARD}", "beta=0.5"],
    )
    part = pair_rollout(rollout, pairs, [0, 1])
    with torch.no_grad():
        mine = summed_logps(token_logprobs(policy, part)[0], part)
        theirs = summed_logps(token_logprobs(reference, part)[0], part)
        losses = select_objective(cfg)(mine, theirs, {})
    for i in (0, 1):
        chosen, rejected = pairs.chosen[i], pairs.rejected[i]
        assert float(mine.chosen[i]) == pytest.approx(by_hand(policy, chosen), abs=1e-4)
        assert float(theirs.rejected[i]) == pytest.approx(by_hand(reference, rejected), abs=1e-4)
        h = (by_hand(policy, chosen) - by_hand(reference, chosen)) - (
            by_hand(policy, rejected) - by_hand(reference, rejected)
        )
        assert abs(h) > 1e-3  # the reference differs: the check is not the trivial log 2
        assert float(losses[i]) == pytest.approx(math.log1p(math.exp(-0.5 * h)), abs=1e-4)


def test_online_dpo_trains_on_the_judges_pairs_and_counts_ties(tiny_model_dir, prompts, tie_reward, tmp_path):
    """One epoch of the 24 prompts (6 steps of 4): the 12 even rows tie on purpose and are skipped, the 12 odd
    rows give a pair each; every logged pair's chosen completion scored above its rejected one; at step 1 the
    policy is the reference, so every pair's sigmoid loss is log 2."""
    out = tmp_path / "run"
    _online_dpo(
        tiny_model_dir,
        prompts,
        out,
        f"reward.functions={tie_reward}",
        "max_steps=6",
        "logging_steps=1",
        "save_steps=0",
        "lr=1e-2",
        "batch_size=2",
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stage"], summary["pairs_trained"], summary["ties_skipped"]) == ("online-dpo", 12, 12)
    train = _records(out)
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert sum(r["pairs/ties_skipped"] for r in train) == 12
    assert all(r["pairs/trained"] + r["pairs/ties_skipped"] == 4 for r in train)
    first = train[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5) and first["rewards/margins"] == pytest.approx(0)
    for key in ("pairs/chosen_reward", "pairs/rejected_reward", "pairs/reward_margin", "rewards/accuracy", "lr"):
        assert key in train[-1], key
    assert all(r["pairs/reward_margin"] > 0 for r in train if r["pairs/trained"])
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert len(samples) == 12 and {r["kind"] for r in samples} == {"pair"}
    for row in samples:
        assert row["chosen_score"] > row["rejected_score"] and row["chosen"] != row["rejected"]
        assert row["margin"] == pytest.approx(row["chosen_reward"] - row["rejected_reward"], abs=1e-5)
    trained, start = weights(out), weights(tiny_model_dir)
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the update happened
    assert json.loads((out / "heartbeat.json").read_text())["state"] == "finished"


def test_resume_is_bit_exact(tiny_model_dir, prompts, tmp_path, capsys):
    """LoRA (reference = adapters off), two micro-batches a step: losing everything after the step-2 checkpoint
    and rerunning gives the same weights, metrics and counts."""
    out = tmp_path / "run"
    args = ("max_steps=4", "save_steps=2", "save_total_limit=0", "lora.r=4", "lora.alpha=8", "lr=1e-2")
    args += ("batch_size=2", "logging_steps=1", "prompts_per_step=4", "rollout.max_new_tokens=8")
    _online_dpo(tiny_model_dir, prompts, out, *args)
    reference, records = weights(out), _records(out)
    summary = json.loads((out / "summary.json").read_text())
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    _online_dpo(tiny_model_dir, prompts, out, *args)
    assert "resuming at step 2" in capsys.readouterr().out
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    drop = ("time", "_per_s", "memory_gb")
    assert [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in _records(out)] == [
        {k: v for k, v in r.items() if not any(d in k for d in drop)} for r in records
    ]
    again = json.loads((out / "summary.json").read_text())
    assert (again["pairs_trained"], again["ties_skipped"]) == (summary["pairs_trained"], summary["ties_skipped"])
    assert summary["pairs_trained"] + summary["ties_skipped"] == 16


def test_online_dpo_raises_a_custom_reward(tiny_model_dir, prompts, tmp_path):
    """Judged by the length reward, 30 steps of online DPO make the policy's samples score higher."""
    out = tmp_path / "run"
    _online_dpo(tiny_model_dir, prompts, out, "max_steps=30", "lr=1e-2", "save_steps=0", "batch_size=4")
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    train = _records(out)
    assert train[-1]["reward"] > train[0]["reward"] and train[-1]["rewards/accuracy"] > 0.5


def test_online_dpo_settings_are_validated():
    base = ["model.path=m", "data.path=d", "output_dir=o", f"reward.functions={LENGTH_REWARD}", "batch_size=4"]
    cfg = load_config(OnlineDPOConfig, None, base)
    assert (cfg.loss, cfg.beta, cfg.min_reward_gap, cfg.mini_batch, cfg.updates_per_step()) == ("sigmoid", 0.1, 0, 8, 1)
    for bad, message in [
        ("rollout.n=1", "rollout.n: online DPO needs at least 2"),
        ("rollout.temperature=0", "every prompt would tie"),
        ("loss=kto", "loss: expected one of"),
        ("label_smoothing=0.1 loss=ipo", "label_smoothing: only used by"),
        ("min_reward_gap=-1", "min_reward_gap >= 0"),
        ("ppo_epochs=2", "ppo_epochs: unknown key"),
        ("rollout.tis_cap=2", "rollout.tis_cap: truncated importance sampling is GRPO's"),
        ("batch_size=3", "batch_size: online DPO's micro-batch is batch_size pairs"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(OnlineDPOConfig, None, [*base, *bad.split()])
