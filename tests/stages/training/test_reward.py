"""Reward stage on a tiny model: learns a synthetic preference, saves a loadable reward model."""

import functools
import json
import os
import random

import pytest
import torch

from trainer_lib.cli import main

pytestmark = pytest.mark.usefixtures("single_thread")

WORDS = "apple river stone cloud lamp green table seven quiet paper window music orange bridge".split()
GOOD, BAD = "kind nice warm calm glad".split(), "rude mean cold harsh sad".split()


def _answer(filler: list[str], pos: int, word: str) -> str:
    return " " + " ".join(filler[:pos] + [word] + filler[pos:]) + "."


def synthetic_pairs(n: int, seed: int) -> list[dict]:
    """Chosen answers contain one of the GOOD words, rejected ones one of the BAD words, at a random
    position among random filler; an untrained head is near chance on it (asserted below)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        filler = rng.sample(WORDS, 5)
        pos = rng.randrange(len(filler) + 1)
        answer = functools.partial(_answer, filler, pos)
        rows.append(
            {
                "prompt": f"Tell me about {rng.choice(WORDS)}:",
                "chosen": answer(rng.choice(GOOD)),
                "rejected": answer(rng.choice(BAD)),
            }
        )
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from trainer_lib.demo.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("reward")
    train, held_out = synthetic_pairs(160, seed=0), synthetic_pairs(40, seed=1)
    texts = [r["prompt"] + r["chosen"] + r["rejected"] for r in train] * 3
    model = make_tiny_model(str(root / "model"), texts, vocab_size=300, num_layers=2, hidden_size=64)
    return {
        "model": model,
        "train": write_jsonl(root / "train.jsonl", train),
        "eval": write_jsonl(root / "eval.jsonl", held_out),
        "held_out": held_out,
        "root": root,
    }


def _reward(setup, out, *extra):
    args = [
        "reward",
        f"model.path={setup['model']}",
        f"data.path={setup['train']}",
        f"output_dir={out}",
        f"data.eval_path={setup['eval']}",
        "batch_size=8",
        "lr=2e-3",
        "logging_steps=5",
        "eval_steps=10",
        "save_steps=0",
        "warmup_steps=2",
        *extra,
    ]
    assert main(args) == 0


def _score_pairs(model_dir, rows):
    """Rewards of chosen and rejected, computed from the saved directory alone."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer_lib.data.preference_batches import collate_pairs, split_halves, tokenize_pair

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    assert model.config.num_labels == 1
    batch = collate_pairs([tokenize_pair(r, tok, 64) for r in rows], tok.pad_token_id)
    with torch.no_grad():
        rewards = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    return split_halves(rewards)


def test_reward_model_learns_preference_and_loads(setup, tmp_path):
    out = tmp_path / "rm"
    _reward(setup, out, "max_steps=20")
    chosen, rejected = _score_pairs(out, setup["held_out"])
    accuracy = float((chosen > rejected).float().mean())
    assert accuracy >= 0.9, accuracy  # chance is 0.5

    # eval metrics were logged during training and improved
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10, 20]
    assert evals[-1]["accuracy"] >= 0.9 and evals[-1]["margin"] > evals[0]["margin"]
    assert evals[0]["accuracy"] <= evals[-1]["accuracy"] - 0.2  # learned, not a lucky initial head

    # normalization statistics: in config.json and reward_stats.json, computed on the eval split
    stats = json.loads((out / "reward_stats.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["reward_mean"] == pytest.approx(stats["reward_mean"])
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["pad_token_id"] is not None
    rewards = torch.cat([chosen, rejected])
    assert stats["count"] == 80 and stats["reference_set"] == "eval"
    assert stats["reward_mean"] == pytest.approx(float(rewards.mean()), abs=1e-3)
    assert stats["reward_std"] == pytest.approx(float(rewards.std(unbiased=False)), abs=1e-3)

    from trainer_lib.models.heads import load_stats, normalize_rewards

    loaded = load_stats(str(out))
    normalized = normalize_rewards(rewards, loaded["reward_mean"], loaded["reward_std"])
    assert abs(float(normalized.mean())) < 1e-3 and float(normalized.std(unbiased=False)) == pytest.approx(1, abs=1e-3)
    assert float(normalize_rewards(rewards, loaded["reward_mean"], loaded["reward_std"], clip=1.0).abs().max()) <= 1.0


def test_reward_lora_with_margin_and_centering(setup, tmp_path):
    rows = [dict(r, margin=0.5) for r in synthetic_pairs(48, seed=2)]
    data = write_jsonl(tmp_path / "margin.jsonl", rows)
    out = tmp_path / "rm_lora"
    _reward(
        setup,
        out,
        f"data.path={data}",
        "max_steps=6",
        "lora.r=4",
        "center_rewards_coefficient=0.01",
        "reference_set=train",
        "normalize_max_rows=16",
    )
    from safetensors.torch import load_file

    weights = load_file(os.path.join(out, "model.safetensors"))
    assert "score.weight" in weights and not any("lora" in k for k in weights)  # adapters merged
    stats = json.loads((out / "reward_stats.json").read_text())
    assert stats["reference_set"] == "train" and stats["count"] == 32
    chosen, rejected = _score_pairs(out, rows[:4])
    assert torch.isfinite(chosen).all() and torch.isfinite(rejected).all()


def test_reward_rejects_unpaired_data(setup, tmp_path, capsys):
    data = write_jsonl(tmp_path / "kto.jsonl", [{"prompt": "Q?", "completion": " A.", "label": True}] * 4)
    rc = main(["reward", f"model.path={setup['model']}", f"data.path={data}", f"output_dir={tmp_path / 'x'}"])
    assert rc == 2 and "preference" in capsys.readouterr().err
