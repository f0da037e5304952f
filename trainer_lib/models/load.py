"""Load tokenizers and models from an HF hub id (at ``model.revision``), a local directory or a URL; add LoRA.

Hub downloads authenticate with ``$HF_TOKEN`` (gated and private repos), which transformers reads
from the environment itself: nothing here takes a token, so none can end up in a config or a log.

Where the weights go is a :class:`Placement` (``DeepSpeedStrategy.placement()`` builds it for the engine
the model is for), so that N ranks never hold N whole copies in host memory:

* ZeRO-3: the model is built partitioned (``deepspeed.zero.Init`` with the engine's config, in the
  contexts transformers' ZeRO-3 loading uses, weights left uninitialised), then each rank reads only the
  rows of every weight that hold its own slice, through safetensors' lazy slices of the checkpoint (a
  local directory, or a hub id's snapshot in the hub cache), into its partition: no rank holds a whole
  copy and nothing travels between ranks. Weights the checkpoint lacks (a new reward head) are
  initialised as ``from_pretrained`` initialises them. Other checkpoints (``.bin`` files, names only
  transformers' conversions map) load through transformers' own ZeRO-3 path (an ``HfDeepSpeedConfig``
  alive while ``from_pretrained`` runs), also partitioned, where rank 0 maps the checkpoint's files;
* ZeRO 0-2 on an accelerator: straight onto the rank's device, not through host memory;
* no placement, or ZeRO 0-2 on CPU: host memory, as ``from_pretrained`` does by itself.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import LoraConfig, ModelConfig
from trainer_lib.data import chat_templates
from trainer_lib.errors import UserError

#: ``lora.target_modules=all-linear``: PEFT's name for every linear layer but the output head.
ALL_LINEAR = "all-linear"


def resolve_model_path(path: str, key: str = "model.path", revision: str | None = None) -> str:
    """A local directory for URLs, local paths and GGUF files; hub ids pass through unchanged.

    The one place where a model location becomes a directory on this machine: a ``.gguf`` file (local, a
    URL or ``org/repo/NAME.gguf`` at ``revision``) is converted once into a folder in the cache
    (:mod:`trainer_lib.models.gguf_convert`), and a directory's safetensors files are checked
    (:func:`check_safetensors`), so every key that names a model gets both, and its errors name ``key``."""
    from trainer_lib.models import gguf_convert

    if gguf_convert.is_gguf(path):
        return gguf_convert.converted(path, key, revision)
    if storage.is_remote(path):
        local = storage.localize(path)
    else:
        local = os.path.expanduser(path)
        if not os.path.exists(local):
            if path.startswith((".", "/", "~")) or path.count("/") > 1:
                raise UserError(f"{key}: {path} does not exist")
            return path  # a hub id such as "org/name"
    check_safetensors(local, key)
    return local


#: safetensors' own bound on a header (its JSON table of tensors): 100 MB
SAFETENSORS_MAX_HEADER = 100_000_000


def check_safetensors(local: str, key: str) -> None:
    """A :class:`UserError` naming ``key`` and the file when a safetensors file in the directory ``local`` is
    damaged (:func:`safetensors_problem`): reading it would end in safetensors' own error, which names no
    file, from inside a loader on every rank."""
    if not os.path.isdir(local):
        return
    for name in sorted(os.listdir(local)):
        path = os.path.join(local, name)
        problem = safetensors_problem(path) if name.endswith(".safetensors") and os.path.isfile(path) else None
        if problem:
            raise UserError(f"{key}: {path} is a damaged safetensors file: {problem}")


def safetensors_problem(path: str) -> str | None:
    """What is wrong with a safetensors file's layout, or None: a header longer than the file or than
    safetensors allows, a header that is not a table of tensors, or tensors that end past the file."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < length <= min(size - 8, SAFETENSORS_MAX_HEADER):
            return f"its header claims {length} bytes, the file has {size}"
        try:
            table = json.loads(fh.read(length))
            ends = (int(entry["data_offsets"][1]) for name, entry in table.items() if name != "__metadata__")
            end = 8 + length + max(ends, default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
            return "its header is not a table of tensors"
    return f"it is cut short: its tensors end at byte {end}, the file has {size}" if end > size else None


def hub_revision(cfg: ModelConfig, source: str) -> str | None:
    """``model.revision`` when ``source`` is ``model.path`` itself (another model, e.g. a reward
    model, is not pinned by it)."""
    return (cfg.revision or None) if source == cfg.path else None


def _failed(key: str, what: str, source: str, revision: str | None, exc: Exception) -> UserError:
    at = f" at revision {revision!r}" if revision else ""
    return UserError(storage.redact(f"{key}: could not load {what} from {source}{at}: {exc}"))


def load_tokenizer(cfg: ModelConfig, padding_side: str = "right"):
    from transformers import AutoTokenizer

    source = cfg.tokenizer_path or cfg.path
    key = "model.tokenizer_path" if cfg.tokenizer_path else "model.path"
    revision = hub_revision(cfg, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(source, key, revision), revision=revision, trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise _failed(key, "a tokenizer", source, revision, exc) from None
    if cfg.chat_template:
        chat_templates.apply(tokenizer, cfg.chat_template, source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_processor(cfg: ModelConfig, tokenizer):
    """A vision-language ``model.path``'s processor holding ``tokenizer`` (models/vision.py); None for a text model."""
    from trainer_lib.models.vision import processor_for

    revision = hub_revision(cfg, cfg.path)
    local = resolve_model_path(cfg.path, revision=revision)
    return processor_for(local, tokenizer, revision, cfg.trust_remote_code, cfg.path)


def base_model(model):
    """The transformers model inside a PEFT wrapper (its LoRA layers in place), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def torch_dtype(precision: str):
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


@dataclass(frozen=True)
class Placement:
    """Where a loaded model's weights go (see the module docstring).

    ``zero3_config``: the DeepSpeed config of the ZeRO-3 engine the model is for (the same dict that
    engine gets), to build the model partitioned; ``device``: else an accelerator to load straight onto."""

    device: str | None = None
    zero3_config: dict | None = None


def attention_implementation(cfg: ModelConfig) -> str:
    """``model.attn_implementation`` as transformers takes it: ``sdpa`` is the same sdpa, but packed rows are
    attended per sequence (models/attention.py); not for remote modelling code, whose attention may not take
    position_ids and would then need transformers' own packed mask."""
    if cfg.attn_implementation == "sdpa" and not cfg.trust_remote_code:
        from trainer_lib.models.attention import register

        return register()
    return cfg.attn_implementation


def load_causal_lm(
    cfg: ModelConfig, precision: str = "fp32", path: str | None = None, placement=None, key: str = "model.path"
):
    """``model.path`` (or ``path``, the setting ``key``) as a causal LM in ``precision``, placed by ``placement``
    (a :class:`Placement`).

    A vision-language model (models/vision.py) loads with the image-text-to-text auto class instead, its
    vision tower frozen."""
    from transformers import AutoModelForCausalLM

    from trainer_lib.models import vision

    source = path or cfg.path
    revision = hub_revision(cfg, source)
    attention = attention_implementation(cfg)
    local = resolve_model_path(source, key, revision)
    auto_class = AutoModelForCausalLM
    if vision.source_is_vision_language(local, revision, cfg.trust_remote_code):
        from transformers import AutoModelForImageTextToText as auto_class
    try:
        model = load_pretrained(
            auto_class,
            local,
            placement,
            revision=revision,
            dtype=torch_dtype(precision),
            attn_implementation=attention,
            trust_remote_code=cfg.trust_remote_code,
        )
    except (OSError, ValueError) as exc:  # not a model directory, unknown hub id, missing weights or config
        raise _failed(key, "a causal LM", source, revision, exc) from None
    if vision.is_vision_language(model.config):
        vision.freeze_vision_tower(model)
    if not cfg.chunked_lm_head:
        from trainer_lib.models.lm_head import use_full_logits

        use_full_logits(model)
    return model


def load_pretrained(auto_class, source: str, placement=None, **kwargs):
    """``auto_class.from_pretrained(source, **kwargs)`` with the weights where ``placement`` says."""
    if placement is not None and placement.zero3_config is not None:
        return _load_partitioned(auto_class, source, placement.zero3_config, kwargs)
    if placement is not None and placement.device is not None:
        kwargs["device_map"] = {"": placement.device}  # every weight straight onto this rank's device
    return auto_class.from_pretrained(source, **kwargs)


# --------------------------------------------------------------------------- ZeRO-3: built partitioned


def _load_partitioned(auto_class, source: str, ds_config: dict, kwargs: dict):
    """The model built partitioned, then filled from a local safetensors checkpoint a slice at a time
    (:func:`_stream_checkpoint`); anything else through transformers' own ZeRO-3 loading."""
    import torch

    files = _safetensors_files(_local_checkpoint(source, kwargs.get("revision")))
    if files is not None:
        model = _build_partitioned(auto_class, source, ds_config, kwargs)
        planned = _checkpoint_plan(model, files)
        if planned is not None:
            _stream_checkpoint(model, planned[0])
            _init_missing(model, planned[1])
            return model.eval()  # as from_pretrained leaves it
        del model  # names or shapes that only transformers' conversions map
    # transformers builds under zero.Init while an HfDeepSpeedConfig is alive (it keeps a weak reference): only
    # for this call, so models loaded elsewhere (a reward classifier) stay whole. It initialises missing weights
    # on rank 0 alone: every rank's generators are put back, so they stay in step.
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        keep_alive = HfDeepSpeedConfig(ds_config)
        try:
            return auto_class.from_pretrained(source, **kwargs)
        finally:
            unset_hf_deepspeed_config()
            del keep_alive


def _build_partitioned(auto_class, source: str, ds_config: dict, kwargs: dict):
    """The model of ``source``'s config built under ``deepspeed.zero.Init``, so each rank allocates only its
    slice of every weight (a module at a time), in the contexts transformers' ZeRO-3 ``from_pretrained``
    builds in, but without initialising any weight: the checkpoint fills them. Its generation config too."""
    import deepspeed
    from transformers import AutoConfig, GenerationConfig
    from transformers.initialization import no_init_weights
    from transformers.integrations.deepspeed import prevent_arange_dtype_change

    kwargs = dict(kwargs)  # (the caller may still need them whole)
    loading = {key: kwargs.pop(key) for key in ("revision", "trust_remote_code") if key in kwargs}
    dtype, attention = kwargs.pop("dtype", None), kwargs.pop("attn_implementation", None)
    config = AutoConfig.from_pretrained(source, **loading, **kwargs)  # what is left are config keys (num_labels)
    with no_init_weights(), prevent_arange_dtype_change(), deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = auto_class.from_config(
            config,
            dtype=dtype,
            attn_implementation=attention,
            trust_remote_code=loading.get("trust_remote_code", False),
        )
    model.tie_weights()  # (skipped with the initialisation)
    if model.can_generate():
        try:
            model.generation_config = GenerationConfig.from_pretrained(source, revision=loading.get("revision"))
        except OSError:  # none saved: the one built from the config stays, as from_pretrained keeps it
            pass
    return model


def _local_checkpoint(source: str, revision: str | None) -> str:
    """A local directory with ``source``'s weights: ``source`` itself, or a hub id's snapshot in the hub
    cache (its config and safetensors files, fetched now as from_pretrained would fetch them)."""
    if os.path.isdir(source):
        return source
    from huggingface_hub import snapshot_download

    return snapshot_download(source, revision=revision, allow_patterns=["*.json", "*.safetensors"])


def _safetensors_files(source: str) -> list[str] | None:
    """The safetensors files of a local checkpoint directory (sharded or not), else None."""
    index = os.path.join(source, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            return sorted({os.path.join(source, name) for name in json.load(fh)["weight_map"].values()})
    single = os.path.join(source, "model.safetensors")
    return [single] if os.path.isfile(single) else None


def _checkpoint_plan(model, files: list[str]) -> tuple[list, set] | None:
    """``([(file, [(checkpoint key, model name), ...]), ...], ids of the model tensors covered)`` for every
    checkpoint tensor the model has (a key may lack the base model's prefix); None when a backbone weight
    is missing or has another shape."""
    from safetensors import safe_open

    names = {**dict(model.named_buffers()), **dict(model.named_parameters(remove_duplicate=False))}
    prefix = model.base_model_prefix
    plan, covered = [], set()
    for path in files:
        entries = []
        with safe_open(path, framework="pt") as checkpoint:
            for key in checkpoint.keys():
                name = key if key in names else f"{prefix}.{key}" if f"{prefix}.{key}" in names else None
                if name is None:
                    continue  # e.g. a causal LM's lm_head read as a reward model
                shape = tuple(getattr(names[name], "ds_shape", names[name].shape))
                if tuple(checkpoint.get_slice(key).get_shape()) != shape:
                    return None
                entries.append((key, name))
                covered.add(id(names[name]))
        plan.append((path, entries))
    backbone = model.base_model.parameters()
    return (plan, covered) if all(id(param) in covered for param in backbone) else None


def _stream_checkpoint(model, plan: list) -> None:
    """Copy every planned checkpoint tensor into the partitioned ``model``.

    Each rank reads only the rows of each weight that hold its own flat slice (safetensors' lazy slices of
    the mapped file, :func:`_flat_slice`) and copies that slice into the partition it keeps: no rank holds
    a whole weight and nothing is sent between ranks; the file is mapped for one tensor at a time, so the
    pages a rank touched do not add up in its memory. A weight whose partition is not a plain tensor in
    memory (offloaded to NVMe, quantized) is gathered alone instead, rank 0 copies it in and DeepSpeed
    hands out the slices; buffers are not partitioned, every rank reads them whole."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from safetensors import safe_open

    params, buffers = dict(model.named_parameters(remove_duplicate=False)), dict(model.named_buffers())
    with torch.no_grad():
        for path, entries in plan:
            for key, name in entries:
                # opened per tensor: the mapped pages it touched leave this process's memory when it closes
                with safe_open(path, framework="pt") as checkpoint:
                    if name in buffers:
                        buffers[name].copy_(checkpoint.get_tensor(key))
                        continue
                    param, local = params[name], getattr(params[name], "ds_tensor", None)
                    if param.ds_status == ZeroParamStatus.NOT_AVAILABLE and _plain_partition(local):
                        first = dist.get_rank(param.ds_process_group) * local.numel()  # DeepSpeed's layout
                        count = max(min(local.numel(), param.ds_numel - first), 0)  # (the last one padded)
                        if count:
                            local.narrow(0, 0, count).copy_(_flat_slice(checkpoint.get_slice(key), first, count))
                        continue
                    with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                        if dist.get_rank() == 0:
                            param.data.copy_(checkpoint.get_tensor(key))


def _flat_slice(tensor_slice, first: int, count: int):
    """Elements ``[first, first + count)`` of a checkpoint tensor seen flat, reading only the rows (along
    its first dimension) that hold them."""
    import math

    shape = tensor_slice.get_shape()
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    top, bottom = first // row, -(-(first + count) // row)
    rows = tensor_slice[top:bottom].reshape(-1)
    return rows.narrow(0, first - top * row, count)


def _plain_partition(local) -> bool:
    """A ZeRO-3 partition held as a plain tensor in memory: neither in NVMe nor quantized."""
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    nvme = getattr(local, "final_location", None) == OffloadDeviceEnum.nvme
    return local is not None and not nvme and not hasattr(local, "ds_quant_scale")


def _init_missing(model, covered: set) -> None:
    """Initialise the weights the checkpoint lacks (a new reward head) as from_pretrained does, with the
    model's ``_init_weights`` for each module that owns one. Every rank draws the same numbers (their
    generators stay in step, as after a plain load) and rank 0's are kept."""
    import deepspeed
    import torch

    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if not any(id(param) not in covered for param in own):
            continue
        for param in own:  # transformers' init functions leave these alone
            param._is_hf_initialized = id(param) in covered
        with torch.no_grad(), deepspeed.zero.GatheredParameters(own, modifier_rank=0):
            model._init_weights(module)


def apply_lora(model, lora: LoraConfig, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """Wrap ``model`` with PEFT LoRA adapters; returns it unchanged when ``lora.r == 0``."""
    if lora.r <= 0:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    from trainer_lib.models import vision

    targets: str | list[str] = list(lora.target_modules)
    if targets == [ALL_LINEAR]:
        targets = ALL_LINEAR  # PEFT's shorthand: every nn.Linear except the output head
    else:
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [m for m in targets if m not in names]
        if missing:
            raise UserError(
                f"lora.target_modules: {missing} not found in the model (linear layers include "
                f"e.g. {sorted(n for n in names if n.endswith('proj'))[:8]}, or use all-linear)"
            )
    if vision.is_vision_language(getattr(model, "config", None)):  # adapters in the language model only
        targets = vision.language_model_targets(model, targets)
    peft_cfg = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type=task_type,
        modules_to_save=modules_to_save,
    )
    return get_peft_model(model, peft_cfg)


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts; the full sizes under ZeRO-3 too, where each rank holds
    only a partition (``ds_numel`` is the parameter's whole size)."""
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in model.parameters()]
    return sum(n for n, grad in sizes if grad), sum(n for n, _ in sizes)


def disable_dropout(model) -> None:
    """Dropout off for good: in RL it would make the update's log-probs disagree with the
    rollout's (TRL does the same)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
