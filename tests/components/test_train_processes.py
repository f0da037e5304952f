"""gpus=N: the train component runs its stage in N local processes (torchrun), as in an N-GPU pod."""

import os

import pytest
import torch
from kfp import dsl

from components.train import train

pytestmark = pytest.mark.distributed


def _train(tmp_path, name, model_dir, data_path, gpus, overrides):
    out = dsl.Model(uri=str(tmp_path / name))
    train.python_func(
        stage="sft",
        model=dsl.Model(uri=model_dir),
        data=dsl.Dataset(uri=data_path),
        output_model=out,
        metrics=dsl.Metrics(uri=str(tmp_path / f"{name}-metrics")),
        tensorboard=dsl.Artifact(uri=str(tmp_path / f"{name}-tensorboard")),
        max_steps=3,
        lr=3e-3,
        batch_size=2,
        max_length=64,
        seed=3,
        gpus=gpus,
        overrides=["data.packing=false", "save_steps=0", "eval_steps=0", *overrides],
    )
    return out


def test_two_processes_give_the_model_of_one_with_accumulation(tiny_model_dir, chat_jsonl, tmp_path, monkeypatch):
    from trainer_lib.engine.process_group import LAUNCHER_ENV

    for variable in LAUNCHER_ENV:
        monkeypatch.delenv(variable, raising=False)  # a fresh pod, not a worker of this test process
    two = _train(tmp_path, "two", tiny_model_dir, chat_jsonl, 2, [])
    one = _train(tmp_path, "one", tiny_model_dir, chat_jsonl, 1, ["engine.gradient_accumulation_steps=2"])
    assert two.metadata["steps"] == 3 and one.metadata["steps"] == 3
    from safetensors.torch import load_file

    a = load_file(os.path.join(two.path, "model.safetensors"))
    b = load_file(os.path.join(one.path, "model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=1e-4, msg=key)
