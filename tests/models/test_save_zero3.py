"""Export at scale: a 2-process ZeRO-3 SFT run writes its final model without gathering it on every rank."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import clean_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 65 s on 2 quiet cores, 4 min on busy ones


@pytest.fixture(scope="module")
def llama_50m(tiny_model_dir, tmp_path_factory) -> tuple[str, int]:
    """A 12-layer, 512-wide Llama (about 50M parameters) built from a config, with the test tokenizer."""
    from transformers import AutoTokenizer

    from trainer_lib.demo.tiny_model import build_tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = build_tiny_llama(
        tokenizer,
        num_layers=12,
        hidden_size=512,
        num_heads=8,
        num_kv_heads=8,
        intermediate_size=2048,
        max_positions=128,
    )
    out = str(tmp_path_factory.mktemp("models") / "llama50m")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, model.num_parameters()


def test_zero3_final_model_is_written_without_gathering_it_on_every_rank(llama_50m, chat_jsonl, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    model_dir, parameters = llama_50m
    assert parameters >= 50_000_000
    out, log = tmp_path / "out", tmp_path / "memory.jsonl"
    # glibc's mmap threshold fixed at its default: a freed block of 128 kB or more goes back to the OS, so
    # resident memory follows live memory (else blocks freed in training are reused unseen by RSS)
    env = {**clean_env(), "POSTTRAIN_SAVE_MEMORY_LOG": str(log), "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_lib.cli",
            "sft",
            "--nproc",
            "2",
            f"model.path={model_dir}",
            f"data.path={chat_jsonl}",
            "max_steps=2",
            "lr=1e-3",
            "batch_size=1",
            "data.max_length=64",
            "data.packing=false",
            "save_steps=2",
            "eval_steps=0",
            "engine.zero_stage=3",
            f"output_dir={out}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # rank 1 takes part in every gather but keeps nothing: its memory hardly grows during the save
    marks = {m["rank"]: m for m in map(json.loads, log.read_text().splitlines())}
    fp32_kb = parameters * 4 / 1024
    growth = marks[1]["peak_during"] - marks[1]["rss_before"]
    print(
        f"rank 1 grew {growth / 1024:.1f} MiB during the save (model fp32: {fp32_kb / 1024:.1f} MiB); "
        f"rank 0 {(marks[0]['peak_during'] - marks[0]['rss_before']) / 1024:.1f} MiB"
    )
    assert growth < 0.25 * fp32_kb, marks

    # the written model is the trained one: the fp32 weights consolidated from the DeepSpeed checkpoint
    saved = AutoModelForCausalLM.from_pretrained(out).state_dict()
    trained = get_fp32_state_dict_from_zero_checkpoint(str(out / "checkpoints"), tag="step-00000002")
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert set(trained) <= set(saved)
    for name, value in trained.items():
        torch.testing.assert_close(saved[name], value, atol=0, rtol=0, msg=name)
    assert sum(not torch.equal(saved[k], initial[k]) for k in trained) > len(trained) // 2  # training happened
    assert "model.safetensors" in os.listdir(out) or "model.safetensors.index.json" in os.listdir(out)
