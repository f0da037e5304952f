"""trainer_lib.stage_api: YAML text + override layers -> a stage config, then run."""

import subprocess
import sys

import pytest

from trainer_lib.config.layers import build_values, nest
from trainer_lib.errors import ConfigError
from trainer_lib.stage_api import run_stage


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


def test_stage_api_imports_neither_kfp_nor_torch():
    code = "import sys, trainer_lib.stage_api; print([m for m in ('kfp', 'torch') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
