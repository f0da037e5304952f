"""TRL's and LLaMA-Factory's config files run as they are: their keys map to ours, printed once."""

import json

import pytest

from tests.conftest import REPO
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.data.dataset import source_specs
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.dpo import DPOConfig
from trainer_lib.stages.training.grpo import GRPOConfig
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output_dir": "out"}

TRL_SFT = """\
# written for `trl sft --config`: TRL's own key names
model_name_or_path: {model}
dataset_name: {data}
output_dir: {out}
learning_rate: 3.0e-3
lr_scheduler_type: linear
warmup_ratio: 0.25
per_device_train_batch_size: 2
per_device_eval_batch_size: 4
gradient_accumulation_steps: 1
max_steps: 4
max_length: 64
packing: false
logging_steps: 2
eval_steps: 2
save_steps: 4
save_total_limit: 1
weight_decay: 0.01
max_grad_norm: 1.0
gradient_checkpointing: false
bf16: false
seed: 1
use_peft: true
lora_r: 8
lora_alpha: 16
lora_dropout: 0.0
lora_target_modules: [q_proj, v_proj]
"""

LLAMAFACTORY_SFT = """\
### model
model_name_or_path: {model}
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 4
lora_target: q_proj,k_proj,v_proj,o_proj

### dataset
cutoff_len: 64
val_size: 0.1
preprocessing_num_workers: 1

### output
output_dir: {out}
logging_steps: 1
save_steps: 3

### train
per_device_train_batch_size: 2
gradient_accumulation_steps: 2
learning_rate: 1.0e-3
max_steps: 3
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: false
"""


def _stderr_mapping(err: str) -> dict:
    return dict(line[len("config: ") :].split(" -> ", 1) for line in err.splitlines() if line.startswith("config: "))


