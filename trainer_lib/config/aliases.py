"""TRL's and LLaMA-Factory's config key names, mapped to ours.

Users arrive with a YAML file written for TRL (``trl sft --config``, ``SFTConfig``/``DPOConfig``/
``GRPOConfig`` field names) or for LLaMA-Factory (``llamafactory-cli train``). :func:`translate`
turns one such layer into our keys before the dataclass is built: a top-level key that is not one
of the stage's own keys and has an entry here becomes ours, and the mapping is printed once, one
line per key (``config: per_device_train_batch_size -> batch_size``). The tables:

* :data:`RENAMES`: their name for one of our keys;
* :data:`RULES`: a key whose value decides what it sets (``finetuning_type: full`` is ``lora.r=0``),
  or which is refused, with the reason, for a value posttrain cannot honour (``fp16: true``);
* :data:`NO_EFFECT`: keys of their runtime with no counterpart here, accepted with one line saying so;
* :data:`DEFERRED`: ``warmup_ratio``, resolved once the config is built.

Every other key is left as it is, so a key we do not support is refused exactly like any unknown key.
Only the names are translated; the defaults stay ours (a TRL file without ``lora_alpha`` gets our
16, not TRL's 32). A key whose target the stage does not have (``num_generations`` in SFT) is left
alone and refused as unknown. Pure Python: this runs when a config is validated.
"""

from __future__ import annotations

import copy
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_lib.errors import ConfigError
from trainer_lib.values import lookup_dotted, parse_bool, section_for

#: their key -> our key(s); the first one the stage's config has is used.
RENAMES: dict[str, tuple[str, ...]] = {
    # transformers.TrainingArguments / TRL
    "learning_rate": ("lr",),
    "per_device_train_batch_size": ("batch_size",),
    "per_device_eval_batch_size": ("eval_batch_size",),
    "gradient_accumulation_steps": ("engine.gradient_accumulation_steps",),
    "num_train_epochs": ("num_epochs",),
    "lr_scheduler_type": ("lr_scheduler",),
    "max_grad_norm": ("engine.max_grad_norm",),
    "gradient_checkpointing": ("engine.gradient_checkpointing",),
    "model_name_or_path": ("model.path",),
    "trust_remote_code": ("model.trust_remote_code",),
    "dataset_name": ("data.path",),
    "dataset_config": ("data.subset",),
    "dataset_train_split": ("data.split",),
    "dataset_test_split": ("data.eval_split",),
    "model_revision": ("model.revision",),  # TRL's ModelConfig and LLaMA-Factory's ModelArguments
    "chat_template_path": ("model.chat_template",),
    "max_length": ("data.max_length",),
    "max_seq_length": ("data.max_length",),
    "packing": ("data.packing",),
    "lora_r": ("lora.r",),
    "lora_alpha": ("lora.alpha",),
    "lora_dropout": ("lora.dropout",),
    "lora_target_modules": ("lora.target_modules",),
    "num_generations": ("rollout.n",),
    "max_completion_length": ("rollout.max_new_tokens",),
    "temperature": ("rollout.temperature",),
    "teacher_model_name_or_path": ("teacher.path",),  # TRL's GKDConfig (lmbda and beta are ours too)
    # TRL's GRPOConfig / RLOOConfig / PPOConfig / KTOConfig
    "reward_weights": ("reward.weights",),
    "epsilon_high": ("clip_high",),
    "num_iterations": ("ppo_epochs",),
    "num_ppo_epochs": ("ppo_epochs",),
    "kl_coef": ("kl.coef", "beta"),  # PPO: the penalty in the reward; RLOO (before TRL 0.20): beta
    "reward_model_path": ("reward.model_path",),
    "desirable_weight": ("kto_desirable_weight",),
    "undesirable_weight": ("kto_undesirable_weight",),
    # LLaMA-Factory
    "cutoff_len": ("data.max_length",),
    "lora_rank": ("lora.r",),
    "lora_target": ("lora.target_modules",),
    "pref_beta": ("beta",),
    "pref_loss": ("loss",),
    "val_size": ("data.eval_fraction",),
    "preprocessing_num_workers": ("data.num_workers",),
    "dataset": ("data.dataset",),  # names in dataset_info.json, comma-separated
    "dataset_dir": ("data.dataset_dir",),
    "eval_dataset": ("data.eval_dataset",),
    "mix_strategy": ("data.mix_strategy",),
    "interleave_probs": ("data.interleave_probs",),
    "max_samples": ("data.max_rows",),
    "plot_loss": ("loss_plot",),
    "reward_model": ("reward.model_path",),  # stage: ppo
    "max_new_tokens": ("rollout.max_new_tokens",),  # LLaMA-Factory's generation keys, used by stage: ppo
    "top_p": ("rollout.top_p",),
    "top_k": ("rollout.top_k",),
    # transformers / TRL's ModelConfig
    "attn_implementation": ("model.attn_implementation",),
    # transformers' TrainingArguments: publishing the final model
    "hub_model_id": ("hub.model_id",),
    "hub_private_repo": ("hub.private",),
}

