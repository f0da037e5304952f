"""DPO stage on a tiny model: every loss trains, precomputed == frozen reference, LoRA reference
is the base model with adapters disabled (one set of base weights)."""

import gc
import json
import math
import os
import random

import pytest
import torch

from trainer_lib.cli import main

pytestmark = pytest.mark.usefixtures("single_thread")

WORDS = "apple river stone cloud lamp green table seven quiet paper window music orange bridge".split()


def conv(role, text):
    return [{"role": role, "content": text}]


def synthetic_pairs(n: int, seed: int) -> list[dict]:
    """Conversational pairs: chosen answers contain 'kind', rejected ones 'rude'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        filler = rng.sample(WORDS, 3)
        rows.append(
            {
                "prompt": conv("user", f"Tell me about {rng.choice(WORDS)}."),
                "chosen": conv("assistant", " ".join(filler + ["kind"])),
                "rejected": conv("assistant", " ".join(filler + ["rude"])),
            }
        )
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from trainer_lib.demo.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("dpo")
    train, held_out = synthetic_pairs(16, seed=0), synthetic_pairs(8, seed=1)
    texts = [
        r["prompt"][0]["content"] + " " + r["chosen"][0]["content"] + " " + r["rejected"][0]["content"] for r in train
    ] * 10
    model = make_tiny_model(str(root / "model"), texts, vocab_size=300, num_layers=2, hidden_size=64)

    def unpaired(rows):
        return [
            {"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
            for r in rows
            for k in ("chosen", "rejected")
        ]

    return {
        "model": model,
        "train": write_jsonl(root / "train.jsonl", train),
        "eval": write_jsonl(root / "eval.jsonl", held_out),
        "unpaired": write_jsonl(root / "unpaired.jsonl", unpaired(train)),
        "unpaired_eval": write_jsonl(root / "unpaired_eval.jsonl", unpaired(held_out)),
    }


def _dpo(setup, out, *extra):
    args = [
        "dpo",
        f"model.path={setup['model']}",
        f"data.path={setup['train']}",
        f"data.eval_path={setup['eval']}",
        f"output_dir={out}",
        "batch_size=4",
        "eval_batch_size=8",
        "lr=1e-3",
        "logging_steps=1",
        "eval_steps=0",
        "save_steps=0",
        "lr_scheduler=constant",
        *extra,
    ]
    assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


def _records(out, split="train"):
    return [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == split]


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


@pytest.mark.parametrize(
    "loss, extra",
    [
        ("sigmoid", ["label_smoothing=0.1"]),
        ("ipo", []),
        ("hinge", []),
        ("robust", ["label_smoothing=0.1"]),
        ("simpo", ["beta=2.0", "simpo_gamma=0.5"]),
        ("kto", []),
        ("kto-unpaired", []),
    ],
)
def test_each_loss_trains(setup, tmp_path, loss, extra):
    name = loss.split("-")[0]
    if loss == "kto-unpaired":
        extra = [f"data.path={setup['unpaired']}", f"data.eval_path={setup['unpaired_eval']}"]
    out = tmp_path / loss
    summary = _dpo(setup, out, f"loss={name}", "max_steps=3", *extra)
    train = _records(out)
    assert len(train) == 3 and all(math.isfinite(r["loss"]) for r in train)
    assert summary["loss"] == name and summary["reference"] == ("none" if name == "simpo" else "model")
    if loss != "kto-unpaired":  # held-out pairs: implicit-reward preference accuracy
        assert {"rewards/accuracy", "rewards/margins", "logps/chosen"} <= set(summary["eval"])
    if name == "kto":
        assert {"loss", "kl"} <= set(summary["eval"]) and "kl" in train[0]
        assert summary["train_examples"] == 32  # 16 pairs -> 32 unpaired rows, or the 32-row file
    before, after = _weights(setup["model"]), _weights(out)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"


def test_dpo_raises_held_out_preference_accuracy(setup, tmp_path):
    out = tmp_path / "learn"
    summary = _dpo(setup, out, "max_steps=12", "beta=0.5")
    first = _records(out, "eval")[0]
    assert first["step"] == 0 and first["rewards/accuracy"] == 0.0  # policy == reference: all ties
    assert summary["eval"]["rewards/accuracy"] >= 0.9 and summary["eval"]["rewards/margins"] > 0


def test_rpo_term_keeps_chosen_answers_likely(setup, tmp_path):
    # same seed and steps; the NLL term is the only difference, and it must raise log pi(chosen)
    plain = _dpo(setup, tmp_path / "dpo", "max_steps=8", "beta=0.5")
    rpo = _dpo(setup, tmp_path / "rpo", "max_steps=8", "beta=0.5", "rpo_alpha=1.0")
    assert rpo["eval"]["logps/chosen"] > plain["eval"]["logps/chosen"]
    assert _records(tmp_path / "rpo")[0]["loss"] > _records(tmp_path / "dpo")[0]["loss"]  # NLL added


def test_precomputed_reference_gives_same_curve_and_is_reused(setup, tmp_path):
    frozen = tmp_path / "frozen"
    cache = tmp_path / "cache"
    _dpo(setup, frozen, "max_steps=4", "reference=model")
    pre = tmp_path / "pre"
    summary = _dpo(setup, pre, "max_steps=4", "reference=precomputed", f"reference_logps_path={cache}", "save_steps=2")
    assert summary["reference_logps"] == "computed" and len(os.listdir(cache)) == 1
    a, b = _records(frozen), _records(pre)
    for key in ("loss", "rewards/chosen", "rewards/margins"):
        torch.testing.assert_close(
            torch.tensor([r[key] for r in a]), torch.tensor([r[key] for r in b]), rtol=1e-4, atol=1e-5
        )
    # a resumed (or retried) run loads the stored table instead of recomputing it
    resumed = _dpo(setup, pre, "max_steps=6", "reference=precomputed", f"reference_logps_path={cache}", "save_steps=2")
    assert resumed["reference_logps"] == "loaded" and len(os.listdir(cache)) == 1
    assert [r["step"] for r in _records(pre)] == [1, 2, 3, 4, 5, 6]


def test_precomputing_the_reference_says_how_far_it_is(setup, tmp_path, capsys, monkeypatch):
    from trainer_lib.models import reference

    monkeypatch.setattr(reference, "PROGRESS_EVERY_S", 0.0)  # a line after every batch
    _dpo(setup, tmp_path / "pre", "max_steps=1", "reference=precomputed", f"reference_logps_path={tmp_path / 'c'}")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reference log-probs: train")]
    total = int(lines[0].split(" batches of ")[0].rsplit(" ", 1)[1])
    assert total > 1 and lines[0].startswith("reference log-probs: train: ") and "examples" in lines[0]
    assert [line.split(": ")[2].split(" ")[0] for line in lines[1:]] == [f"{i}/{total}" for i in range(1, total + 1)]


def test_lora_adapter_reference_keeps_one_copy_of_base_weights(setup, tmp_path, monkeypatch):
    from trainer_lib.models import load
    from trainer_lib.models.reference import AdapterReference

    loads, models_seen = [], []
    real_load = load.load_causal_lm
    monkeypatch.setattr(load, "load_causal_lm", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    real_call = AdapterReference.__call__

    def causal_lms():  # transformers models with an LM head (LoRA wraps one, PEFT's wrapper is not one)
        from transformers import PreTrainedModel

        gc.collect()
        return [
            o for o in gc.get_objects() if isinstance(o, PreTrainedModel) and type(o).__name__.endswith("ForCausalLM")
        ]

    earlier = causal_lms()  # left over from other tests, if any

    def spying_call(self, *args):
        if not models_seen:  # while training: every causal LM this run created, and its parameters
            models = [o for o in causal_lms() if not any(o is e for e in earlier)]
            models_seen.extend((m, dict(m.named_parameters())) for m in models)
        return real_call(self, *args)

    monkeypatch.setattr(AdapterReference, "__call__", spying_call)
    summary = _dpo(setup, tmp_path / "lora", "max_steps=2", "lora.r=4")
    assert summary["reference"] == "adapter" and len(loads) == 1
    assert len(models_seen) == 1, [m for m, _ in models_seen]
    params = models_seen[0][1]
    base = [n for n in params if n.endswith("base_layer.weight")]
    assert len(base) == 2 * 4  # 2 layers x q,k,v,o: each base weight exists once, wrapped by LoRA
    assert len({p.data_ptr() for p in params.values()}) == len(params)  # no duplicated tensor


def test_adapter_reference_equals_base_model(setup):
    """With non-zero adapters, the adapter-disabled policy scores exactly like the base model."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from trainer_lib.config import LoraConfig, ModelConfig
    from trainer_lib.data.preference_batches import collate_pairs, tokenize_pair
    from trainer_lib.models.load import apply_lora, load_causal_lm
    from trainer_lib.models.reference import AdapterReference, forward_logps

    tok = AutoTokenizer.from_pretrained(setup["model"])
    rows = [json.loads(line) for line in open(setup["eval"])][:4]
    batch = collate_pairs([tokenize_pair(r, tok, 64) for r in rows], tok.pad_token_id)
    cfg = ModelConfig(path=setup["model"])
    policy = apply_lora(load_causal_lm(cfg), LoraConfig(r=4))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_()
        base = forward_logps(load_causal_lm(cfg), batch, "cpu")
        adapted = forward_logps(policy, batch, "cpu")
    strategy = SimpleNamespace(unwrap=lambda e: e, device=torch.device("cpu"))
    reference = AdapterReference(policy, strategy)("eval", [0, 1, 2, 3], batch)
    torch.testing.assert_close(reference.chosen, base.chosen)
    torch.testing.assert_close(reference.rejected, base.rejected)
    assert not torch.allclose(adapted.chosen, base.chosen)  # the adapters do change the policy


