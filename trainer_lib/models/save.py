"""The final Hugging Face directory, written a tensor at a time: never a whole state dict in memory.

Under ZeRO-3 no rank holds a full weight, and gathering the whole model (as ``save_pretrained``
needs) puts one full copy on *every* rank at once. Here each tensor is gathered on its own, only
the writer (rank 0) copies it into the shard being filled, the other ranks drop it, and a shard
is written with safetensors' ``save_file`` as soon as it is complete. The layout is exactly what
``save_pretrained`` writes: its names (tied weights once, ``_keys_to_ignore_on_save`` left out,
its weight-name conversions reverted), huggingface_hub's split into ``model-0000i-of-0000N``
shards and ``model.safetensors.index.json``, then config and generation config.

A PEFT model is saved merged (what ``merge_and_unload().save_pretrained()`` writes) without
touching the live weights: for each LoRA layer, ``W + sum of get_delta_weight(adapter)`` is
computed from that layer's gathered pieces. ``merge_lora=False`` writes the adapter alone.

The gathering itself belongs to the strategy (the one place that talks to DeepSpeed): callers
pass ``gather(tensors)``, a context manager within which ``tensors`` hold their full values on
the writer, and which every rank enters in the same order.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Largest shard written (and so held in the writer's memory at once); the size transformers 4 used.
MAX_SHARD_SIZE = "5GB"

Gather = Callable[[list], contextlib.AbstractContextManager]


@dataclass
class Entry:
    """One tensor of the saved state dict and where its value comes from."""

    name: str  # as save_pretrained names it
    source: Any  # the live parameter or buffer (tied weights share it)
    lora_layer: Any = None  # a PEFT LoRA layer whose active adapters are merged into ``source``

    def tensors(self) -> list:
        """What to gather to compute the value (a LoRA layer's base weight and adapters together)."""
        return list(self.lora_layer.parameters()) if self.lora_layer is not None else [self.source]

    def value(self):
        """The full value, a CPU copy of its own (call within ``gather(self.tensors())``)."""
        value = self.source.detach().to("cpu", copy=True)
        layer = self.lora_layer
        if layer is None:
            return value
        is_bias = self.name.endswith(".bias")
        for adapter in layer.active_adapters:  # as LoraLayer.merge (safe_merge=False) does it
            if adapter in layer.merged_adapters or adapter not in layer.lora_A.keys():
                continue
            if adapter in getattr(layer, "lora_variant", {}):
                raise NotImplementedError(
                    f"{self.name}: merging a {type(layer.lora_variant[adapter]).__name__} "
                    f"adapter is not supported (plain LoRA is)"
                )
            if not is_bias:
                value += layer.get_delta_weight(adapter).to("cpu", value.dtype)
            elif getattr(layer, "lora_bias", {}).get(adapter):
                value += (layer.lora_B[adapter].bias * layer.scaling[adapter]).to("cpu", value.dtype)
        return value


def merged_entries(model) -> list[Entry]:
    """The state dict ``model`` would save, as entries, in ``state_dict()`` order.

    ``model`` is a transformers model, possibly with PEFT layers inside (a PeftModel's base model):
    the names are then those of ``merge_and_unload()``: a LoRA layer's ``base_layer`` is its
    ``weight``/``bias``, adapter tensors drop out, and a ``modules_to_save`` copy stands for the
    module it replaced.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    entries: dict[str, Entry] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        parts = key.split(".")
        if any(p.startswith("lora_") or p == "original_module" for p in parts):
            continue  # adapter weights (merged below) and the module a modules_to_save copy replaced
        layer = None
        if "base_layer" in parts:
            at = parts.index("base_layer")
            owner = model.get_submodule(".".join(parts[:at]))
            layer = owner if isinstance(owner, BaseTunerLayer) else None
            parts = parts[:at] + parts[at + 1 :]
        if "modules_to_save" in parts:
            at = parts.index("modules_to_save")
            parts = parts[:at] + parts[at + 2 :]  # the copy of the (one) active adapter
        name = ".".join(parts)
        entries.setdefault(name, Entry(name, tensor, layer))
    return list(entries.values())


def _shape(tensor):
    return getattr(tensor, "ds_shape", tensor.shape)  # ZeRO-3 keeps only a partition in .data


def shard_plan(model, entries: list[Entry], max_shard_size: int | str):
    """``(split, convert_per_shard)``: huggingface_hub's split of the entries into shards after
    transformers' own pruning and reordering, as save_pretrained makes it.

    It runs on meta tensors of the full shapes: nothing is gathered yet. A model whose saved names
    differ from its module names (weight conversions, e.g. fused MoE experts) is split on the module
    names and converted a shard at a time, as save_pretrained does for offloaded weights.
    """
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    meta = {e.name: torch.empty(_shape(e.source), dtype=e.source.dtype, device="meta") for e in entries}
    for ignored in model._keys_to_ignore_on_save or ():
        meta.pop(ignored, None)
    meta = remove_tied_weights_from_state_dict(meta, model)  # meta: tied by the live tensors' identity
    reverted = revert_weight_conversion(model, dict(meta))
    convert_per_shard = set(reverted) != set(meta)
    split = split_torch_state_dict_into_shards(
        meta if convert_per_shard else reverted,
        filename_pattern="model{suffix}.safetensors",
        max_shard_size=max_shard_size,
    )
    return split, convert_per_shard


def write_weights(
    model, out_dir: str, gather: Gather, is_writer: bool, max_shard_size: int | str = MAX_SHARD_SIZE
) -> None:
    """Safetensors shards (and their index when there are several) of ``model`` merged, one tensor
    gathered at a time; every rank calls this, only ``is_writer`` keeps and writes."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers.core_model_loading import revert_weight_conversion

    entries = {e.name: e for e in merged_entries(model)}
    split, convert_per_shard = shard_plan(model, list(entries.values()), max_shard_size)
    weight_map: dict[str, str] = {}
    total = 0
    for filename, names in split.filename_to_tensors.items():
        shard = {}
        for name in names:
            entry = entries[name]
            with gather(entry.tensors()):
                if is_writer:
                    shard[name] = entry.value().contiguous()
            if isinstance(entry.source, torch.nn.Parameter):
                total += _shape(entry.source).numel()
        if not is_writer:
            continue
        if convert_per_shard:
            shard = revert_weight_conversion(model, shard)
        save_file(shard, os.path.join(out_dir, filename), metadata={"format": "pt"})
        weight_map.update({name: filename for name in shard})
        del shard
    if is_writer and split.is_sharded:
        index = {"metadata": {"total_parameters": total, **split.metadata}, "weight_map": weight_map}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def write_config(model, out_dir: str) -> None:
    """config.json and generation_config.json as save_pretrained writes them (and remote code)."""
    from transformers.dynamic_module_utils import custom_object_save

    model.config.dtype = str(model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    if model.is_remote_code():
        custom_object_save(model, out_dir, config=model.config)
    model.config.save_pretrained(out_dir)
    if model.can_generate():
        model.generation_config.save_pretrained(out_dir)


def save_hf_model(
    module,
    tokenizer,
    out_dir: str,
    *,
    gather: Gather,
    is_writer: bool,
    merge_lora: bool = True,
    extra_files: dict[str, str] | None = None,
    max_shard_size: int | str = MAX_SHARD_SIZE,
) -> None:
    """The whole directory: weights (LoRA merged, or only the adapter), config, tokenizer, extra files.

    Every rank calls it (gathering is collective); only ``is_writer`` writes. The live module is
    left as it was, apart from ``use_cache`` and the generation config's eos ids.
    """
    is_peft = hasattr(module, "merge_and_unload")
    model = module.get_base_model() if is_peft else module
    if hasattr(model, "config"):
        model.config.use_cache = True
    stop_at_eos(model, tokenizer)
    if is_writer:
        os.makedirs(out_dir, exist_ok=True)
    if is_peft and not merge_lora:
        write_adapter(module, out_dir, gather, is_writer)
    else:
        write_weights(model, out_dir, gather, is_writer, max_shard_size)
        if is_writer:
            write_config(model, out_dir)
    if not is_writer:
        return
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    for name, text in (extra_files or {}).items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
            fh.write(text)


def write_adapter(module, out_dir: str, gather: Gather, is_writer: bool) -> None:
    """The PEFT adapter alone (adapter_config.json, adapter_model.safetensors): only the trainable
    tensors (the adapters and modules_to_save copies) are gathered, never the base weights."""
    with gather([p for p in module.parameters() if p.requires_grad]):
        if is_writer:
            # a PeftModel picks its adapter's tensors out of the state dict it is given
            state = {
                k: v.detach().to("cpu", copy=True)
                for k, v in module.state_dict().items()
                if "lora_" in k or "modules_to_save" in k
            }
            module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)


def stop_at_eos(model, tokenizer) -> None:
    """List the tokenizer's eos among the generation config's, so generation with the saved model stops
    there too (model.chat_template may have made an end-of-turn token the eos)."""
    generation = getattr(model, "generation_config", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    if generation is None or eos is None:
        return
    ids = generation.eos_token_id
    ids = [] if ids is None else list(ids) if isinstance(ids, (list, tuple)) else [ids]
    if eos not in ids:
        generation.eos_token_id = ids + [eos] if ids else eos


@contextlib.contextmanager
def memory_log(path: str | None, rank: int):
    """With a path (``$POSTTRAIN_SAVE_MEMORY_LOG``), append this rank's resident memory around the
    block as a JSON line, in kB: at the start (``rss_before``, and ``peak_before``, the high-water
    mark so far) and the block's own peak (``peak_during``: Linux's high-water mark is reset at
    the start by writing 5 to /proc/self/clear_refs). Off (no path) or off Linux it does nothing."""
    import json
    import re

    def status() -> dict:
        with open("/proc/self/status", encoding="ascii") as fh:
            text = fh.read()
        return {key: int(re.search(rf"{key}:\s+(\d+)", text).group(1)) for key in ("VmRSS", "VmHWM")}

    if not path or not os.path.exists("/proc/self/clear_refs"):
        yield
        return
    before = status()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")
    yield
    record = {
        "rank": rank,
        "rss_before": before["VmRSS"],
        "peak_before": before["VmHWM"],
        "peak_during": status()["VmHWM"],
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def saved_parameters(model_dir: str) -> int:
    """The parameters in a saved directory's ``*.safetensors`` files, counted from the headers alone (no
    tensor is read); 0 when it has none (a ``.bin`` checkpoint, an adapter-only or a missing directory)."""
    import json
    import math
    import struct

    total = 0
    names = sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []
    for name in (n for n in names if n.endswith(".safetensors") and not n.startswith("adapter_")):
        with open(os.path.join(model_dir, name), "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        total += sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")
    return total