#: keys that only concern their runtime and have no counterpart here: accepted, with the reason
#: printed in one line.
NO_EFFECT: dict[str, str] = {
    "dataloader_num_workers": "micro-batches are collated in the training process",
    "dataloader_pin_memory": "the loop moves each micro-batch to the device itself",
    "dataloader_persistent_workers": "micro-batches are collated in the training process",
    "ddp_timeout": "posttrain's strategy sets up the process group",
    "ddp_find_unused_parameters": "DeepSpeed, not DDP, wraps the model",
    "overwrite_cache": "the data cache is keyed by the files' content and every setting, so a change is read anyway",
    "remove_unused_columns": "only the columns of the data format are read",
    "logging_first_step": "the first record is logged at logging_steps",
    "include_num_input_tokens_seen": "every log record has tokens_per_s",
    "use_liger_kernel": "transformers' own modules; the LM head is tiled anyway (model.chunked_lm_head)",
    "gradient_checkpointing_kwargs": "engine.gradient_checkpointing turns recomputation on with posttrain's settings",
    "log_completions": "completions are not logged one by one; metrics.jsonl has their mean reward and length",
}

#: their key -> {their value: our value}, for the values that are spelled differently.
VALUE_RENAMES: dict[str, dict[Any, Any]] = {"lora_target": {"all": "all-linear"}}

#: LLaMA-Factory's ``stage`` -> the posttrain stage that does the same.
LLAMAFACTORY_STAGES = {"pt": "sft", "sft": "sft", "rm": "reward", "dpo": "dpo", "kto": "dpo", "ppo": "ppo"}

TRL_LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
LLAMAFACTORY_LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target")
TRL_DEFAULT_LORA_R = 16  # TRL's ModelConfig.lora_r, used when a file says only use_peft: true
LLAMAFACTORY_DEFAULT_LORA_RANK = 8  # LLaMA-Factory's lora_rank, for finetuning_type: lora alone


@dataclass
class Context:
    """What a rule may consult: the stage's keys, the stage's name, the whole layer."""

    has_key: Callable[[str], bool]
    stage: str | None
    layer: dict


@dataclass
class Translation:
    values: dict  # the layer in our keys
    lines: list[str] = field(default_factory=list)  # "their -> ours", for the printout
    set_by: dict[str, str] = field(default_factory=dict)  # our dotted key -> their key
    warmup_ratio: float | None = None
    warmup_key: str = "warmup_ratio"  # the key that gave it (transformers also reads a float warmup_steps so)


Rule = Callable[[Any, Context], tuple[dict, dict[str, str], str]]


# --------------------------------------------------------------------------- rules
# A rule reads one of their keys and returns (our keys -> values, keys of the layer it makes moot ->
# why, a note). Every rule says something: its settings, or a note.


def _bf16(value, ctx):
    """`engine.precision=bf16` (false: `fp32`)."""
    return {"engine.precision": "bf16" if parse_bool(value, "bf16") else "fp32"}, {}, ""


def _fp16(value, ctx):
    """refused when true (fp16 is not supported; use `bf16: true`)."""
    if parse_bool(value, "fp16"):
        raise ConfigError(
            "fp16: fp16 mixed precision is not supported; use bf16: true (engine.precision=bf16) or leave it off"
        )
    return {}, {}, "(off: nothing to set)"


def _use_peft(value, ctx):
    """`lora.r` (TRL's 16 when `lora_r` is not given); false turns LoRA off."""
    if parse_bool(value, "use_peft"):
        if "lora_r" in ctx.layer:
            return {}, {}, "(LoRA on, rank from lora_r)"
        return {"lora.r": TRL_DEFAULT_LORA_R}, {}, ""
    return {"lora.r": 0}, _lora_off(TRL_LORA_KEYS, ctx), ""


