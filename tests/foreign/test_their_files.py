"""LLaMA-Factory's own example configs and demo data run unchanged (tests/data/foreign/README.md says where
they come from): only the model, the output directory and the step count are given on the command line."""

import json
import os
import re

import pytest

from tests.conftest import REPO
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.data.dataset import source_specs
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.sft import SFTConfig

LLAMAFACTORY = os.path.join(REPO, "tests", "data", "foreign", "llamafactory")
SFT_FILES = (
    "examples/train_lora/qwen3_lora_sft.yaml",
    "examples/train_full/qwen3_full_sft.yaml",
    "examples/train_lora/qwen3_lora_sft_ds3.yaml",  # DeepSpeed ZeRO-3, here on one process
)


def _mapping(err: str) -> dict[str, str]:
    """``their key -> what it became`` from the ``config:`` lines on stderr."""
    lines = [line[len("config: ") :] for line in err.splitlines() if line.startswith("config: ")]
    return dict(line.split(" -> ", 1) for line in lines if " -> " in line)


@pytest.fixture(scope="module")
def lf_model(tmp_path_factory) -> str:
    """A 2-layer Llama whose tokenizer is trained on the demo rows, so that a row is words, not letters,
    and the example's 2048-token cutoff packs the demo data into one short row."""
    from trainer_lib.demo.tiny_model import make_tiny_model

    texts = []
    for name in ("identity.json", "alpaca_en_demo.json"):
        with open(os.path.join(LLAMAFACTORY, "data", name), encoding="utf-8") as fh:
            texts += [" ".join(v for v in row.values() if v) for row in json.load(fh)]
    out = tmp_path_factory.mktemp("models") / "lf-tiny"
    return make_tiny_model(str(out), texts * 3, vocab_size=600, num_layers=2, hidden_size=64, seed=0)


@pytest.fixture
def in_llamafactory(monkeypatch, tmp_path):
    """Run from the copied LLaMA-Factory tree, as its README runs the examples; a private data cache."""
    monkeypatch.chdir(LLAMAFACTORY)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("POSTTRAIN_NO_PROGRESS", "1")


