"""The training component: one thin spec for every training stage; its body runs the stage when called
directly (reward and DPO with precomputed reference log-probs cached next to an object-store dataset,
GRPO with parameters given as text, as a pipeline backend fills a dict parameter)."""

import json
import os

from kfp import dsl

from components.common import CUDA_IMAGE, mark_source
from components.train import train
from tests.stages.training.rl_helpers import LENGTH_REWARD, one_thread, write_prompts

PAIRS = [
    {"prompt": f"Tell me about {w}:", "chosen": f" {w} is kind.", "rejected": f" {w} is rude."}
    for w in "apple river stone cloud lamp green table seven".split()
]


def test_interface():
    spec = train.component_spec
    assert spec.implementation.container.image == CUDA_IMAGE  # a training step runs the CUDA build
    assert {name: s.type for name, s in spec.outputs.items()} == {
        "output_model": "system.Model@0.0.1",
        "metrics": "system.Metrics@0.0.1",
        "tensorboard": "system.Artifact@0.0.1",
        "parameters": "Integer",  # the saved model's size, which the export step is sized by
    }
    inputs = {name: s.type for name, s in spec.inputs.items()}
    assert inputs["model"] == "system.Model@0.0.1" and inputs["data"] == "system.Dataset@0.0.1"
    assert inputs["stage"] == "String" and inputs["params"] == "Dict"
    assert inputs["config_yaml"] == "String" and inputs["overrides"] == "List"
    assert spec.inputs["reward_model"].optional


def test_reward_and_dpo_bodies(tiny_model_dir, s3_bucket, tmp_path):
    from trainer_lib import storage

    rows = "".join(json.dumps(r) + "\n" for r in PAIRS)
    storage.write_text(f"s3://{s3_bucket}/prefs/train.jsonl", rows)
    model, data = dsl.Model(uri=str(tiny_model_dir)), dsl.Dataset(uri=str(tmp_path / "data"))
    mark_source(data, f"s3://{s3_bucket}/prefs/train.jsonl")
    common = dict(max_steps=2, batch_size=4, max_length=64, config_yaml="save_steps: 0\neval_steps: 0\n")

    rm, rm_metrics = dsl.Model(uri=str(tmp_path / "rm")), dsl.Metrics(uri=str(tmp_path / "rm_metrics"))
    train.python_func(
        stage="reward",
        model=model,
        data=data,
        output_model=rm,
        metrics=rm_metrics,
        tensorboard=dsl.Artifact(uri=str(tmp_path / "rm_tb")),
        **common,
        overrides=["data.eval_fraction=0.25"],
    )
    assert (tmp_path / "rm" / "reward_stats.json").is_file() and "reward_mean" in rm.metadata
    assert rm.metadata["stage"] == "reward" and rm.metadata["steps"] == 2
    assert "eval.accuracy" in rm_metrics.metadata

    policy, metrics = dsl.Model(uri=str(tmp_path / "dpo")), dsl.Metrics(uri=str(tmp_path / "dpo_metrics"))
    outputs = train.python_func(
        stage="dpo",
        model=model,
        data=data,
        output_model=policy,
        metrics=metrics,
        tensorboard=dsl.Artifact(uri=str(tmp_path / "dpo_tb")),
        params={"loss": "ipo"},
        **common,
        overrides=["reference=precomputed", "data.eval_fraction=0"],
    )
    assert policy.metadata["loss"] == "ipo" and (tmp_path / "dpo" / "model.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    size = AutoModelForCausalLM.from_pretrained(tiny_model_dir).num_parameters()
    assert outputs.parameters == policy.metadata["parameters"] == size  # (tied embeddings counted once)
    cached = storage.listdir(f"s3://{s3_bucket}/prefs/reference_logps")
    assert len(cached) == 1 and cached[0].endswith(".pt")
    assert metrics.metadata["train.loss"] >= 0


def test_grpo_body_with_parameters_given_as_text(tiny_model_dir, tmp_path):
    model = dsl.Model(uri=tiny_model_dir)
    data = dsl.Dataset(uri=write_prompts(tmp_path / "prompts.jsonl", 8))
    out, metrics = dsl.Model(uri=str(tmp_path / "out")), dsl.Metrics(uri=str(tmp_path / "metrics"))
    params = {"advantage": "dr_grpo", "rollout.n": "2.0", "rollout.max_new_tokens": "8", "prompts_per_step": 2}
    with one_thread():
        train.python_func(
            stage="grpo",
            model=model,
            data=data,
            output_model=out,
            metrics=metrics,
            params=params,
            tensorboard=dsl.Artifact(uri=str(tmp_path / "tb")),
            reward_functions=[LENGTH_REWARD],
            reward_weights=[],
            max_steps=2,
            lr=1e-3,
            batch_size=4,
            config_yaml="reward:\n  functions: [ignored:fn]\nlogging_steps: 1\n",
            overrides=["data.eval_fraction=0.25", "save_steps=0"],
        )
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["advantage"] == "dr_grpo" and summary["steps"] == 2
    assert out.metadata["stage"] == "grpo" and out.metadata["advantage"] == "dr_grpo"
    assert "eval_reward" in metrics.metadata and "train.reward" in metrics.metadata
    # the TensorBoard events are an artifact of their own (a Kubeflow Tensorboard opens its URI), not in the model
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))
    assert not (tmp_path / "out" / "tensorboard").exists()