def test_config_errors(setup, tmp_path, capsys):
    base = ["dpo", f"model.path={setup['model']}", f"data.path={setup['train']}", f"output_dir={tmp_path}"]
    assert main([*base, "reference=adapter"]) == 2 and "lora.r" in capsys.readouterr().err
    assert main([*base, "loss=ipo", "label_smoothing=0.1"]) == 2 and "label_smoothing" in capsys.readouterr().err
    assert main([*base, "loss=kto", "rpo_alpha=1"]) == 2 and "rpo_alpha" in capsys.readouterr().err
    assert main([*base, "loss=nope"]) == 2
    assert main([*base, f"data.path={setup['unpaired']}"]) == 2 and "kto" in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["sigmoid", "kto"])
def test_packed_pairs_train_exactly_like_padded_ones(setup, tmp_path, loss):
    """data.packing (the default) only changes the layout: one padding-free row, per-sequence log-probs."""
    runs = {
        packing: _records(tmp_path / packing)
        for packing in ("true", "false")
        if _dpo(setup, tmp_path / packing, f"loss={loss}", "max_steps=3", f"data.packing={packing}")
    }
    keys = ["loss", "logps/chosen", "logps/rejected", "rewards/chosen", "rewards/rejected"]
    for packed, padded in zip(runs["true"], runs["false"], strict=True):
        for key in keys:
            assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-5), (packed["step"], key)
    from trainer_lib.models.load import load_tokenizer
    from trainer_lib.runner.stage_api import stage_config
    from trainer_lib.stages.training.dpo import build_splits

    layouts = {}
    for packing in ("true", "false"):
        cfg = stage_config(
            "dpo",
            [
                f"model.path={setup['model']}",
                f"data.path={setup['train']}",
                f"loss={loss}",
                f"data.packing={packing}",
                f"output_dir={tmp_path / 'layout'}",
            ],
        )
        train = build_splits(cfg, load_tokenizer(cfg.model))[0]["train"]
        layouts[packing] = train.collate([train.examples[i] for i in train.groups[0]])
    assert layouts["true"]["input_ids"].shape[0] == 1 and "segment_ids" in layouts["true"]  # what was compared
    assert layouts["false"]["input_ids"].shape[0] > 1 and "segment_ids" not in layouts["false"]