@pytest.mark.parametrize("name", SFT_FILES)
def test_their_sft_examples_train_and_save_a_model(name, lf_model, in_llamafactory, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["train", name, f"model_name_or_path={lf_model}", f"output_dir={out}", "max_steps=2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    mapping = _mapping(err)
    assert all(target.strip() for target in mapping.values()), mapping  # every line says what became of it
    assert mapping["stage"] == "(checked: posttrain sft)" and mapping["dataset"] == "data.dataset"
    assert mapping["plot_loss"] == "loss_plot" and mapping["ddp_timeout"].startswith("(no effect")
    assert mapping["max_samples"] == "data.max_rows" and mapping["overwrite_output_dir"].startswith("resume=False")
    assert "config: max_steps=2 wins over num_epochs=3.0 (max_steps > 0 decides, as in transformers)" in err
    assert "data: identity (8 rows), alpaca_en_demo (2 rows) mixed by concat: 10 training rows" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2  # 3 epochs of one packed row at accumulation 2 or 8 would be 1 or 2 steps
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert (out / "training_loss.png").read_bytes().startswith(b"\x89PNG")  # their plot_loss: true
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert ds_config["bf16"]["enabled"] is True
    if "ds3" in name or "full" in name:
        assert ds_config["zero_optimization"]["stage"] == 3  # from their examples/deepspeed/ds_z3_config.json
    if "lora" in name:
        assert mapping["finetuning_type"] == "(LoRA on, rank from lora_rank)"
        assert mapping["lora_target"] == "lora.target_modules=all-linear"
    else:
        assert mapping["finetuning_type"] == "lora.r=0"


def test_their_file_as_it_is_trains_for_its_epochs(in_llamafactory, capsys):
    argv = ["train", SFT_FILES[1], "model_name_or_path=m", "output_dir=o"]
    assert main([*argv, "--print-config"]) == 2  # a warmup ratio of epochs needs the data: one clear line
    assert "error: warmup_ratio: 0.1 of the steps cannot be counted before the data is read" in capsys.readouterr().err
    assert main([*argv, "warmup_steps=3", "--print-config"]) == 0  # a later layer's warmup_steps wins
    printed = capsys.readouterr()
    assert "num_epochs: 3.0" in printed.out and "warmup_steps: 3" in printed.out and "wins over" not in printed.err


def test_dataset_dir_from_the_command_line_or_a_second_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no data/ here: LLaMA-Factory's default dataset_dir finds nothing
    their = os.path.join(LLAMAFACTORY, "examples", "train_lora", "qwen3_lora_sft.yaml")
    required = ["model_name_or_path=m", "output_dir=o", "max_steps=2"]
    assert main(["sft", their, *required, "--print-config"]) == 2
    assert "data.dataset: names are looked up in data/dataset_info.json" in capsys.readouterr().err

    data_dir = os.path.join(LLAMAFACTORY, "data")
    cfg = load_config(SFTConfig, [their], [*required, f"dataset_dir={data_dir}"], stage="sft")
    (identity, alpaca), _ = source_specs(cfg.data)
    assert identity.path == os.path.join(data_dir, "identity.json") and alpaca.format == "alpaca"

    second = tmp_path / "paths.yaml"
    second.write_text(f"dataset_dir: {data_dir}\n")
    cfg = load_config(SFTConfig, [their, str(second)], required, stage="sft")
    assert source_specs(cfg.data)[0][0].path == os.path.join(data_dir, "identity.json")
    # a later data.path replaces the file's dataset names, as any later layer wins
    cfg = load_config(SFTConfig, [their], [*required, "data.path=mine.jsonl"], stage="sft")
    assert (cfg.data.path, cfg.data.dataset) == ("mine.jsonl", [])


def test_a_bare_yaml_argument_is_a_config_file(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yml"
    first.write_text("learning_rate: 1.0e-3\nmodel_name_or_path: m\n")
    second.write_text("learning_rate: 2.0e-3\n")
    argv = ["sft", str(first), "--config", str(second), "data.path=d", "output_dir=o", "--print-config"]
    assert main(argv) == 0
    assert "lr: 0.002" in capsys.readouterr().out  # files in the order given, bare or not
    assert main(["sft", str(second), str(first), "data.path=d", "output_dir=o", "--print-config"]) == 0
    assert "lr: 0.001" in capsys.readouterr().out


@pytest.mark.parametrize(
    "stage, expected",
    [
        ("rm", "posttrain reward"),
        ("kto", "posttrain dpo"),
        ("dpo", "posttrain dpo"),
        ("ppo", "posttrain ppo"),
        ("pt", "posttrain sft"),
    ],
)
def test_train_picks_the_stage_from_their_stage_key(stage, expected, tmp_path, capsys):
    cfg_file = tmp_path / "their.yaml"
    cfg_file.write_text(f"stage: {stage}\nmodel_name_or_path: m\noutput_dir: o\n")
    assert main(["train", str(cfg_file), "data.path=d", "--help"]) == 0
    assert f"usage: {expected} " in capsys.readouterr().out


def test_train_refuses_a_stage_it_does_not_have(tmp_path, capsys):
    cfg_file = tmp_path / "orpo.yaml"
    cfg_file.write_text("stage: orpo\nmodel_name_or_path: m\n")
    assert main(["train", str(cfg_file)]) == 2
    assert "error: stage: LLaMA-Factory's stage 'orpo' has no posttrain counterpart" in capsys.readouterr().err
    cfg_file.write_text("model_name_or_path: m\n")
    assert main(["train", str(cfg_file)]) == 2
    assert f"error: stage: {cfg_file} names no LLaMA-Factory stage" in capsys.readouterr().err
    assert main(["train"]) == 2 and "usage: posttrain train FILE.yaml" in capsys.readouterr().out


def test_their_keys_we_cannot_honour_are_refused_with_the_reason():
    required = {"model_name_or_path": "m", "dataset_name": "d", "output_dir": "o"}
    for layer, reason in [
        ({"quantization_bit": 4}, "quantization_bit: 4: quantized (QLoRA) training is not supported"),
        ({"push_to_hub": True}, "hub.push: needs hub.model_id"),
        ({"eval_strategy": "epoch"}, "eval_strategy: 'epoch' is not supported: once per epoch is not built in"),
        ({"resume_from_checkpoint": "saves/checkpoint-500"}, "posttrain resumes only its own checkpoints"),
        ({"assistant_only_loss": False}, "assistant_only_loss: false is not supported"),
        ({"optim": "sgd"}, "optim: expected one of adamw_hf, adamw_torch, adamw_torch_fused, got 'sgd'"),
        ({"dtype": "float16"}, "dtype: 'float16' is not supported: fp16 is not supported"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(reason)):
            load_config(SFTConfig, [{**required, **layer}])
