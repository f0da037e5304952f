"""Two real worker processes (torchrun, gloo) against one process with gradient accumulation."""

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import clean_env

pytestmark = pytest.mark.distributed


def _run(args, cwd):
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "sft", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_two_processes_match_one_with_accumulation(tiny_model_dir, chat_jsonl, tmp_path):
    common = [
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        "max_steps=3",
        "lr=3e-3",
        "batch_size=2",
        "data.max_length=64",
        "data.packing=false",
        "save_steps=0",
        "eval_steps=0",
        "engine.zero_stage=2",
        "seed=3",
    ]
    trl_names = [item.replace("lr=", "learning_rate=") for item in common]  # TRL's name, same value
    two = _run(["--nproc", "2", *trl_names, f"output_dir={tmp_path / 'two'}"], tmp_path)
    assert "world size 2" in two.stdout
    assert two.stderr.count("config: learning_rate -> lr") == 1  # by the launcher, not again by each worker
    one = _run([*common, "engine.gradient_accumulation_steps=2", f"output_dir={tmp_path / 'one'}"], tmp_path)
    assert "world size 1" in one.stdout
    from safetensors.torch import load_file

    a = load_file(os.path.join(tmp_path / "two", "model.safetensors"))
    b = load_file(os.path.join(tmp_path / "one", "model.safetensors"))
    base = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a)  # training happened
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=1e-4, msg=key)