def test_a_trl_sft_config_trains_unchanged(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    out = tmp_path / "out"
    cfg_file = tmp_path / "trl_sft.yaml"
    cfg_file.write_text(TRL_SFT.format(model=tiny_model_dir, data=chat_jsonl, out=out))
    assert main(["sft", "--config", str(cfg_file)]) == 0
    mapping = _stderr_mapping(capsys.readouterr().err)
    assert mapping["per_device_train_batch_size"] == "batch_size"
    assert mapping["learning_rate"] == "lr" and mapping["max_length"] == "data.max_length"
    assert mapping["bf16"] == "engine.precision=fp32" and mapping["lora_r"] == "lora.r"
    assert mapping["warmup_ratio"].startswith("warmup_steps=1 ")
    assert "output_dir" not in mapping and "max_steps" not in mapping  # our own names: nothing to map
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4
    cfg = load_config(SFTConfig, str(cfg_file))
    assert (cfg.lr, cfg.batch_size, cfg.eval_batch_size, cfg.lr_scheduler) == (3e-3, 2, 4, "linear")
    assert cfg.lora.r == 8 and cfg.lora.target_modules == ["q_proj", "v_proj"] and not cfg.data.packing
    assert cfg.warmup_steps == 1 and cfg.model.path == tiny_model_dir and cfg.data.path == chat_jsonl


def test_a_llamafactory_sft_config_trains_unchanged(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    out = tmp_path / "out"
    cfg_file = tmp_path / "llama3_lora_sft.yaml"
    cfg_file.write_text(LLAMAFACTORY_SFT.format(model=tiny_model_dir, out=out))
    assert main(["sft", "--config", str(cfg_file), f"data.path={chat_jsonl}"]) == 0
    mapping = _stderr_mapping(capsys.readouterr().err)
    assert mapping["cutoff_len"] == "data.max_length" and mapping["lora_rank"] == "lora.r"
    assert mapping["stage"] == "(checked: posttrain sft)" and mapping["do_train"] == "(implied)"
    assert mapping["gradient_accumulation_steps"] == "engine.gradient_accumulation_steps"
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    cfg = load_config(SFTConfig, str(cfg_file), [f"data.path={chat_jsonl}"], stage="sft")
    assert cfg.lora.r == 4 and cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert cfg.engine.gradient_accumulation_steps == 2 and cfg.data.eval_fraction == 0.1
    assert cfg.warmup_steps == 1  # ceil(0.1 * 3)


def test_the_mapping_is_printed_once_per_key(tmp_path, capsys):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("learning_rate: 1.0e-3\nper_device_train_batch_size: 4\n")
    second.write_text("learning_rate: 2.0e-3\n")
    assert (
        main(
            [
                "sft",
                "--config",
                str(first),
                "--config",
                str(second),
                "model.path=m",
                "data.path=d",
                "output_dir=o",
                "--print-config",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert captured.err.count("config: learning_rate -> lr") == 1
    assert "lr: 0.002" in captured.out and "batch_size: 4" in captured.out  # files merge in order


def test_later_layers_win_whatever_names_they_use():
    cfg = load_config(SFTConfig, [{**REQUIRED, "learning_rate": 1e-3}], ["lr=5e-4"])
    assert cfg.lr == 5e-4
    cfg = load_config(SFTConfig, [{**REQUIRED, "lr": 1e-3}], ["learning_rate=5e-4"])
    assert cfg.lr == 5e-4


def test_unknown_keys_are_still_refused(capsys, tmp_path):
    cfg_file = tmp_path / "trl.yaml"
    cfg_file.write_text("model_name_or_path: m\nneftune_noise_alpha: 5\n")  # a TRL key we have nothing for
    assert main(["sft", "--config", str(cfg_file), "data.path=d", "output_dir=o"]) == 2
    assert "error: neftune_noise_alpha: unknown key" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="lernin_rate: unknown key"):
        load_config(SFTConfig, [REQUIRED], ["lernin_rate=1"])
    with pytest.raises(ConfigError, match="num_generations: unknown key"):  # a GRPO key in SFT
        load_config(SFTConfig, [{**REQUIRED, "num_generations": 4}])


@pytest.mark.parametrize(
    "layer, message",
    [
        ({"learning_rate": 1e-3, "lr": 2e-3}, "learning_rate: sets lr to 0.001, but lr sets it to 0.002"),
        ({"max_seq_length": 64, "cutoff_len": 128}, "sets data.max_length to 128, but max_seq_length"),
        ({"stage": "dpo"}, "'dpo' is LLaMA-Factory's stage for `posttrain dpo`, but this is `posttrain sft`"),
        ({"stage": "orpo"}, "stage: LLaMA-Factory's stage 'orpo' has no posttrain counterpart"),
        ({"finetuning_type": "freeze"}, "finetuning_type: expected lora or full"),
        ({"fp16": True}, "fp16: fp16 mixed precision is not supported"),
        ({"do_train": False}, "do_train: false"),
        (
            {"dataset": "alpaca_en_demo", "dataset_dir": "/nonexistent"},
            "data.dataset: names are looked up in /nonexistent/dataset_info.json (LLaMA-Factory's dataset_dir), "
            "which does not exist; set data.dataset_dir (dataset_dir), or data.path to a file (set by dataset)",
        ),
        ({"num_train_epochs": 2, "warmup_ratio": 0.1}, "warmup_ratio: 0.1 of the steps cannot be counted"),
        ({"warmup_steps": 5, "warmup_ratio": 0.1}, "set either warmup_ratio or warmup_steps"),
        (
            {"per_device_train_batch_size": 0},
            "batch_size: expected a positive number, got 0 (set by per_device_train_batch_size)",
        ),
    ],
)
def test_clear_errors(layer, message):
    with pytest.raises(ConfigError) as err:
        load_config(SFTConfig, [REQUIRED, layer], stage="sft")
    assert message in str(err.value)


def test_lora_switches():
    assert load_config(SFTConfig, [{**REQUIRED, "use_peft": True}]).lora.r == 16  # TRL's default rank
    assert load_config(SFTConfig, [{**REQUIRED, "use_peft": False, "lora_r": 32}]).lora.r == 0
    assert load_config(SFTConfig, [{**REQUIRED, "finetuning_type": "lora"}]).lora.r == 8  # LLaMA-Factory's
    assert load_config(SFTConfig, [{**REQUIRED, "finetuning_type": "full", "lora_rank": 8}]).lora.r == 0
    cfg = load_config(SFTConfig, [{**REQUIRED, "finetuning_type": "lora", "lora_target": "all"}])
    assert cfg.lora.target_modules == ["all-linear"]
    with pytest.raises(ConfigError, match="all-linear already names every linear layer"):
        load_config(SFTConfig, [{**REQUIRED, "lora_r": 4, "lora_target_modules": ["all-linear", "q_proj"]}])


def test_preference_and_rl_keys(capsys):
    cfg = load_config(DPOConfig, [{**REQUIRED, "pref_beta": 0.2, "pref_loss": "ipo"}], stage="dpo")
    assert (cfg.beta, cfg.loss) == (0.2, "ipo")
    cfg = load_config(DPOConfig, [{**REQUIRED, "beta": 0.3, "loss_type": "hinge"}])
    assert (cfg.beta, cfg.loss) == (0.3, "hinge")
    assert load_config(DPOConfig, [{**REQUIRED, "stage": "kto"}], stage="dpo").loss == "kto"
    with pytest.raises(ConfigError, match=r"loss: expected one of .* got 'exo_pair' \(set by loss_type\)"):
        load_config(DPOConfig, [{**REQUIRED, "loss_type": "exo_pair"}])
    rl = {
        **REQUIRED,
        "reward": {"functions": ["code_execution"]},
        "num_generations": 8,
        "max_completion_length": 128,
        "loss_type": "dr_grpo",
        "max_steps": 10,
        "warmup_ratio": 0.1,
        "prompts_per_step": 4,
        "mini_batch_size": 16,
    }
    cfg = load_config(GRPOConfig, [rl])
    # TRL's loss_type is the token aggregation; its scale_rewards picks the advantage (tests/foreign/test_trl_files.py)
    assert (cfg.rollout.n, cfg.rollout.max_new_tokens, cfg.loss_aggregation) == (8, 128, "constant")
    assert cfg.warmup_steps == 2  # 10 steps x 2 optimizer updates per step
    assert "config: num_generations -> rollout.n" in capsys.readouterr().err


def test_hub_dataset_and_revision_keys(tmp_path, capsys):
    trl = {
        "model": {"path": "m"},
        "output_dir": "out",
        "dataset_name": "openai/gsm8k",
        "dataset_config": "main",
        "dataset_train_split": "train",
        "dataset_test_split": "test",
        "model_revision": "v1.0",
    }
    cfg = load_config(SFTConfig, [trl])
    assert (cfg.data.path, cfg.data.subset, cfg.data.split, cfg.data.eval_split) == (
        "openai/gsm8k",
        "main",
        "train",
        "test",
    )
    assert cfg.model.revision == "v1.0"
    assert "config: dataset_config -> data.subset" in capsys.readouterr().err
    # LLaMA-Factory's dataset_info.json entries may name a hub dataset's subset and split
    (tmp_path / "dataset_info.json").write_text(
        json.dumps(
            {
                "gsm": {"hf_hub_url": "openai/gsm8k", "subset": "main", "split": "train"},
                "gsm_test": {"hf_hub_url": "openai/gsm8k", "subset": "main", "split": "test"},
            }
        )
    )
    layer = {"model": {"path": "m"}, "output_dir": "out", "dataset": "gsm", "dataset_dir": str(tmp_path)}
    assert load_config(SFTConfig, [layer], stage="sft").data.dataset == ["gsm"]
    (train,), (held_out,) = source_specs(load_config(SFTConfig, [{**layer, "eval_dataset": "gsm_test"}]).data)
    assert (train.path, train.subset, train.split) == ("openai/gsm8k", "main", "train")
    assert (held_out.path, held_out.subset, held_out.split) == ("openai/gsm8k", "main", "test")


def test_the_documented_table_lists_every_mapped_key():
    import os
    import re

    from trainer_lib.config import aliases as config_aliases

    doc = open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8").read()
    block = re.search(r"<!-- aliases:start[^>]*-->\n(.*?)\n<!-- aliases:end -->", doc, re.S)
    assert block, "docs/configuration.md lost its <!-- aliases:start --> ... <!-- aliases:end --> table"
    assert block.group(1) == config_aliases.alias_table(), (
        "docs/configuration.md's alias table is stale: paste trainer_lib.config.aliases.alias_table() between "
        "the markers"
    )
    listed = set(re.findall(r"^\| `([^`]+)` \|", block.group(1), re.M))
    tables = (config_aliases.RENAMES, config_aliases.RULES, config_aliases.DEFERRED, config_aliases.NO_EFFECT)
    assert listed == set().union(*tables)


#: a value for each of their keys that a rule reads, as their files write them.
SAMPLES = {
    "bf16": True,
    "fp16": False,
    "use_peft": True,
    "finetuning_type": "lora",
    "stage": "sft",
    "do_train": True,
    "deepspeed": "ds.json",
    "template": "qwen3_nothink",
    "overwrite_output_dir": True,
    "resume_from_checkpoint": None,
    "save_only_model": False,
    "eval_strategy": "steps",
    "evaluation_strategy": "no",
    "save_strategy": "steps",
    "logging_strategy": "steps",
    "push_to_hub": False,
    "dtype": "bfloat16",
    "torch_dtype": "auto",
    "flash_attn": "auto",
    "quantization_bit": None,
    "completion_only_loss": None,
    "assistant_only_loss": True,
    "dataset_text_field": "text",
    "optim": "adamw_torch",
    "mask_truncated_completions": False,
    "use_vllm": False,
    "load_in_4bit": False,
    "load_in_8bit": False,
    "num_processes": 1,
    "precompute_ref_log_probs": False,
    "max_prompt_length": 128,
}
#: TRL's keys of other stages (GRPO, DPO) or that set data.path: tests/foreign/test_trl_files.py
#: (gradient_accumulation_steps: test_their_rl_step_size_comes_from_the_batch_keys)
ELSEWHERE = {
    "loss_type",
    "scale_rewards",
    "importance_sampling_level",
    "reward_funcs",
    "datasets",
    "gradient_accumulation_steps",
}


def test_every_key_read_says_what_it_became(capsys):
    from trainer_lib.config import aliases as config_aliases

    secrets = {"hub_token", "hf_hub_token", "token", "eos_token"}  # refused, tested elsewhere
    assert set(SAMPLES) == set(config_aliases.RULES) - secrets - ELSEWHERE
    lf = {key: value for key, value in SAMPLES.items() if key != "use_peft"}  # TRL's LoRA switch: below
    layer = {**REQUIRED, **lf, **dict.fromkeys(config_aliases.NO_EFFECT, 1), "lora_rank": 4}
    cfg = load_config(SFTConfig, [layer], stage="sft")
    mapping = _stderr_mapping(capsys.readouterr().err)
    assert set(lf) | set(config_aliases.NO_EFFECT) <= set(mapping)
    assert all(target.strip() for target in mapping.values()), mapping
    assert mapping["finetuning_type"] == "(LoRA on, rank from lora_rank)" and cfg.lora.r == 4
    assert mapping["ddp_timeout"] == "(no effect here: posttrain's strategy sets up the process group)"
    assert mapping["overwrite_output_dir"].startswith("resume=False") and cfg.resume is False
    assert cfg.engine.precision == "bf16" and cfg.engine.deepspeed_config == "ds.json" and cfg.eval_steps == 0
    load_config(SFTConfig, [{**REQUIRED, "use_peft": True, "lora_r": 8}])
    assert _stderr_mapping(capsys.readouterr().err)["use_peft"] == "(LoRA on, rank from lora_r)"


def test_strategy_no_turns_the_schedule_off_and_a_float_warmup_steps_is_a_ratio(capsys):
    cfg = load_config(SFTConfig, [{**REQUIRED, "eval_strategy": "no", "eval_steps": 500, "save_strategy": "no"}])
    assert (cfg.eval_steps, cfg.save_steps) == (0, 0)
    mapping = _stderr_mapping(capsys.readouterr().err)
    assert mapping["eval_steps"] == "(ignored: eval_strategy is no)"
    assert mapping["eval_strategy"] == "eval_steps=0 (eval data is still evaluated at the end)"
    cfg = load_config(SFTConfig, [{**REQUIRED, "warmup_steps": 0.1, "max_steps": 30}])
    assert cfg.warmup_steps == 3 and "warmup_steps -> warmup_steps=3 (0.1 of 30 steps)" in capsys.readouterr().err
    cfg = load_config(SFTConfig, [{**REQUIRED, "dtype": "float32", "flash_attn": "fa2"}])
    assert (cfg.engine.precision, cfg.model.attn_implementation) == ("fp32", "flash_attention_2")
    with pytest.raises(ConfigError, match="attn_implementation: sets model.attn_implementation to 'eager', but "):
        load_config(SFTConfig, [{**REQUIRED, "flash_attn": "fa2", "attn_implementation": "eager"}])


def test_their_rl_step_size_comes_from_the_batch_keys():
    """TRL's GRPO: a step is per_device_train_batch_size x gradient_accumulation_steps completions, in groups of
    num_generations, and one optimizer update of it per pass; SFT keeps accumulation on the engine."""
    keys = {**REQUIRED, "reward": {"functions": ["length"]}, "per_device_train_batch_size": 4}
    cfg = load_config(GRPOConfig, [{**keys, "gradient_accumulation_steps": 2, "num_generations": 4}])
    assert (cfg.prompts_per_step, cfg.rollout.n, cfg.mini_batch, cfg.updates_per_step()) == (2, 4, 8, 1)
    with pytest.raises(ConfigError, match="give num_generations too"):
        load_config(GRPOConfig, [{**keys, "gradient_accumulation_steps": 2}])
    with pytest.raises(ConfigError, match="not a whole number of groups of num_generations=3"):
        load_config(GRPOConfig, [{**keys, "gradient_accumulation_steps": 2, "num_generations": 3}])
    sft = load_config(SFTConfig, [{**REQUIRED, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}])
    assert (sft.batch_size, sft.engine.gradient_accumulation_steps) == (4, 2)
