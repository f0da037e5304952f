"""TRL's and LLaMA-Factory's config key names, mapped to ours.

Users arrive with a YAML file written for TRL (``trl sft --config``, ``SFTConfig``/``DPOConfig``/
``GRPOConfig`` field names) or for LLaMA-Factory (``llamafactory-cli train``). :func:`translate`
turns one such layer into our keys before the dataclass is built: a top-level key that is not one
of the stage's own keys and has an entry here becomes ours, and the mapping is printed once, one
line per key (``config: per_device_train_batch_size -> batch_size``). Every other key is left as
it is, so a key we do not support is refused exactly like any unknown key.

Only the names are translated; the defaults stay ours (a TRL file without ``lora_alpha`` gets our
16, not TRL's 32). A key whose target the stage does not have (``num_generations`` in SFT) is left
alone and refused as unknown. Pure Python: this runs when a config is validated.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_lib.config.values import parse_bool, section_for
from trainer_lib.errors import ConfigError

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
    "loss_type": ("loss", "advantage"),  # DPO: sigmoid/ipo/hinge/robust; GRPO: grpo/dr_grpo
    "num_generations": ("rollout.n",),
    "max_completion_length": ("rollout.max_new_tokens",),
    # LLaMA-Factory
    "cutoff_len": ("data.max_length",),
    "lora_rank": ("lora.r",),
    "lora_target": ("lora.target_modules",),
    "pref_beta": ("beta",),
    "pref_loss": ("loss",),
    "val_size": ("data.eval_fraction",),
    "preprocessing_num_workers": ("data.num_workers",),
}

#: their key -> {their value: our value}, for the values that are spelled differently.
VALUE_RENAMES: dict[str, dict[Any, Any]] = {"lora_target": {"all": "all-linear"}}

#: LLaMA-Factory's ``stage`` -> the posttrain stage that does the same.
LLAMAFACTORY_STAGES = {"sft": "sft", "rm": "reward", "dpo": "dpo", "kto": "dpo", "ppo": "ppo"}

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


Rule = Callable[[Any, Context], tuple[dict, tuple[str, ...], str]]


# --------------------------------------------------------------------------- rules
# A rule reads one of their keys and returns (our keys -> values, their keys it makes moot, a note).


def _bf16(value, ctx):
    """`engine.precision=bf16` (false: `fp32`)."""
    return {"engine.precision": "bf16" if parse_bool(value, "bf16") else "fp32"}, (), ""


def _fp16(value, ctx):
    """refused when true (fp16 is not supported; use `bf16: true`)."""
    if parse_bool(value, "fp16"):
        raise ConfigError(
            "fp16: fp16 mixed precision is not supported; use bf16: true (engine.precision=bf16) or leave it off"
        )
    return {}, (), "(off: nothing to set)"


def _use_peft(value, ctx):
    """`lora.r` (TRL's 16 when `lora_r` is not given); false turns LoRA off."""
    if parse_bool(value, "use_peft"):
        return ({} if "lora_r" in ctx.layer else {"lora.r": TRL_DEFAULT_LORA_R}), (), ""
    return {"lora.r": 0}, tuple(k for k in TRL_LORA_KEYS if k in ctx.layer), ""


def _finetuning_type(value, ctx):
    """`lora`: `lora.r` (LLaMA-Factory's 8 when `lora_rank` is not given); `full`: `lora.r=0`."""
    if value == "lora":
        return ({} if "lora_rank" in ctx.layer else {"lora.r": LLAMAFACTORY_DEFAULT_LORA_RANK}), (), ""
    if value == "full":
        return {"lora.r": 0}, tuple(k for k in LLAMAFACTORY_LORA_KEYS if k in ctx.layer), ""
    raise ConfigError(f"finetuning_type: expected lora or full, got {value!r}")


def _stage(value, ctx):
    """checked against the stage being run (`rm` is `posttrain reward`, `kto` is `posttrain dpo loss=kto`)."""
    ours = LLAMAFACTORY_STAGES.get(value)
    if ours is None:
        raise ConfigError(
            f"stage: LLaMA-Factory's stage {value!r} has no posttrain counterpart "
            f"(expected one of {', '.join(LLAMAFACTORY_STAGES)})"
        )
    if ctx.stage is None:
        raise ConfigError("stage: cannot check LLaMA-Factory's stage here (no stage is being run)")
    if ours != ctx.stage:
        raise ConfigError(
            f"stage: {value!r} is LLaMA-Factory's stage for `posttrain {ours}`, but this is `posttrain {ctx.stage}`"
        )
    if value == "kto":
        return {"loss": "kto"}, (), ""
    return {}, (), f"(checked: posttrain {ours})"


def _do_train(value, ctx):
    """must be true (a training stage always trains)."""
    if not parse_bool(value, "do_train"):
        raise ConfigError("do_train: false, but a training stage always trains")
    return {}, (), "(implied)"


def _deepspeed(value, ctx):
    """`engine.deepspeed_config` where a stage has it; otherwise refused (the stage starts no DeepSpeed engine)."""
    if ctx.has_key("engine.deepspeed_config"):
        return {"engine.deepspeed_config": value}, (), ""
    raise ConfigError(
        "deepspeed: this stage starts no DeepSpeed engine, so it reads no DeepSpeed file "
        "(engine.deepspeed_config belongs to the training stages)"
    )


#: the entries of a dataset_info.json dataset that can be followed.
DATASET_INFO_KEYS = ("file_name", "hf_hub_url", "formatting", "columns", "tags", "file_sha1", "subset", "split")


def _dataset_entry(key: str, name: Any, ctx: Context) -> dict:
    """data.path/format/columns for a dataset named in LLaMA-Factory's ``dataset_info.json``
    (in ``dataset_dir``, default ``data``, like LLaMA-Factory)."""
    if not isinstance(name, str) or "," in name:
        raise ConfigError(f"{key}: expected one dataset name, got {name!r} (merge the files into one)")
    directory = str(ctx.layer.get("dataset_dir", "data"))
    info_file = os.path.join(directory, "dataset_info.json")
    if not os.path.isfile(info_file):
        raise ConfigError(
            f"{key}: {name!r} is looked up in {info_file} (LLaMA-Factory's dataset_dir), "
            f"which does not exist; set dataset_dir, or data.path to the file"
        )
    try:
        with open(info_file, encoding="utf-8") as fh:
            info = json.load(fh)
    except ValueError as exc:
        raise ConfigError(f"{key}: {info_file}: not valid JSON ({exc})") from None
    entry = info.get(name) if isinstance(info, dict) else None
    if not isinstance(entry, dict):
        raise ConfigError(f"{key}: no dataset {name!r} in {info_file}")
    unsupported = sorted(set(entry) - set(DATASET_INFO_KEYS))
    if unsupported:
        raise ConfigError(
            f"{key}: {name!r} in {info_file} uses {unsupported[0]!r}, which posttrain does not "
            f"read (it follows {', '.join(DATASET_INFO_KEYS)})"
        )
    if "file_name" in entry:
        path = os.path.join(directory, entry["file_name"])
    elif "hf_hub_url" in entry:
        path = entry["hf_hub_url"]
    else:
        raise ConfigError(f"{key}: {name!r} in {info_file} has neither file_name nor hf_hub_url")
    columns = {**entry.get("columns", {}), **entry.get("tags", {})}
    hub = {k: str(entry[k]) for k in ("subset", "split") if entry.get(k)}
    return {"path": path, "format": entry.get("formatting", "alpaca"), "columns": columns, "hub": hub}


def _dataset(value, ctx):
    """`data.path`, `data.format`, `data.columns`, `data.subset`, `data.split` from `dataset_info.json`."""
    entry = _dataset_entry("dataset", value, ctx)
    sets = {"data.path": entry["path"], "data.format": entry["format"]}
    if entry["columns"]:
        sets["data.columns"] = entry["columns"]
    sets.update({f"data.{k}": v for k, v in entry["hub"].items()})
    return sets, (), ""


def _eval_dataset(value, ctx):
    """`data.eval_path` from `dataset_info.json`."""
    entry = _dataset_entry("eval_dataset", value, ctx)
    if entry["hub"]:
        raise ConfigError(
            f"eval_dataset: {value!r} sets {', '.join(entry['hub'])}, which posttrain reads only for "
            f"the training dataset; point eval_dataset at files, or use data.eval_split"
        )
    if "dataset" in ctx.layer:
        train = _dataset_entry("dataset", ctx.layer["dataset"], ctx)
        if (train["format"], train["columns"]) != (entry["format"], entry["columns"]):
            raise ConfigError("eval_dataset: expected the same formatting and columns as dataset")
    return {"data.eval_path": entry["path"]}, (), ""


def _template(value, ctx):
    """`model.chat_template` for `chatml`, `llama3`, `zephyr`; other names: the tokenizer's own template."""
    from trainer_lib.models.chat_templates import BUILTINS

    if value in BUILTINS:
        return {"model.chat_template": value}, (), ""
    return (
        {},
        (),
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


def _dataset_dir(value, ctx):
    """where `dataset_info.json` is looked up (default `data`)."""
    return {}, (), "(where dataset_info.json is)"


RULES: dict[str, Rule] = {
    "bf16": _bf16,
    "fp16": _fp16,
    "use_peft": _use_peft,
    "finetuning_type": _finetuning_type,
    "stage": _stage,
    "do_train": _do_train,
    "deepspeed": _deepspeed,
    "dataset": _dataset,
    "eval_dataset": _eval_dataset,
    "dataset_dir": _dataset_dir,
    "template": _template,
    "hub_token": _token("hub_token"),  # transformers' TrainingArguments
    "hf_hub_token": _token("hf_hub_token"),  # LLaMA-Factory
    "token": _token("token"),
}

#: keys that are resolved after the whole config is built (see :func:`resolve_warmup_ratio`), and what.
DEFERRED = {"warmup_ratio": "`warmup_steps` = ratio x steps, rounded up (as transformers does)"}


# --------------------------------------------------------------------------- translation


def _present(tree: dict, dotted: str) -> tuple[bool, Any]:
    """(whether the nested dict holds the dotted key, its value)."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _put(tree: dict, dotted: str, value: Any, their: str, set_by: dict) -> None:
    present, old = _present(tree, dotted)
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
    theirs = [k for k in layer if not has_key(k) and (k in RENAMES or k in RULES or k in DEFERRED)]
    moot: set[str] = set()
    for key in theirs:
        if key in DEFERRED:
            if not has_key("warmup_steps"):
                continue
            result.warmup_ratio = layer[key]
            out.pop(key)
        elif key in RULES:
            sets, moots, note = RULES[key](layer[key], ctx)
            if not all(has_key(k) for k in sets):
                continue  # this stage has no such setting: refused as an unknown key
            out.pop(key)
            moot.update(moots)
            for dotted, value in sets.items():
                _put(out, dotted, value, key, result.set_by)
            described = ", ".join(f"{k}={v}" for k, v in sets.items())
            result.lines.append(f"{key} -> {described or note}")
    for key in theirs:
        if key not in RENAMES:
            continue
        if key in moot:
            out.pop(key)
            result.lines.append(f"{key} -> (ignored: LoRA is off)")
            continue
        target = next((t for t in RENAMES[key] if has_key(t)), None)
        if target is None:
            continue
        value = out.pop(key)
        renamed = VALUE_RENAMES.get(key, {}).get(value, value) if isinstance(value, str) else value
        _put(out, target, renamed, key, result.set_by)
        result.lines.append(f"{key} -> {target}" + (f"={renamed}" if renamed != value else ""))
    return result


def resolve_warmup_ratio(cfg: Any, ratio: Any, warmup_steps_given: bool) -> str:
    """Set ``cfg.warmup_steps`` from a warmup ratio (rounded up, as transformers does); the line
    to print. The ratio counts optimizer updates, which is ``max_steps`` times the updates per
    step of an RL stage; with ``num_epochs`` the count is unknown until the data is read."""
    try:
        ratio = float(ratio)
    except (TypeError, ValueError):
        raise ConfigError(f"warmup_ratio: expected a number, got {ratio!r}") from None
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"warmup_ratio: expected 0 <= x < 1, got {ratio}")
    if getattr(cfg, "num_epochs", 0) > 0:
        raise ConfigError(
            "warmup_ratio: the number of steps is not known before the data is read "
            "(num_epochs is set); set warmup_steps, or max_steps instead of epochs"
        )
    if warmup_steps_given and cfg.warmup_steps > 0:
        raise ConfigError(
            f"warmup_ratio: set either warmup_ratio or warmup_steps, not both (warmup_steps={cfg.warmup_steps})"
        )
    updates = cfg.max_steps * (cfg.updates_per_step() if hasattr(cfg, "updates_per_step") else 1)
    cfg.warmup_steps = math.ceil(ratio * updates)
    return f"warmup_ratio -> warmup_steps={cfg.warmup_steps} ({ratio} of {updates} steps)"


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
