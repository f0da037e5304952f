"""SFT on a tiny model: loss falls, weights change, HF output loads, resume is exact, S3 works."""

import json
import os
import shutil

import pytest
import torch

from trainer_lib import storage
from trainer_lib.cli import main


@pytest.fixture(autouse=True)
def _storage_settings_end_with_the_test():
    """Runs here set storage.cache_dir, which configures the whole process: later modules must not inherit it."""
    yield
    storage.configure(reset=True)


def _sft(model, data, out, *extra):
    args = [
        "sft",
        f"model.path={model}",
        f"data.path={data}",
        f"output_dir={out}",
        "lr=3e-3",
        "batch_size=2",
        "data.max_length=64",
        "logging_steps=2",
        "eval_steps=5",
        "seed=1",
        *extra,
    ]
    assert main(args) == 0


def _mean_loss(model_dir, data_path):
    """Prompt-masked loss of a saved model on a JSONL of messages, computed independently."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.data.tokenize import tokenize_sft

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    losses = []
    with open(data_path) as fh:
        rows = [json.loads(line) for line in fh][:12]
    with torch.no_grad():
        for row in rows:
            ex = tokenize_sft(row, "messages", tok, 64)
            out = model(input_ids=torch.tensor([ex["input_ids"]]), labels=torch.tensor([ex["labels"]]))
            losses.append(float(out.loss))
    return sum(losses) / len(losses)


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


def test_sft_lowers_loss_and_writes_hf_model(tiny_model_dir, chat_jsonl, tmp_path):
    out = tmp_path / "sft"
    _sft(tiny_model_dir, chat_jsonl, out, "max_steps=20", "save_steps=10")
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)  # loads as a normal HF model
    assert os.path.exists(out / "tokenizer.json") and os.path.exists(out / "chat_template.jinja")
    before, after = _mean_loss(tiny_model_dir, chat_jsonl), _mean_loss(out, chat_jsonl)
    assert after < before * 0.8, (before, after)
    changed = [k for k, v in _weights(out).items() if not torch.equal(v, _weights(tiny_model_dir)[k])]
    assert changed, "no parameter changed"
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in train] == list(range(2, 21, 2))
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 20 and evals[-1]["loss"] < evals[0]["loss"]
    assert all(r["grad_norm"] > 0 and r["tokens_per_s"] > 0 for r in train)
    assert os.listdir(out / "tensorboard")
    assert sorted(os.listdir(out / "checkpoints")) == ["step-00000010", "step-00000020"]
    assert json.loads((out / "summary.json").read_text())["steps"] == 20


def test_resume_is_bit_exact(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    """Losing everything after the step-4 checkpoint and rerunning gives the same final weights."""
    out = tmp_path / "run"
    args = ("max_steps=8", "save_steps=4", "save_total_limit=0", "data.packing=false")
    _sft(tiny_model_dir, chat_jsonl, out, *args)
    reference = _weights(out)
    shutil.rmtree(out / "checkpoints" / "step-00000008")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    _sft(tiny_model_dir, chat_jsonl, out, *args)
    assert "resuming at step 4" in capsys.readouterr().out
    resumed = _weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    steps = [r["step"] for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert steps == [2, 4, 6, 8]  # the replayed steps replaced, not duplicated


def test_incomplete_checkpoint_is_ignored(tiny_model_dir, chat_jsonl, tmp_path):
    out = tmp_path / "run"
    _sft(tiny_model_dir, chat_jsonl, out, "max_steps=4", "save_steps=2")
    os.remove(out / "checkpoints" / "step-00000004" / "COMPLETE")  # as if killed mid-save
    from trainer_lib.engine.checkpoint import CheckpointManager

    class _Rank0:
        local_rank, rank, world_size, is_rank_0 = 0, 0, 1, True

    assert CheckpointManager(str(out), _Rank0()).latest_step() == 2


def test_lora_sft_merges_adapters(tiny_model_dir, chat_jsonl, tmp_path):
    out = tmp_path / "lora"
    _sft(
        tiny_model_dir, chat_jsonl, out, "max_steps=4", "save_steps=0", "lora.r=4", "lora.target_modules=q_proj,v_proj"
    )
    weights = _weights(out)
    assert not any("lora" in k for k in weights)  # merged into plain Llama weights
    base = _weights(tiny_model_dir)
    assert set(weights) == set(base)
    assert not torch.equal(
        weights["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(weights["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.parametrize(
    "engine",
    [
        ["engine.zero_stage=2", "engine.gradient_accumulation_steps=2"],
        ["engine.zero_stage=3", "engine.gradient_checkpointing=true"],
        ["engine.zero_stage=1", "engine.precision=bf16"],
    ],
)
def test_engine_variants_train(tiny_model_dir, chat_jsonl, tmp_path, engine):
    out = tmp_path / "variant"
    _sft(tiny_model_dir, chat_jsonl, out, "max_steps=4", "save_steps=2", *engine)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert os.path.exists(out / "checkpoints" / "step-00000004" / "COMPLETE")


def test_bad_data_exits_2_without_output(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": null}\n')
    out = tmp_path / "out"
    assert main(["sft", f"model.path={tiny_model_dir}", f"data.path={bad}", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "messages" in err
    assert not (out / "model.safetensors").exists()


def test_sft_reads_from_and_writes_to_s3(s3_bucket, tiny_model_dir, chat_jsonl, tmp_path, capsys):
    """Model, data and output all on a real S3 server; a rerun on a 'new node' resumes from S3."""
    from trainer_lib import storage

    storage.upload_dir(tiny_model_dir, f"s3://{s3_bucket}/models/tiny")
    storage.upload_file(chat_jsonl, f"s3://{s3_bucket}/data/chat.jsonl")
    out = f"s3://{s3_bucket}/runs/sft"
    _sft(
        f"s3://{s3_bucket}/models/tiny",
        f"s3://{s3_bucket}/data/chat.jsonl",
        out,
        "max_steps=4",
        "save_steps=2",
        f"storage.cache_dir={tmp_path / 'node1'}",
    )
    assert storage.exists(f"{out}/checkpoints/step-00000004/COMPLETE")
    assert storage.exists(f"{out}/model.safetensors") and storage.exists(f"{out}/metrics.jsonl")
    local = storage.localize(out)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(local)
    # A retry on another node: empty cache, longer run, resumes from the S3 checkpoint at step 4.
    storage.delete(f"{out}/checkpoints/step-00000002")
    capsys.readouterr()
    _sft(
        f"s3://{s3_bucket}/models/tiny",
        f"s3://{s3_bucket}/data/chat.jsonl",
        out,
        "max_steps=6",
        "save_steps=2",
        f"storage.cache_dir={tmp_path / 'node2'}",
    )
    assert f"resumed from {out}/checkpoints/step-00000004" in capsys.readouterr().out
    log = storage.read_text(f"{out}/metrics.jsonl")
    steps = [json.loads(line)["step"] for line in log.splitlines() if json.loads(line)["split"] == "train"]
    assert steps == [2, 4, 6]


def test_checkpoints_on_s3_survive_a_fresh_output_dir(s3_bucket, tiny_model_dir, chat_jsonl, tmp_path, capsys):
    """The KFP retry case: output_dir is a new local artifact dir, checkpoint_dir a stable S3 prefix."""
    ckpts = f"s3://{s3_bucket}/ckpt/sft"
    _sft(
        tiny_model_dir,
        chat_jsonl,
        tmp_path / "attempt1",
        "max_steps=4",
        "save_steps=2",
        f"checkpoint_dir={ckpts}",
        f"storage.cache_dir={tmp_path / 'node1'}",
    )
    assert not (tmp_path / "attempt1" / "checkpoints").exists()
    from trainer_lib import storage

    assert storage.exists(f"{ckpts}/step-00000004/COMPLETE")
    assert storage.exists(f"{ckpts}/step-00000004/metrics.jsonl")
    capsys.readouterr()
    _sft(
        tiny_model_dir,
        chat_jsonl,
        tmp_path / "attempt2",
        "max_steps=6",
        "save_steps=2",
        f"checkpoint_dir={ckpts}",
        f"storage.cache_dir={tmp_path / 'node2'}",
    )
    assert "resuming at step 4" in capsys.readouterr().out
    records = [json.loads(line) for line in open(tmp_path / "attempt2" / "metrics.jsonl")]
    assert [r["step"] for r in records if r["split"] == "train"] == [2, 4, 6]
    assert records[0] == json.loads(open(tmp_path / "attempt1" / "metrics.jsonl").readline())


def test_sft_on_fsspec_urls(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    """Model and data on memory://, output on file://, checkpoints on memory://: no scheme is special."""
    import uuid

    from trainer_lib import storage

    base = f"memory://sft-{uuid.uuid4().hex[:8]}"
    storage.upload_dir(tiny_model_dir, f"{base}/models/tiny")
    storage.upload_file(chat_jsonl, f"{base}/data/chat.jsonl")
    out, ckpts = f"file://{tmp_path / 'out'}", f"{base}/ckpt"
    common = (
        f"{base}/models/tiny",
        f"{base}/data/chat.jsonl",
        out,
        "save_steps=2",
        f"checkpoint_dir={ckpts}",
        f"storage.cache_dir={tmp_path / 'cache'}",
    )
    _sft(*common[:3], "max_steps=4", *common[3:])
    assert storage.list_files(f"{ckpts}/step-00000004")  # checkpoints in memory, complete
    assert storage.exists(f"{ckpts}/step-00000004/COMPLETE")
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # the file:// output is a normal HF model
    capsys.readouterr()
    _sft(*common[:3], "max_steps=6", *common[3:])
    assert f"resumed from {ckpts}/step-00000004" in capsys.readouterr().out
    storage.delete(base)


