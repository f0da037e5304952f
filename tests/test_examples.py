"""Every ready-made config in examples/ (and the real-model recipes' in examples/real/) validates:
`posttrain <stage> --config F --print-config` exits 0."""

import os

import pytest
import yaml

from trainer_lib.cli import main

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
FILES = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".yaml")) + sorted(
    os.path.join("real", f) for f in os.listdir(os.path.join(EXAMPLES, "real")) if f.endswith(".yaml")
)


def test_the_examples_are_there():
    assert {
        "sft-qwen2.5-0.5b.yaml",
        "sft-qwen2.5-1.5b.yaml",
        "sft-llama-3-8b-lora.yaml",
        "dpo-llama-3-8b-lora.yaml",
        "sft-llama-3-8b-zero3.yaml",
        "grpo-qwen2.5-1.5b-code.yaml",
        "sft-llama-3-70b-zero3-offload.yaml",
        "sft-llama-3-70b-tp8.yaml",
        "sft-llama-3-70b-tp8-pp2.yaml",
    } <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_example_config_validates(name, capsys):
    stage = os.path.basename(name).split("-", 1)[0]  # <stage>-<model or task>.yaml
    path = os.path.join(EXAMPLES, name)
    assert main([stage, "--config", path, "--print-config"]) == 0, capsys.readouterr().err
    resolved = yaml.safe_load(capsys.readouterr().out)
    written = yaml.safe_load(open(path))
    assert resolved["model"]["path"] == written["model"]["path"]  # the file's own keys, no mapping needed