def _finetuning_type(value, ctx):
    """`lora`: `lora.r` (LLaMA-Factory's 8 when `lora_rank` is not given); `full`: `lora.r=0`."""
    if value == "lora":
        if "lora_rank" in ctx.layer:
            return {}, {}, "(LoRA on, rank from lora_rank)"
        return {"lora.r": LLAMAFACTORY_DEFAULT_LORA_RANK}, {}, ""
    if value == "full":
        return {"lora.r": 0}, _lora_off(LLAMAFACTORY_LORA_KEYS, ctx), ""
    raise ConfigError(f"finetuning_type: expected lora or full, got {value!r}")


def _lora_off(keys: tuple[str, ...], ctx) -> dict[str, str]:
    return {k: "LoRA is off" for k in keys if k in ctx.layer}


def llamafactory_stage(value: Any) -> str:
    """The posttrain stage that does what LLaMA-Factory's ``stage`` does; a ConfigError saying why not."""
    ours = LLAMAFACTORY_STAGES.get(value)
    if ours is None:
        raise ConfigError(
            f"stage: LLaMA-Factory's stage {value!r} has no posttrain counterpart; "
            f"expected one of {', '.join(LLAMAFACTORY_STAGES)}"
        )
    return ours


def _stage(value, ctx):
    """checked against the stage being run (`rm`: `posttrain reward`; `kto`: `posttrain dpo loss=kto`; `pt`: `sft`).

    ``pt`` trains SFT on text rows (every token), which LLaMA-Factory's corpora become."""
    ours = llamafactory_stage(value)
    if ctx.stage is None:
        raise ConfigError("stage: cannot check LLaMA-Factory's stage here (no stage is being run)")
    if ours != ctx.stage:
        raise ConfigError(
            f"stage: {value!r} is LLaMA-Factory's stage for `posttrain {ours}`, but this is `posttrain {ctx.stage}`"
        )
    if value == "kto":
        return {"loss": "kto"}, {}, ""
    if value == "pt":  # text rows train on every token; LLaMA-Factory's corpora become text rows (data/llamafactory.py)
        return {}, {}, "(checked: posttrain sft, continued pretraining on the text rows of its data)"
    return {}, {}, f"(checked: posttrain {ours})"


def _do_train(value, ctx):
    """must be true (a training stage always trains)."""
    if not parse_bool(value, "do_train"):
        raise ConfigError("do_train: false, but a training stage always trains")
    return {}, {}, "(implied)"


def _deepspeed(value, ctx):
    """`engine.deepspeed_config` where a stage has it; otherwise refused (the stage starts no DeepSpeed engine)."""
    if ctx.has_key("engine.deepspeed_config"):
        return {"engine.deepspeed_config": value}, {}, ""
    raise ConfigError(
        "deepspeed: this stage starts no DeepSpeed engine, so it reads no DeepSpeed file "
        "(engine.deepspeed_config belongs to the training stages)"
    )


def _template(value, ctx):
    """`model.chat_template` for `chatml`, `llama3`, `zephyr`; other names: the tokenizer's own template."""
    from trainer_lib.data.chat_templates import BUILTINS

    if value in BUILTINS:
        return {"model.chat_template": value}, {}, ""
    return (
        {},
        {},
        (
            f"(ignored: {value!r} is not built in; the tokenizer's own chat template is used, or set "
            f"model.chat_template to {', '.join(BUILTINS)} or a Jinja file)"
        ),
    )


def _token(key: str) -> Rule:
    def refuse(value, ctx):  # the value is never echoed: it is a secret
        """refused without echoing it: export `HF_TOKEN` instead."""
        raise ConfigError(
            f"{key}: a token does not belong in a config file, which is printed, logged and "
            f"stored with the run; remove it and export HF_TOKEN instead (hub downloads read it "
            f"from the environment)"
        )

    return refuse


def _choice(key: str, value: Any, choices: dict[str, tuple[dict, str]], refused: dict[str, str]) -> tuple:
    """A rule's answer for a key with named values: ``choices`` value -> (settings, note), ``refused``
    value -> why not; anything else is a ConfigError listing the values understood."""
    text = str(value).lower() if value is not None else "none"
    if text in refused:
        raise ConfigError(f"{key}: {value!r} is not supported: {refused[text]}")
    if text not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(sorted({*choices, *refused}))}, got {value!r}")
    sets, note = choices[text]
    return sets, {}, note


