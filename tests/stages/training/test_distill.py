"""On-policy distillation on tiny models: the student's divergence to a teacher (the same tiny architecture
and tokenizer, other weights) falls; another tokenizer is refused with the reason; lmbda=0 trains on the
dataset's completions only; LoRA runs and resume is exact."""

import json
import os
import shutil

import pytest
import torch

from tests.conftest import CHAT_ROWS
from tests.stages.training.rl_helpers import weights
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError, UserError

pytestmark = pytest.mark.usefixtures("single_thread")

TEXTS = [q + " " + a for q, a in CHAT_ROWS] * 20


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """The conftest's tiny model with another seed: the same tokenizer (trained on the same texts), other weights."""
    from trainer_lib.demo.tiny_model import make_tiny_model

    out = tmp_path_factory.mktemp("teacher") / "tiny"
    return make_tiny_model(str(out), TEXTS, vocab_size=300, num_layers=2, hidden_size=64, seed=7)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Prompt-completion rows (plain text), distinct, 4 of 24 held out."""
    path = tmp_path_factory.mktemp("distill") / "rows.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(24):
            q, a = CHAT_ROWS[i % len(CHAT_ROWS)]
            fh.write(json.dumps({"prompt": q + " " * (i // len(CHAT_ROWS)), "completion": " " + a}) + "\n")
    return str(path)


def _args(student, teacher, data, out, *extra):
    return [
        f"model.path={student}",
        f"teacher.path={teacher}",
        f"data.path={data}",
        f"output_dir={out}",
        "rollout.n=2",
        "prompts_per_step=4",
        "rollout.max_new_tokens=12",
        "batch_size=4",
        "logging_steps=1",
        "eval_steps=0",
        "save_steps=0",
        "lr=1e-2",
        "seed=3",
        *extra,
    ]


def _distill(*args):
    from trainer_lib.cli import main

    assert main(["distill", *args]) == 0


def _metrics(out, split):
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if r["split"] == split]


def test_divergence_to_the_teacher_falls(tiny_model_dir, teacher_dir, rows, tmp_path):
    out = tmp_path / "run"
    _distill(*_args(tiny_model_dir, teacher_dir, rows, out, "max_steps=12", "data.eval_fraction=0.2"))
    train, evals = _metrics(out, "train"), _metrics(out, "eval")
    assert len(train) == 12 and all(r["on_policy_fraction"] == 1.0 for r in train)
    first, last = sum(r["loss"] for r in train[:3]) / 3, sum(r["loss"] for r in train[-3:]) / 3
    assert last < 0.8 * first, (first, last)
    assert [r["step"] for r in evals] == [0, 12]
    assert evals[-1]["distill_loss"] < 0.7 * evals[0]["distill_loss"], evals
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_distill_loss"] == pytest.approx(evals[-1]["distill_loss"], rel=1e-5)


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir, rows, tmp_path):
    from trainer_lib.demo.tiny_model import make_tiny_model

    other = make_tiny_model(str(tmp_path / "other"), TEXTS, vocab_size=200, num_layers=1, hidden_size=32)
    with pytest.raises(UserError, match=r"teacher\.path: .*vocabulary of \d+ tokens, the student's has \d+"):
        from trainer_lib.stages.training import distill

        distill.run(load_config(distill.CONFIG, [], _args(tiny_model_dir, other, rows, tmp_path / "run")))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_lmbda_0_trains_on_the_dataset_completions_only(tiny_model_dir, teacher_dir, rows, tmp_path, monkeypatch):
    from trainer_lib.data.preference_batches import encode_completion
    from trainer_lib.models.load import load_tokenizer
    from trainer_lib.rl import experience
    from trainer_lib.stages.training import distill

    def no_sampling(*args, **kwargs):
        raise AssertionError("lmbda=0 samples nothing")

    monkeypatch.setattr(experience, "sample", no_sampling)
    cfg = load_config(distill.CONFIG, [], _args(tiny_model_dir, teacher_dir, rows, tmp_path / "run", "lmbda=0"))
    tokenizer = load_tokenizer(cfg.model)
    picked = [json.loads(line) for line in open(rows)][:3]
    rollout, on_policy = distill.step_sequences(None, None, tokenizer, picked, cfg, seed=0)
    assert on_policy == [False] * 6
    for i, row in enumerate(picked):  # the loss tokens of each sequence are exactly the row's completion
        expected = encode_completion(tokenizer, row["prompt"], row["completion"])[: cfg.rollout.max_new_tokens]
        for j in (2 * i, 2 * i + 1):
            assert rollout.response_ids[j][rollout.loss_mask[j].bool()].tolist() == expected

    out = tmp_path / "run"
    _distill(*_args(tiny_model_dir, teacher_dir, rows, out, "lmbda=0", "max_steps=2", "data.eval_fraction=0"))
    assert all(r["on_policy_fraction"] == 0.0 for r in _metrics(out, "train"))


def test_lora_resume_is_exact(tiny_model_dir, teacher_dir, rows, tmp_path, capsys):
    """LoRA, half on-policy and half dataset, the JSD at beta=0.5: losing the step-4 checkpoint and rerunning
    from step 2 gives the same weights."""
    out = tmp_path / "run"
    args = _args(tiny_model_dir, teacher_dir, rows, out, "max_steps=4", "save_steps=2", "save_total_limit=0")
    args += ["lora.r=4", "lora.alpha=8", "lmbda=0.5", "beta=0.5", "data.eval_fraction=0"]
    _distill(*args)
    reference = weights(out)
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    _distill(*args)
    assert "resuming at step 2" in capsys.readouterr().out
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    key = "model.layers.0.self_attn.q_proj.weight"  # LoRA merged into the saved weights
    assert not torch.equal(weights(tiny_model_dir)[key], resumed[key])


def test_keys_are_validated(tiny_model_dir, teacher_dir, rows, tmp_path):
    from trainer_lib.stages.training import distill

    base = _args(tiny_model_dir, teacher_dir, rows, tmp_path)
    for bad, key in (("beta=1.5", "beta"), ("lmbda=-0.1", "lmbda"), ("teacher.path=", "teacher.path")):
        with pytest.raises(ConfigError, match=key):
            load_config(distill.CONFIG, [], [*base, bad])


def test_messages_rows_train_on_their_last_turn(tiny_model_dir, teacher_dir, chat_jsonl, tmp_path):
    from trainer_lib.models.load import load_tokenizer
    from trainer_lib.stages.training import distill

    cfg = load_config(distill.CONFIG, [], _args(tiny_model_dir, teacher_dir, chat_jsonl, tmp_path / "run", "lmbda=0"))
    train, _ = distill.load_rows(cfg, load_tokenizer(cfg.model))
    assert train[0]["prompt"][-1]["role"] == "user" and train[0]["completion"][0]["role"] == "assistant"
    out = tmp_path / "run"
    _distill(*_args(tiny_model_dir, teacher_dir, chat_jsonl, out, "lmbda=0.5", "max_steps=1", "data.eval_fraction=0"))
    assert _metrics(out, "train")[0]["on_policy_fraction"] == 0.5
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert [s["on_policy"] for s in samples] == [True, True, False, False]
    assert all(s["completion"].startswith("def ") for s in samples[2:])  # the rows' last (assistant) turns


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.extended
def test_two_ranks_with_a_zero3_partitioned_teacher(tiny_model_dir, teacher_dir, rows, tmp_path):
    """``--nproc 2`` under ZeRO-3: the student samples with its weights fetched layer by layer, the teacher is
    partitioned as a reference model is (its head untiled: full logits of the completion positions)."""
    import subprocess
    import sys

    from tests.conftest import clean_env

    out = tmp_path / "run"
    args = _args(tiny_model_dir, teacher_dir, rows, out, "max_steps=2", "batch_size=2", "data.eval_fraction=0.2")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "distill", "--nproc", "2", *args, "engine.zero_stage=3", "lmbda=0.5"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval_distill_loss"] > 0
    trained, initial = weights(out), weights(tiny_model_dir)
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)


def test_trls_gkd_key_names_are_taken(tiny_model_dir, teacher_dir, rows, tmp_path):
    """A layer written for TRL's GKDConfig: teacher_model_name_or_path, max_new_tokens, lmbda, beta."""
    from trainer_lib.stages.training import distill

    layer = {
        "model": {"path": tiny_model_dir},
        "data": {"path": rows},
        "output_dir": str(tmp_path),
        "teacher_model_name_or_path": teacher_dir,
        "max_new_tokens": 7,
        "lmbda": 0.5,
        "beta": 0.1,
    }
    cfg = load_config(distill.CONFIG, layer)
    assert (cfg.teacher.path, cfg.rollout.max_new_tokens, cfg.lmbda, cfg.beta) == (teacher_dir, 7, 0.5, 0.1)


def test_heads_give_hidden_states_or_full_logits(tiny_model_dir):
    """The tiny Llama's head is tiled: hidden states and the head's weight; with chunked_lm_head=false its logits."""
    from trainer_lib.config import ModelConfig
    from trainer_lib.models.lm_head import response_states
    from trainer_lib.models.load import load_causal_lm

    ids = torch.tensor([[5, 6, 7, 8]])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    keep = torch.tensor([[True, False, True]])
    for tiled in (True, False):
        model = load_causal_lm(ModelConfig(path=tiny_model_dir, chunked_lm_head=tiled))
        with torch.no_grad():
            states, weight = response_states(model, inputs, 3, keep)
            logits = model(**inputs).logits[0, [0, 2]]
        assert (weight is not None) == tiled and states.shape == (2, 64 if tiled else 300)
        torch.testing.assert_close(states if weight is None else states @ weight.t(), logits, rtol=1e-4, atol=1e-5)
