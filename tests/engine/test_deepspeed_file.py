"""engine.deepspeed_config: a user's DeepSpeed JSON laid over ours, with the documented precedence."""

import json
import os

import pytest

from trainer_lib.cli import main
from trainer_lib.config import EngineConfig, load_config
from trainer_lib.engine import deepspeed_file
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = ["model.path=m", "data.path=d", "output_dir=o"]
OURS = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "train_batch_size": 2,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 0},
    "bf16": {"enabled": False},
}


def test_the_users_keys_win_auto_takes_ours_and_batch_keys_must_agree():
    user = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": 2,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto", "loss_scale": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": "auto"},
    }
    config, dropped = deepspeed_file.effective(OURS, user, "ds.json")
    assert config == {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 2,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": False},
        "fp16": {"loss_scale": 0},
        "zero_optimization": {"stage": 3, "overlap_comm": True},
    }
    assert dropped == ["optimizer"]
    with pytest.raises(
        ConfigError,
        match=r"engine.deepspeed_config: ds.json sets gradient_accumulation_steps=4, "
        r"but this run's is 1 \(from engine.gradient_accumulation_steps\)",
    ):
        deepspeed_file.effective(OURS, {"gradient_accumulation_steps": 4}, "ds.json")


def test_bad_files_are_one_clear_error(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=f"engine.deepspeed_config: {missing}: file not found"):
        deepspeed_file.read(str(missing))
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(ConfigError, match=f"{bad}: invalid JSON: line 1, column 35"):
        deepspeed_file.read(str(bad))
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object at the top level, got list"):
        deepspeed_file.read(str(bad))
    bad.write_text('{"zero_optimization": {"stage": 4}}')
    with pytest.raises(ConfigError, match="sets zero_optimization.stage=4; expected 0, 1, 2 or 3"):
        deepspeed_file.zero_settings(EngineConfig(deepspeed_config=str(bad)), deepspeed_file.read(str(bad)))


def test_the_strategy_follows_the_files_stage_and_offload(tmp_path):
    from trainer_lib.engine.strategy import DeepSpeedStrategy

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    strategy = DeepSpeedStrategy(EngineConfig(deepspeed_config=str(path)), micro_batch_size=2)
    assert (strategy.zero_stage, strategy.offload_optimizer, strategy.offload_params) == (2, True, False)
    assert strategy.ds_config()["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert "offload_optimizer" not in strategy.ds_config(train=False)["zero_optimization"]
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8}))
    with pytest.raises(
        ConfigError,
        match="sets train_micro_batch_size_per_gpu=8, but this run's is 2 "
        r"\(from batch_size\)",
    ):
        DeepSpeedStrategy(EngineConfig(deepspeed_config=str(path)), micro_batch_size=2)


def test_trl_and_llamafactory_deepspeed_key_reaches_it():
    cfg = load_config(SFTConfig, [{"deepspeed": "ds_z3.json"}], REQUIRED, stage="sft")
    assert cfg.engine.deepspeed_config == "ds_z3.json"


def test_a_stage_3_file_with_options_we_do_not_expose_trains_and_is_logged(
    tiny_model_dir, chat_jsonl, tmp_path, capsys
):
    path = tmp_path / "ds_z3.json"
    path.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                "zero_optimization": {
                    "stage": 3,
                    "stage3_prefetch_bucket_size": 12345,
                    "overlap_comm": False,
                    "zero_quantized_gradients": True,
                    "stage3_param_persistence_threshold": 100,
                    "reduce_bucket_size": "auto",
                },
            }
        )
    )
    out = tmp_path / "run"
    assert (
        main(
            [
                "sft",
                f"model.path={tiny_model_dir}",
                f"data.path={chat_jsonl}",
                f"output_dir={out}",
                f"engine.deepspeed_config={path}",
                "batch_size=2",
                "data.max_length=64",
                "max_steps=3",
                "logging_steps=1",
                "save_steps=0",
                "eval_steps=0",
                "lr=3e-3",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "estimate_zero3_model_states_mem_needs; ZeRO-3" in printed  # the strategy follows the file's stage
    assert "engine.deepspeed_config: " + str(path) + ": optimizer left out" in printed
    logged = [line for line in printed.splitlines() if line.startswith("deepspeed config: ")]
    config = json.loads(logged[0].removeprefix("deepspeed config: "))
    assert json.load(open(out / "ds_config.json")) == config
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_prefetch_bucket_size"] == 12345 and zero["zero_quantized_gradients"]
    assert zero["stage3_param_persistence_threshold"] == 100 and "reduce_bucket_size" not in zero
    assert "optimizer" not in config and config["train_micro_batch_size_per_gpu"] == 2
    train = [json.loads(line) for line in open(out / "metrics.jsonl") if '"train"' in line]
    assert len(train) == 3 and all(r["grad_norm"] > 0 for r in train)
    assert os.path.exists(out / "model.safetensors")


def test_deepspeeds_own_refusal_names_the_users_file(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer_lib.engine.strategy import DeepSpeedStrategy

    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comms": True}}))
    strategy = DeepSpeedStrategy(EngineConfig(deepspeed_config=str(path)), micro_batch_size=1)
    strategy.setup_distributed()
    with pytest.raises(
        ConfigError,
        match=f"engine.deepspeed_config: {path}: DeepSpeed refused the config: "
        ".*overlap_comms.*Extra inputs are not permitted",
    ):
        strategy.prepare(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lr=1e-3, weight_decay=0.0, total_steps=1)
