"""A user's DeepSpeed JSON (``engine.deepspeed_config``) laid over the config posttrain builds,
and DeepSpeed's own estimate of the memory a model's states need.

Precedence, key by key (nested mappings such as ``zero_optimization`` are merged, not replaced):

* every key the user's file sets wins over posttrain's: ZeRO++ (``zero_quantized_weights``,
  ``zero_quantized_gradients``, ``zero_hpz_partition_size``), ``overlap_comm``, bucket sizes,
  ``activation_checkpointing``, ``zero_optimization.stage``, ``gradient_clipping``, ``bf16``... reach
  DeepSpeed as its documentation describes them;
* ``"auto"`` (as Hugging Face's DeepSpeed files carry) takes posttrain's value; a key posttrain
  does not set is left out, so DeepSpeed's default applies;
* the batch keys must agree with the run: posttrain's loop, not DeepSpeed, decides what a step
  holds (``batch_size``, ``engine.gradient_accumulation_steps``, world size), so a file that sets
  one to another number is a ConfigError naming both values (write "auto" or leave them out);
* ``optimizer`` and ``scheduler`` are left out (with a printed line): posttrain builds AdamW and the
  schedule from ``lr``, ``weight_decay``, ``adam_*``, ``warmup_steps`` and ``lr_scheduler``.
"""

from __future__ import annotations

import json
from typing import Any

from trainer_lib.errors import ConfigError

KEY = "engine.deepspeed_config"
AUTO = "auto"
BATCH_KEYS = {
    "train_micro_batch_size_per_gpu": "batch_size",
    "gradient_accumulation_steps": "engine.gradient_accumulation_steps",
    "train_batch_size": "batch_size x engine.gradient_accumulation_steps x world size",
}
OWN_SECTIONS = ("optimizer", "scheduler")


def read(path: str) -> dict:
    """The JSON mapping of a user's DeepSpeed file (local path or URL); one ConfigError naming the
    file when it is missing, unreadable or not a JSON object."""
    from trainer_lib import storage

    try:
        text = storage.read_text(path)
    except FileNotFoundError:
        raise ConfigError(f"{KEY}: {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{KEY}: {path}: cannot be read ({exc})") from None
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{KEY}: {path}: invalid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{KEY}: {path}: expected a JSON object at the top level, got {type(loaded).__name__}")
    return loaded


def user_value(user: dict, *keys: str) -> Any:
    """A nested value of the user's file, or None where it is absent or "auto"."""
    node: Any = user
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return None if node == AUTO else node


def zero_settings(engine, user: dict) -> tuple[int, bool, bool]:
    """(ZeRO stage, optimizer offloaded, parameters offloaded) as DeepSpeed will run them: the user's
    file where it sets them, else ``engine.zero_stage`` / ``offload_optimizer`` / ``offload_params``."""
    stage = user_value(user, "zero_optimization", "stage")
    if stage is not None and stage not in (0, 1, 2, 3):
        raise ConfigError(
            f"{KEY}: {engine.deepspeed_config} sets zero_optimization.stage={stage!r}; expected 0, 1, 2 or 3"
        )
    offloaded = []
    for section, ours in (("offload_optimizer", engine.offload_optimizer), ("offload_param", engine.offload_params)):
        device = user_value(user, "zero_optimization", section, "device")
        offloaded.append(ours if device is None else device in ("cpu", "nvme"))
    return (engine.zero_stage if stage is None else stage), offloaded[0], offloaded[1]


def check_batch_keys(ours: dict, user: dict, source: str) -> None:
    """A ConfigError when the user's file sets a batch key to a number other than the run's."""
    for key, our_key in BATCH_KEYS.items():
        value = user_value(user, key)
        if value is not None and value != ours[key]:
            raise ConfigError(
                f"{KEY}: {source} sets {key}={value!r}, but this run's is {ours[key]} "
                f'(from {our_key}); make them agree, or write "auto" in the file'
            )


