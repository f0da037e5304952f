"""reward and dpo components: thin specs, and their bodies run the stages (precomputed reference
log-probs cached next to an object-store dataset)."""

import json
import subprocess
import sys

import pytest
from kfp import dsl

from components.common import IMAGE, mark_source
from components.dpo import dpo
from components.reward import reward

HEAVY = ("torch", "transformers", "deepspeed", "datasets", "peft")
PAIRS = [{"prompt": f"Tell me about {w}:", "chosen": f" {w} is kind.", "rejected": f" {w} is rude."}
         for w in "apple river stone cloud lamp green table seven".split()]


def test_import_without_heavy_modules():
    code = f"import sys, components.reward, components.dpo; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("component", [reward, dpo], ids=lambda c: c.name)
def test_interfaces(component):
    def types(specs):
        return {name: spec.type for name, spec in specs.items()}

    assert component.component_spec.implementation.container.image == IMAGE
    assert types(component.component_spec.outputs) == {"output_model": "system.Model@0.0.1",
                                                      "metrics": "system.Metrics@0.0.1"}
    inputs = types(component.component_spec.inputs)
    assert inputs["model"] == "system.Model@0.0.1" and inputs["data"] == "system.Dataset@0.0.1"
    assert inputs["config_yaml"] == "String" and inputs["overrides"] == "List"


def test_reward_and_dpo_bodies(tiny_model_dir, s3_bucket, tmp_path):
    from trainer_lib import storage

    rows = "".join(json.dumps(r) + "\n" for r in PAIRS)
    storage.write_text(f"s3://{s3_bucket}/prefs/train.jsonl", rows)
    model, data = dsl.Model(uri=str(tiny_model_dir)), dsl.Dataset(uri=str(tmp_path / "data"))
    mark_source(data, f"s3://{s3_bucket}/prefs/train.jsonl")
    common = dict(max_steps=2, batch_size=4, max_length=64, config_yaml="save_steps: 0\neval_steps: 0\n")

    rm, rm_metrics = dsl.Model(uri=str(tmp_path / "rm")), dsl.Metrics(uri=str(tmp_path / "rm_metrics"))
    reward.python_func(model=model, data=data, output_model=rm, metrics=rm_metrics, **common,
                       overrides=["data.eval_fraction=0.25"])
    assert (tmp_path / "rm" / "reward_stats.json").is_file() and "reward_mean" in rm.metadata
    assert "eval.accuracy" in rm_metrics.metadata

    policy, metrics = dsl.Model(uri=str(tmp_path / "dpo")), dsl.Metrics(uri=str(tmp_path / "dpo_metrics"))
    dpo.python_func(model=model, data=data, output_model=policy, metrics=metrics, loss="ipo", **common,
                    overrides=["reference=precomputed", "data.eval_fraction=0"])
    assert policy.metadata["loss"] == "ipo" and (tmp_path / "dpo" / "model.safetensors").is_file()
    cached = storage.listdir(f"s3://{s3_bucket}/prefs/reference_logps")
    assert len(cached) == 1 and cached[0].endswith(".pt")
    assert metrics.metadata["train.loss"] >= 0