def _strategy(key: str, steps_key: str, no: str) -> Rule:
    """The rule of transformers' ``*_strategy`` keys: ``steps`` leaves it to ``steps_key``; ``no`` sets
    ``steps_key=0`` (``no``: what then happens here), or for logging has no effect; per epoch is refused."""

    def rule(value, ctx):
        text = str(value).lower()
        if text == "no" and steps_key != "logging_steps":
            moot = {steps_key: f"{key} is no"} if steps_key in ctx.layer else {}
            return {steps_key: 0}, moot, f"({no})"
        return _choice(
            key,
            value,
            {"steps": ({}, f"({steps_key} says when)"), "no": ({}, f"(no effect here: {no})")},
            {"epoch": f"once per epoch is not built in; set {steps_key}", "best": f"set {steps_key} instead"},
        )

    off = f"`no`: `{steps_key}=0` ({no})" if steps_key != "logging_steps" else f"`no`: no effect ({no})"
    rule.__doc__ = f"`steps`: `{steps_key}` says when; {off}; `epoch`: refused."
    return rule


def _overwrite_output_dir(value, ctx):
    """true: `resume=false` (start over, whatever checkpoints `output_dir` holds); false: resume them."""
    if parse_bool(value, "overwrite_output_dir"):
        return {"resume": False}, {}, "(start over instead of resuming output_dir's checkpoints)"
    return {}, {}, "(checkpoints in output_dir are resumed, as resume: true does)"


def _resume_from_checkpoint(value, ctx):
    """null/false: nothing; true: `resume=true`; a path is refused (posttrain resumes its own checkpoints)."""
    if value is None or value is False or str(value).lower() in ("false", "null", "none", ""):
        return {}, {}, "(none given: resume decides)"
    if value is True or str(value).lower() == "true":
        return {"resume": True}, {}, ""
    raise ConfigError(
        f"resume_from_checkpoint: {value!r}: posttrain resumes only its own checkpoints, from the newest in "
        f"checkpoint_dir (resume: true); set checkpoint_dir to the folder that holds them"
    )


def _save_only_model(value, ctx):
    """accepted: checkpoints always hold the optimizer state (so that they resume)."""
    if parse_bool(value, "save_only_model"):
        return {}, {}, "(no effect here: checkpoints always hold the optimizer state, so that they resume)"
    return {}, {}, "(checkpoints hold the optimizer state, as posttrain's always do)"


def _push_to_hub(value, ctx):
    """`hub.push` (true needs `hub_model_id` and a token in `HF_TOKEN`)."""
    return {"hub.push": parse_bool(value, "push_to_hub")}, {}, ""


def _dtype(key: str) -> Rule:
    def rule(value, ctx):
        """`bfloat16`: `engine.precision=bf16`; `float32`: `fp32`; `auto`: nothing; `float16`: refused."""
        bf16, fp32 = ({"engine.precision": "bf16"}, ""), ({"engine.precision": "fp32"}, "")
        return _choice(
            key,
            value,
            {"bfloat16": bf16, "bf16": bf16, "float32": fp32, "fp32": fp32, "auto": ({}, "(engine.precision decides)")},
            {"float16": "fp16 is not supported; use bfloat16", "fp16": "fp16 is not supported; use bfloat16"},
        )

    return rule


def _flash_attn(value, ctx):
    """`model.attn_implementation`: `sdpa`, `fa2` (`flash_attention_2`), `disabled` (`eager`); `auto`: ours."""
    attention = {"sdpa": "sdpa", "fa2": "flash_attention_2", "disabled": "eager"}
    choices = {k: ({"model.attn_implementation": v}, "") for k, v in attention.items()}
    choices["auto"] = ({}, "(model.attn_implementation decides, default sdpa)")
    return _choice("flash_attn", value, choices, {})


def _quantization_bit(value, ctx):
    """refused (quantized QLoRA training is not supported); null: nothing."""
    if value is None:
        return {}, {}, "(off)"
    raise ConfigError(
        f"quantization_bit: {value!r}: quantized (QLoRA) training is not supported: posttrain trains "
        f"bf16/fp32 weights; leave quantization_bit out (LoRA: finetuning_type lora)"
    )


def _loss_mask(key: str, what: str) -> Rule:
    def rule(value, ctx):
        """true or null: accepted (what posttrain does); false: refused."""
        if value is None or parse_bool(value, key):
            return {}, {}, f"(posttrain always trains on {what} only)"
        raise ConfigError(f"{key}: false is not supported: posttrain always trains on {what} only")

    return rule