@pytest.mark.parametrize("remote_code", [False, True])
def test_a_packed_batch_carries_its_sequence_boundaries(remote_code):
    """Packed rows hand the attention layers their boundaries (flash-attention's varlen kwargs, read once
    on the host), except to remote modelling code, whose forward would refuse unknown keyword arguments."""
    from trainer_lib.config import load_config
    from trainer_lib.stages.training.sft import SFTConfig, make_collate

    cfg = load_config(
        SFTConfig,
        None,
        {"model": {"path": "m", "trust_remote_code": remote_code}, "data": {"path": "d"}, "output_dir": "o"},
    )
    examples = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}]
    batch = make_collate(cfg, 0, torch.device("cpu"))(examples)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    if remote_code:
        assert "cu_seq_lens_q" not in batch
    else:
        assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 5]
        assert batch["max_length_q"] == batch["max_length_k"] == 3


def test_over_length_rows_are_truncated_and_counted_or_dropped(tiny_model_dir, tmp_path, capsys):
    """As TRL's SFTTrainer: a row over data.max_length keeps its first max_length tokens (and trains); the count
    is printed. data.over_length=drop drops such rows instead, as posttrain did before."""
    from transformers import AutoTokenizer

    from trainer_lib.data.tokenize import tokenize_sft

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": " ".join([a] * repeat)}]}
        for q, a, repeat in [("Say hello.", "Hello there!", 1), ("Name a color.", "Blue.", 1)] * 3
        + [("Is the sky green?", "No, the sky is blue.", 6), ("What is two plus two?", "Four.", 12)]
    ]
    for i, row in enumerate(rows):
        row["messages"][0]["content"] += f" ({i})"  # no duplicates
    lengths = [len(tokenize_sft(row, "messages", tokenizer, 10_000)["input_ids"]) for row in rows]
    max_length = 40
    assert max(lengths[:6]) <= max_length < min(lengths[6:])  # two rows over, with room for their prompts
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))

    common = ["max_steps=1", f"data.max_length={max_length}", "data.eval_fraction=0", "data.packing=false"]
    _sft(tiny_model_dir, data, tmp_path / "truncated", *common)
    err = capsys.readouterr().err
    assert f"data: 2 rows longer than data.max_length={max_length} tokens are truncated to it when tokenized" in err
    assert json.loads((tmp_path / "truncated" / "summary.json").read_text())["train_examples"] == 8
    example = tokenize_sft(rows[7], "messages", tokenizer, max_length)  # what training got for the longest row
    assert (
        len(example["input_ids"]) == max_length
        and example["input_ids"] == tokenize_sft(rows[7], "messages", tokenizer, 10_000)["input_ids"][:max_length]
    )

    _sft(tiny_model_dir, data, tmp_path / "dropped", *common, "data.over_length=drop")
    assert f"data: 2 rows longer than data.max_length={max_length} tokens dropped" in capsys.readouterr().err
    assert json.loads((tmp_path / "dropped" / "summary.json").read_text())["train_examples"] == 6