def test_sequence_logps_of_a_packed_row_equal_the_padded_rows():
    from trainer_lib.data.preference_batches import collate_pairs, sequence_logps

    torch.manual_seed(0)
    pairs = [
        {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6, 7, 8, 9]},
        {"prompt_ids": [2], "chosen_ids": [3, 3, 3], "rejected_ids": [5]},
    ]
    padded, packed = collate_pairs(pairs, pad_token_id=0), collate_pairs(pairs, pad_token_id=0, packed=True)
    assert packed["input_ids"].shape == (1, 3 + 2 + 3 + 4 + 1 + 3 + 1 + 1)
    assert packed["segment_ids"][0].unique().tolist() == [0, 1, 2, 3]
    table = torch.randn(12, 10)  # a "model": logits depend on the token only, so layouts are comparable

    def logits(ids):
        return table[ids]

    summed_pad, counts_pad = sequence_logps(logits(padded["input_ids"]), padded["input_ids"], padded["completion_mask"])
    summed_pack, counts_pack = sequence_logps(
        logits(packed["input_ids"]), packed["input_ids"], packed["completion_mask"], packed["segment_ids"]
    )
    assert counts_pack.tolist() == counts_pad.tolist() == [2, 3, 4, 1]
    assert torch.allclose(summed_pack, summed_pad, atol=1e-6)


def test_dpo_logs_its_pairs_with_their_implicit_rewards(setup, tmp_path):
    """samples.jsonl holds the step's last micro-batch of pairs: texts from the data, beta * log-ratio rewards."""
    out = tmp_path / "dpo"
    _dpo(setup, out, "max_steps=2")
    rows = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert [r["step"] for r in rows] == [1] * 4 + [2] * 4 and {r["kind"] for r in rows} == {"pair"}
    chosen = {r["chosen"][0]["content"] for r in synthetic_pairs(16, seed=0)}
    for row in rows:
        assert row["chosen"].strip() in chosen and row["chosen"].endswith("kind") and row["rejected"].endswith("rude")
        assert row["prompt"].strip().startswith("Tell me about") or "Tell me about" in row["prompt"]
        assert row["margin"] == pytest.approx(row["chosen_reward"] - row["rejected_reward"], abs=1e-5)
    # the last step's pairs: their mean margin is the logged one when the step is one micro-batch
    last = _records(out)[-1]
    step_two = [r["margin"] for r in rows if r["step"] == 2]
    assert sum(step_two) / len(step_two) == pytest.approx(last["rewards/margins"], rel=1e-3, abs=1e-5)