def _dataset_text_field(value, ctx):
    """`text`: accepted; another column is refused (name it `text`)."""
    if value == "text":
        return {}, {}, "(plain text is read from the text column)"
    raise ConfigError(f"dataset_text_field: {value!r}: posttrain reads plain text from a column named text; rename it")


def _optim(value, ctx):
    """`adamw_torch`, `adamw_torch_fused`, `adamw_hf`: accepted (posttrain's AdamW); others refused."""
    adamw = ({}, "(AdamW, posttrain's optimizer)")
    return _choice("optim", value, {"adamw_torch": adamw, "adamw_torch_fused": adamw, "adamw_hf": adamw}, {})


def _eos_token(value, ctx):
    """a built-in chat template's end of turn (`<|im_end|>`, `<|eot_id|>`): accepted; others refused."""
    from trainer_lib.data.chat_templates import BUILTINS

    ends = {template.end_of_turn for template in BUILTINS.values() if template.end_of_turn}
    if value in ends:
        return {}, {}, "(each turn of a conversation already ends with the chat template's end of turn)"
    raise ConfigError(
        f"eos_token: {value!r} is not supported: each example ends with the tokenizer's eos token (or the "
        f"chat template's end of turn); point model.tokenizer_path at a tokenizer that has the one you want"
    )


# --------------------------------------------------------------------------- TRL's RL and preference keys

#: TRL's GRPO ``loss_type`` -> our ``loss_aggregation`` (how token losses become one number).
TRL_LOSS_TYPES = {"grpo": "sequence", "dapo": "token", "bnpo": "token", "dr_grpo": "constant"}
#: TRL's reward function names with no built-in here, and what to use instead.
TRL_REWARDS_ELSEWHERE = {
    "get_soft_overlong_punishment": "set overlong_buffer, DAPO's soft overlong penalty",
}


def _loss_type(value, ctx):
    """DPO: `loss`; GRPO: `loss_aggregation` (`grpo`: sequence, `dapo`/`bnpo`: token, `dr_grpo`: constant)."""
    if not ctx.has_key("loss_aggregation"):
        return {"loss": value}, {}, ""
    choices = {theirs: ({"loss_aggregation": ours}, "") for theirs, ours in TRL_LOSS_TYPES.items()}
    return _choice("loss_type", value, choices, dict.fromkeys(("cispo", "sapo", "luspo", "vespo"), "not built in"))


def _scale_rewards(value, ctx):
    """`group`/true: `advantage=grpo`; `none`/false: `advantage=dr_grpo` (r - mean); `batch`: refused."""
    text = str(value).lower()
    if text in ("none", "false"):  # only the advantage: loss_type (or our default) decides the aggregation
        return {"advantage": "dr_grpo"} | ({} if "loss_type" in ctx.layer else {"loss_aggregation": "sequence"}), {}, ""
    grpo = ({"advantage": "grpo"}, "")
    refused = {"batch": "the std of the whole batch is not built in; use group or none"}
    return _choice("scale_rewards", value, {"group": grpo, "true": grpo}, refused)


def _importance_sampling_level(value, ctx):
    """`token`: `objective=grpo`; `sequence`: `objective=gspo`."""
    return _choice(
        "importance_sampling_level",
        value,
        {"token": ({"objective": "grpo"}, ""), "sequence": ({"objective": "gspo"}, "")},
        {},
    )


