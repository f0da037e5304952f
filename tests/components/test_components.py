"""Components: specs compile without heavy imports, and their bodies work when called directly."""

import json
import math
import subprocess
import sys

import pytest
from kfp import dsl

from components.bootstrap import bootstrap
from components.common import image_for, log_summary, mark_source, source_of
from components.evaluate import evaluate
from components.prepare import prepare
from components.release import release
from components.train import train
from components.tune import tune

COMPONENTS = [bootstrap, prepare, train, tune, evaluate, release]
HEAVY = ("torch", "transformers", "deepspeed", "datasets", "peft", "onnxruntime")


def test_components_and_pipelines_import_without_heavy_modules():
    names = ", ".join(f"components.{c.python_func.__name__}" for c in COMPONENTS)
    code = f"import sys, {names}, pipelines.dag, pipelines.commands;print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.name)
def test_component_runs_in_our_image_without_installs(component):
    container = component.component_spec.implementation.container
    assert container.image == image_for(component.name)
    assert "pip install" not in " ".join(container.command + (container.args or []))
    assert "packages_to_install" not in component.python_func.__code__.co_names


def test_component_interfaces():
    def types(specs):
        return {name: spec.type for name, spec in specs.items()}

    assert types(bootstrap.component_spec.outputs) == {
        "demo": "system.Dataset@0.0.1",
        "data": "system.Dataset@0.0.1",
        "preferences": "system.Dataset@0.0.1",
        "prompts": "system.Dataset@0.0.1",
        "model": "system.Model@0.0.1",
    }
    assert types(prepare.component_spec.outputs) == {
        "prepared": "system.Dataset@0.0.1",
        "metrics": "system.Metrics@0.0.1",
    }
    for component in (prepare, train):
        inputs = types(component.component_spec.inputs)
        assert inputs["model"] == "system.Model@0.0.1" and inputs["data"] == "system.Dataset@0.0.1"
        assert inputs["config_yaml"] == "String" and inputs["overrides"] == "List"
        assert component.component_spec.inputs["overrides"].default == []


def test_source_of_prefers_pass_through_metadata(tmp_path):
    model = dsl.Model(uri=str(tmp_path / "model"))
    assert source_of(model) == str(tmp_path / "model")
    mark_source(model, "s3://bucket/models/llama")
    assert source_of(model) == "s3://bucket/models/llama"
    assert (tmp_path / "model" / "SOURCE").read_text().strip() == "s3://bucket/models/llama"


def test_log_summary_logs_finite_numbers_with_dotted_keys(tmp_path):
    metrics = dsl.Metrics(uri=str(tmp_path / "m"))
    logged = log_summary(
        metrics,
        {
            "rows": {"train": 9, "eval": 1},
            "eval_loss": 1.5,
            "format": "messages",
            "conversational": True,
            "grad_norm": math.nan,
            "steps": 3,
        },
    )
    assert metrics.metadata == logged == {"rows.train": 9, "rows.eval": 1, "eval_loss": 1.5, "steps": 3}


SMALL_DEMO = dict(
    demo_overrides=["n_code_train=60", "n_code_eval=6", "n_safety_train=20", "n_safety_sft=20", "n_safety_eval=6"]
)


def _boot_artifacts(tmp_path):
    return {name: dsl.Dataset(uri=str(tmp_path / name)) for name in ("demo", "data", "preferences", "prompts")} | {
        "model": dsl.Model(uri=str(tmp_path / "model"))
    }


def test_bootstrap_passes_given_model_and_dataset_through(tmp_path):
    arts = _boot_artifacts(tmp_path)
    bootstrap.python_func(
        **arts,
        base_model="org/llama-70b",
        dataset="s3://bucket/sft.jsonl",
        preference_dataset="s3://bucket/prefs.jsonl",
        **SMALL_DEMO,
    )
    model, data = arts["model"], arts["data"]
    assert source_of(model) == "org/llama-70b" and source_of(data) == "s3://bucket/sft.jsonl"
    assert source_of(arts["preferences"]) == "s3://bucket/prefs.jsonl"
    # the demo's code tasks stand in for a prompt dataset that was not given, held-out rows kept apart
    assert sorted(p.name for p in (tmp_path / "prompts").iterdir()) == ["eval.jsonl", "train.jsonl"]
    assert (tmp_path / "prompts" / "eval.jsonl").read_bytes() == (
        tmp_path / "demo" / "code_tasks_eval.jsonl"
    ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["SOURCE"]  # nothing copied
    assert (tmp_path / "demo" / "preferences.jsonl").is_file()


def test_bootstrap_demo_then_prepare(tmp_path):
    arts = _boot_artifacts(tmp_path)
    data, model = arts["data"], arts["model"]
    bootstrap.python_func(
        **arts, tiny_model_overrides=["hidden_size=32", "num_layers=1", "vocab_size=300"], **SMALL_DEMO
    )
    assert (tmp_path / "model" / "config.json").is_file() and model.metadata["hidden_size"] == 32
    assert (tmp_path / "data" / "sft.jsonl").read_bytes() == (tmp_path / "demo" / "sft.jsonl").read_bytes()
    assert source_of(data) == data.path and data.metadata["rows"] == 80

    prepared, metrics = dsl.Dataset(uri=str(tmp_path / "prepared")), dsl.Metrics(uri=str(tmp_path / "metrics"))
    prepare.python_func(
        data=data,
        model=model,
        prepared=prepared,
        metrics=metrics,
        max_length=256,
        eval_fraction=0.1,
        seed=1,
        config_yaml="drop_duplicates: false\n",
        overrides=["max_rows=50"],
    )
    stats = json.loads((tmp_path / "prepared" / "stats.json").read_text())
    assert stats["rows_read"] == 50 and stats["max_length"] == 256 and stats["seed"] == 1
    assert metrics.metadata["rows.train"] + metrics.metadata["rows.eval"] == 50
    assert prepared.metadata["format"] == "messages"


def test_store_prefix_finds_the_object_store_folder(tmp_path):
    from components.common import store_prefix

    local = dsl.Dataset(uri=str(tmp_path / "prefs"))
    assert store_prefix(local) is None
    mark_source(local, "s3://bucket/prefs/train.jsonl")  # a file: its folder
    assert store_prefix(local) == "s3://bucket/prefs"
    assert (
        store_prefix(dsl.Dataset(uri="minio://mlpipeline/v2/artifacts/run/prepare/prepared/"))
        == "s3://mlpipeline/v2/artifacts/run/prepare/prepared"
    )
