"""trainer_lib.runner.stage_api: YAML text + override layers -> a stage config, then run."""

import subprocess
import sys

import pytest

from trainer_lib.config.layers import build_values, nest
from trainer_lib.errors import ConfigError
from trainer_lib.runner.stage_api import evaluation_layers, run_stage, training_layers


def test_layers_apply_in_order_after_the_yaml():
    values = build_values(
        [
            {"max_steps": 3, "model.path": "null"},
            "lr=1e-5",
            "lora.r=8",
            {"model": {"tokenizer_path": "tok"}},
            {"output_dir": "/out"},
        ],
        "engine:\n  zero_stage: 2\nlr: 0.1\nmax_steps: 9\n",
    )
    assert values == {
        "engine": {"zero_stage": 2},
        "lr": "1e-5",
        "max_steps": 3,
        "lora": {"r": 8},
        "model": {"path": "null", "tokenizer_path": "tok"},
        "output_dir": "/out",
    }


def test_dict_values_are_not_reparsed():
    # a path that YAML would read as null or a bool stays a string when given as a mapping
    assert nest({"data.path": "null", "model.path": "yes"}) == {"data": {"path": "null"}, "model": {"path": "yes"}}


def test_a_plain_dict_is_one_layer():
    assert build_values({"a.b": 1, "c": 2}) == {"a": {"b": 1}, "c": 2}
    assert build_values(None, "") == {}


@pytest.mark.parametrize(
    "yaml_text, message", [("- a\n- b\n", "mapping at the top level"), ("a: [1,\n", "invalid YAML")]
)
def test_bad_yaml_is_a_config_error(yaml_text, message):
    with pytest.raises(ConfigError, match=message):
        build_values({}, yaml_text)


def test_bad_layers_and_stage_names_are_config_errors():
    with pytest.raises(ConfigError, match="key=value"):
        build_values(["no-equals-sign"])
    with pytest.raises(ConfigError, match="expected key=value strings or mappings"):
        build_values([3])
    with pytest.raises(ConfigError, match="unknown stage 'nope'"):
        run_stage("nope", {})


def test_run_stage_validates_like_the_cli(tmp_path):
    with pytest.raises(ConfigError, match="n_code_trian: unknown key .*n_code_train"):
        run_stage("demo-data", {"output_dir": str(tmp_path), "n_code_trian": 5})
    with pytest.raises(ConfigError, match="output_dir: required"):
        run_stage("demo-data", [])


def test_run_stage_runs_the_stage(tmp_path):
    manifest = run_stage(
        "demo-data",
        ["n_code_train=30", "n_code_eval=5"],
        config_yaml=f"output_dir: {tmp_path}\nn_safety_train: 10\nn_safety_sft: 10\nn_safety_eval: 5\n",
    )
    assert manifest["counts"]["sft.jsonl"] == 40
    assert (tmp_path / "sft.jsonl").is_file()


def test_the_runner_imports_neither_kfp_nor_torch_nor_kubernetes():
    modules = ", ".join(f"trainer_lib.runner.{m}" for m in ("stage_api", "dispatch", "outcome", "trainjob", "kube"))
    code = f"import sys, {modules}; print([m for m in ('kfp', 'torch', 'kubernetes') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_training_tasks_layers_leave_out_what_was_not_given():
    values = dict(max_steps=5, lr=1e-4, batch_size=8, max_length=256, seed=0, overrides=["lr=3e-4"])
    values.update(params={"loss": "ipo", "beta": "", "rollout.n": None}, reward_functions=[], reward_weights=[0.5])
    typed, given, override, paths = training_layers(values, {"output_dir": "/out"})
    assert typed == {"max_steps": 5, "lr": 1e-4, "batch_size": 8, "data.max_length": 256, "seed": 0}
    assert (
        given == {"loss": "ipo", "reward.weights": [0.5]} and override == "lr=3e-4" and paths == {"output_dir": "/out"}
    )


def test_an_evaluation_tasks_layers_leave_out_what_was_not_given():
    settings = {
        "judge.kind": "refusal_rules",
        "humaneval.limit": 0,
        "seed": 0,
        "gate.rules": [],
        "served.variant": "int8",
    }
    wiring = {"models": ["a=/m"], "candidate": "", "reward_model_path": None, "served.export_dir": None}
    low, override, high = evaluation_layers(settings, ["seed=3"], wiring)
    # zeros and empty text are values; None and [] are "not given"; served.* only with an export to score
    assert low == {"judge.kind": "refusal_rules", "humaneval.limit": 0, "seed": 0} and override == "seed=3"
    assert high == {"models": ["a=/m"], "candidate": ""}
    served = evaluation_layers({**settings, "served.rules": []}, [], {**wiring, "served.export_dir": "/export"})
    assert served[0]["served.variant"] == "int8" and "served.rules" not in served[0]
    assert served[-1]["served.export_dir"] == "/export"