def _reward_funcs(value, ctx):
    """`reward.functions`: TRL's names as they are (`accuracy_reward`), `pkg.mod.func` as `pkg.mod:func`."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else [str(v).strip() for v in value or ()]
    ours = []
    for name in filter(None, names):
        if name in TRL_REWARDS_ELSEWHERE:
            raise ConfigError(f"reward_funcs: {name!r} is not built in: {TRL_REWARDS_ELSEWHERE[name]}")
        dotted = ":" not in name and "/" not in name and "." in name  # built-in names have no dot
        ours.append(":".join(name.rsplit(".", 1)) if dotted else name)
    return {"reward.functions": ours}, {}, ""


def _off_only(key: str, why: str) -> Rule:
    """The rule of a switch posttrain does not have: false is accepted, true refused with ``why``."""

    def rule(value, ctx):
        if parse_bool(value, key):
            raise ConfigError(f"{key}: true is not supported: {why}")
        return {}, {}, "(off)"

    rule.__doc__ = f"false: accepted; true: refused ({why})."
    return rule


def _num_processes(value, ctx):
    """1: accepted; more: refused (launch with `posttrain <stage> --nproc N`)."""
    if str(value) != "1":
        raise ConfigError(
            f"num_processes: {value!r}: a config file does not start processes here; "
            f"run `posttrain <stage> --nproc {value} ...` (or a TrainJob) instead"
        )
    return {}, {}, "(one process)"


def _precompute_ref_log_probs(value, ctx):
    """true: `reference=precomputed`; false: `reference` decides."""
    if parse_bool(value, "precompute_ref_log_probs"):
        return {"reference": "precomputed"}, {}, ""
    return {}, {}, "(reference decides)"


def _max_prompt_length(value, ctx):
    """RL stages: `data.max_length` (longer prompts are dropped); elsewhere no effect (`max_length` bounds the row)."""
    if ctx.has_key("rollout.n"):
        return {"data.max_length": value}, {}, "(longer prompts are dropped, not truncated)"
    return {}, {}, "(no effect here: data.max_length bounds prompt and completion together)"


def _datasets(value, ctx):
    """one entry: `data.path` (`name`: `data.subset`, `split`: `data.split`); several: `data.sources`, concatenated."""
    entries = value if isinstance(value, list) else [value]
    if not entries or not all(isinstance(e, dict) and e.get("path") for e in entries):
        raise ConfigError(f"datasets: expected a list of mappings with a path (TRL's dataset mixture), got {value!r}")
    for entry in entries:
        unsupported = sorted(set(entry) & {"data_dir", "data_files"})
        if unsupported:
            raise ConfigError(
                f"datasets: {entry['path']}: {unsupported[0]} is not read; give the files as the path (a local "
                f"file or folder) instead"
            )
    note = "(their columns lists: every column is read)" if any("columns" in e for e in entries) else ""
    if len(entries) == 1:
        sets = {"data.path": entries[0]["path"]}
        names = (("name", "data.subset"), ("split", "data.split"))
        sets.update({ours: entries[0][theirs] for theirs, ours in names if entries[0].get(theirs)})
        return sets, {}, note
    names = (("path", "path"), ("name", "subset"), ("split", "split"))
    sources = [{ours: e[theirs] for theirs, ours in names if e.get(theirs)} for e in entries]
    return {"data.sources": sources}, {}, " ".join(filter(None, ("(concatenated, as TRL mixes them)", note)))


def _rl_step_size(value, ctx):
    """`engine.gradient_accumulation_steps`; RL stages: with `per_device_train_batch_size`, `prompts_per_step`.

    In an RL stage a step is `per_device_train_batch_size` x this x processes completions with one optimizer
    update of them per pass: LLaMA-Factory's PPO samples one per prompt (`rollout.n=1`), TRL's GRPO
    `num_generations`."""
    layer = ctx.layer
    if not ctx.has_key("rollout.n"):
        return {"prompts_per_step": value}, {}, ""  # a key only RL stages have: the rename applies instead
    if "per_device_train_batch_size" not in layer:
        raise ConfigError(
            "gradient_accumulation_steps: in an RL stage it sizes the step together with "
            "per_device_train_batch_size; give both (or set prompts_per_step and mini_batch_size instead)"
        )
    sets: dict[str, Any] = {}
    if "stage" in layer:  # a LLaMA-Factory file: its PPO generates one completion per prompt
        n = 1
        sets["rollout.n"] = 1
    elif "num_generations" in layer:
        n = int(layer["num_generations"])
    else:
        raise ConfigError(
            "gradient_accumulation_steps: in an RL stage the step is per_device_train_batch_size x "
            "gradient_accumulation_steps completions, num_generations of each prompt: give num_generations too"
        )
    # one process unless launched with --nproc / torchrun (the workers read this config again with WORLD_SIZE)
    completions = int(layer["per_device_train_batch_size"]) * int(value) * int(os.environ.get("WORLD_SIZE", "1"))
    if completions % n:
        raise ConfigError(
            f"gradient_accumulation_steps: a step of {completions} completions is not a whole number of "
            f"groups of num_generations={n}"
        )
    sets.update({"prompts_per_step": completions // n, "mini_batch_size": 0})
    return sets, {}, "(one update of the whole step per pass)"


RULES: dict[str, Rule] = {
    "bf16": _bf16,
    "gradient_accumulation_steps": _rl_step_size,
    "fp16": _fp16,
    "use_peft": _use_peft,
    "finetuning_type": _finetuning_type,
    "stage": _stage,
    "do_train": _do_train,
    "deepspeed": _deepspeed,
    "template": _template,
    "overwrite_output_dir": _overwrite_output_dir,
    "resume_from_checkpoint": _resume_from_checkpoint,
    "save_only_model": _save_only_model,
    "eval_strategy": _strategy("eval_strategy", "eval_steps", "eval data is still evaluated at the end"),
    "evaluation_strategy": _strategy("evaluation_strategy", "eval_steps", "eval data is still evaluated at the end"),
    "save_strategy": _strategy("save_strategy", "save_steps", "no checkpoints"),
    "logging_strategy": _strategy("logging_strategy", "logging_steps", "metrics are logged every logging_steps"),
    "push_to_hub": _push_to_hub,
    "dtype": _dtype("dtype"),
    "torch_dtype": _dtype("torch_dtype"),
    "flash_attn": _flash_attn,  # LLaMA-Factory
    "quantization_bit": _quantization_bit,  # LLaMA-Factory
    "completion_only_loss": _loss_mask("completion_only_loss", "the completion of prompt-completion rows"),
    "assistant_only_loss": _loss_mask("assistant_only_loss", "the assistant turns of conversations"),
    "dataset_text_field": _dataset_text_field,
    "optim": _optim,
    "eos_token": _eos_token,
    "loss_type": _loss_type,  # DPO's loss, GRPO's token aggregation
    "scale_rewards": _scale_rewards,
    "importance_sampling_level": _importance_sampling_level,
    "reward_funcs": _reward_funcs,
    "mask_truncated_completions": _off_only(
        "mask_truncated_completions", "truncated completions keep their loss; overlong_buffer shapes their reward"
    ),
    "use_vllm": _off_only("use_vllm", "completions are generated by the policy in the training process"),
    "load_in_4bit": _off_only("load_in_4bit", "quantized (QLoRA) training is not supported"),
    "load_in_8bit": _off_only("load_in_8bit", "quantized (QLoRA) training is not supported"),
    "num_processes": _num_processes,
    "precompute_ref_log_probs": _precompute_ref_log_probs,
    "max_prompt_length": _max_prompt_length,
    "datasets": _datasets,
    "hub_token": _token("hub_token"),  # transformers' TrainingArguments
    "hf_hub_token": _token("hf_hub_token"),  # LLaMA-Factory
    "token": _token("token"),
}

#: keys that are resolved after the whole config is built (see :func:`resolve_warmup_ratio`), and what.
DEFERRED = {"warmup_ratio": "`warmup_steps` = ratio x steps, rounded up (as transformers does)"}


# --------------------------------------------------------------------------- translation


def _put(tree: dict, dotted: str, value: Any, their: str, set_by: dict) -> None:
    present, old = lookup_dotted(tree, dotted)
    if present and old != value:
        other = set_by.get(dotted, dotted)
        raise ConfigError(f"{their}: sets {dotted} to {value!r}, but {other} sets it to {old!r} in the same config")
    node, last = section_for(tree, dotted, f"{their}: sets {dotted}, but a value stands where a section should be")
    node[last] = value
    set_by[dotted] = their


def translate(layer: dict, has_key: Callable[[str], bool], stage: str | None = None) -> Translation:
    """``layer`` (one YAML file or one set of overrides) in our keys.

    ``has_key(dotted)`` says whether the stage's config has a key; ``stage`` is the stage being
    run (LLaMA-Factory's ``stage`` key is checked against it). Two keys of one layer that set one
    of our keys to different values are an error naming both.
    """
    out = copy.deepcopy(layer)
    result = Translation(out)
    ctx = Context(has_key, stage, layer)
    known = (*RENAMES, *RULES, *DEFERRED, *NO_EFFECT)
    theirs = [k for k in layer if not has_key(k) and k in known]
    _warmup_fraction(layer, has_key, result)
    moot: dict[str, str] = {}  # keys a rule made moot -> why
    for key in theirs:
        if key in DEFERRED:
            if has_key("warmup_steps"):
                result.warmup_ratio = out.pop(key)
        elif key in NO_EFFECT:
            out.pop(key)
            result.lines.append(f"{key} -> (no effect here: {NO_EFFECT[key]})")
        elif key in RULES:
            sets, moots, note = RULES[key](layer[key], ctx)
            if not all(has_key(k) for k in sets):
                continue  # this stage has no such setting: refused as an unknown key
            out.pop(key)
            moot.update(moots)
            for other, why in moots.items():
                if other in out and has_key(other):  # one of ours: it goes now, before the rule sets it
                    out.pop(other)
                    result.lines.append(f"{other} -> (ignored: {why})")
            for dotted, value in sets.items():
                _put(out, dotted, value, key, result.set_by)
            described = ", ".join(f"{k}={v}" for k, v in sets.items())
            result.lines.append(f"{key} -> {' '.join(part for part in (described, note) if part)}")
    for key in theirs:
        if key not in RENAMES or key not in out:  # not a rename, or a rule took it
            continue
        if key in moot:
            out.pop(key)
            result.lines.append(f"{key} -> (ignored: {moot[key]})")
            continue
        target = next((t for t in RENAMES[key] if has_key(t)), None)
        if target is None:
            continue
        value = out.pop(key)
        renamed = VALUE_RENAMES.get(key, {}).get(value, value) if isinstance(value, str) else value
        _put(out, target, renamed, key, result.set_by)
        result.lines.append(f"{key} -> {target}" + (f"={renamed}" if renamed != value else ""))
    return result


def _warmup_fraction(layer: dict, has_key: Callable[[str], bool], result: Translation) -> None:
    """``warmup_steps: 0.1`` means a fraction of the steps in transformers (a float below 1): a ratio here too."""
    value = layer.get("warmup_steps")
    if has_key("warmup_steps") and isinstance(value, float) and 0 < value < 1:
        result.values.pop("warmup_steps")
        result.warmup_ratio = value
        result.warmup_key = "warmup_steps"


def resolve_warmup_ratio(cfg: Any, ratio: Any, warmup_steps_given: bool, key: str = "warmup_ratio") -> str:
    """Set ``cfg.warmup_steps`` from a warmup ratio (rounded up, as transformers does); the line
    to print. The ratio counts optimizer updates, which is ``max_steps`` times the updates per
    step of an RL stage; with ``num_epochs`` the count is unknown until the data is read."""
    try:
        ratio = float(ratio)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected a number, got {ratio!r}") from None
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"{key}: expected 0 <= x < 1, got {ratio}")
    if getattr(cfg, "num_epochs", 0) > 0:
        raise ConfigError(
            f"{key}: {ratio} of the steps cannot be counted before the data is read, and num_epochs decides "
            f"the steps here; set warmup_steps, or max_steps (which wins over epochs)"
        )
    if warmup_steps_given and cfg.warmup_steps > 0:
        raise ConfigError(
            f"warmup_ratio: set either warmup_ratio or warmup_steps, not both (warmup_steps={cfg.warmup_steps})"
        )
    updates = cfg.max_steps * (cfg.updates_per_step() if hasattr(cfg, "updates_per_step") else 1)
    cfg.warmup_steps = math.ceil(ratio * updates)
    return f"{key} -> warmup_steps={cfg.warmup_steps} ({ratio} of {updates} steps)"


def alias_table() -> str:
    """Markdown rows of every key this module reads, and what it becomes: the table in
    docs/configuration.md, "Coming from TRL / LLaMA-Factory" (a test keeps the two equal)."""
    rows = {}
    for key, targets in RENAMES.items():
        values = "".join(f" (`{theirs}` -> `{ours}`)" for theirs, ours in VALUE_RENAMES.get(key, {}).items())
        rows[key] = (
            " or ".join(f"`{t}`" for t in targets) + values + (" (the first the stage has)" if len(targets) > 1 else "")
        )
    for key, rule in RULES.items():
        rows[key] = (rule.__doc__ or "").strip().splitlines()[0]
    rows.update(DEFERRED)
    rows.update({key: f"no effect here: {why}" for key, why in NO_EFFECT.items()})
    return "\n".join(["| their key | posttrain |", "|---|---|", *(f"| `{k}` | {v} |" for k, v in sorted(rows.items()))])


def explain(exc: ConfigError, set_by: dict[str, str]) -> ConfigError:
    """The same error, naming the key the user wrote when one of ours was set through an alias."""
    text = str(exc)
    for dotted, their in set_by.items():
        if text.startswith(f"{dotted}:"):
            return ConfigError(f"{text} (set by {their})")
    return exc


#: set in the workers of ``--nproc``: the launching process has printed the mapping already.
ANNOUNCED_ENV = "POSTTRAIN_CONFIG_ANNOUNCED"


def announce(lines: list[str]) -> None:
    """Print each mapping once, on stderr, from one process of a job (not again in its workers)."""
    if os.environ.get(ANNOUNCED_ENV) == "1" or os.environ.get("RANK", "0") != "0":
        return
    for line in dict.fromkeys(lines):
        print(f"config: {line}", file=sys.stderr)