def _lay_over(ours: dict, user: dict) -> dict:
    out = dict(ours)
    for key, value in user.items():
        if value == AUTO:
            continue  # ours where we set it, DeepSpeed's default where we do not
        if isinstance(value, dict):  # (an "auto" inside a section we do not set is left out too)
            out[key] = _lay_over(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def effective(ours: dict, user: dict, source: str, train: bool = True) -> tuple[dict, list[str]]:
    """(the config DeepSpeed gets, the user's sections left out). The batch keys are always ours
    (checked against the file for a training engine); an inference engine gets no optimizer offload."""
    if train:
        check_batch_keys(ours, user, source)
    dropped = [key for key in OWN_SECTIONS if key in user]
    user = {k: v for k, v in user.items() if k not in OWN_SECTIONS and k not in BATCH_KEYS}
    config = _lay_over(ours, user)
    if not train and isinstance(config.get("zero_optimization"), dict):
        config["zero_optimization"] = {k: v for k, v in config["zero_optimization"].items() if k != "offload_optimizer"}
    return config, dropped


# --------------------------------------------------------------------------- memory estimate


def model_states_estimate(
    model,
    stage: int,
    offload_optimizer: bool,
    offload_params: bool,
    world_size: int,
    local_world_size: int,
    layout=None,
) -> tuple[int, int, str]:
    """(CPU bytes per node, accelerator bytes per rank, a one-line summary) for the model states
    (parameters, gradients, optimizer) of ``model``: :func:`states_estimate` of its parameter count."""
    total = sum(_numel(p) for p in model.parameters())
    largest = max((sum(_numel(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return states_estimate(
        total, largest, stage, offload_optimizer, offload_params, world_size, local_world_size, layout
    )


def states_estimate(
    total: int,
    largest: int,
    stage: int,
    offload_optimizer: bool,
    offload_params: bool,
    world_size: int,
    local_world_size: int,
    layout=None,
) -> tuple[int, int, str]:
    """The model states' memory by DeepSpeed's own estimators, which assume mixed precision and Adam.
    Stages 0 and 1 use the ZeRO-2 estimator: stage 0 as if on one rank (nothing is partitioned),
    stage 1 as stage 2 (it partitions the optimizer states but keeps full gradients).

    Under tensor or pipeline parallelism (``layout``, a :class:`trainer_lib.engine.parallel.Layout`) a
    rank holds ``1 / (T x P)`` of the parameters (embeddings and norms split less evenly: an estimate)
    and ZeRO partitions that share over the data-parallel ranks only."""
    split = layout.tensor * layout.pipeline if layout is not None else 1
    total, largest = -(-total // split), -(-largest // split)
    local = max(local_world_size // split, 1)
    gpus, nodes = local, max(max(world_size // split, 1) // local, 1)
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total,
            largest,
            num_gpus_per_node=gpus,
            num_nodes=nodes,
            cpu_offload=offload_optimizer,
            cpu_offload_params=offload_params,
            zero_init=True,
        )
        name = "estimate_zero3_model_states_mem_needs"
    else:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        if stage == 0:
            gpus, nodes = 1, 1
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload_optimizer
        )
        name = "estimate_zero2_model_states_mem_needs"
    shape = f", tensor {layout.tensor} x pipeline {layout.pipeline}" if split > 1 else ""
    params = f"{total:,} params per rank" if split > 1 else f"{total:,} params"
    line = (
        f"memory estimate (DeepSpeed's {name}; ZeRO-{stage}, offload_optimizer={offload_optimizer}, "
        f"offload_params={offload_params}, {world_size} rank(s){shape}): {params} need "
        f"{size(gpu)} per accelerator and {size(cpu)} CPU per node for their states"
    )
    return int(cpu), int(gpu), line


def _numel(param) -> int:
    """A parameter's whole size, also when ZeRO-3 built it partitioned (``ds_numel``; ``numel()`` is this rank's)."""
    return getattr(param, "ds_numel", param.numel())


def size(n: float) -> str:
    """Bytes for a reader: ``1.50 GiB``, ``12.3 MiB``."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
