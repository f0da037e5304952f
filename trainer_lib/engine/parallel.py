"""How a job's ranks divide into tensor-, pipeline-, sequence- and data-parallel groups, and the checks
that refuse a layout before any weight is loaded.

``parallel.tensor`` (T), ``parallel.pipeline`` (P) and ``parallel.sequence`` (S) come from the config;
data parallel is what is left: ``world / (T x P x S)``. The ranks of one tensor group, one pipeline or
one sequence group train on the same rows, so the data order is sharded by data-parallel rank only
(:meth:`Layout.data_rank`). Rank numbering follows DeepSpeed's own groups: AutoTP's device mesh is
(data, tensor), tensor innermost; the pipeline engine's topology is (pipe, data), data innermost, or
with tensor groups inside the stages (pipe, data, model), model innermost; Ulysses' sequence groups
are consecutive ranks (data, sequence). S combines with data parallelism (and ZeRO) only.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass

from trainer_lib.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    tensor: int = 1
    pipeline: int = 1
    world: int = 1
    sequence: int = 1

    @property
    def data(self) -> int:
        """Data-parallel size: the ranks that train on different rows."""
        return self.world // (self.tensor * self.pipeline * self.sequence)

    @property
    def model_parallel(self) -> bool:
        return self.tensor > 1 or self.pipeline > 1 or self.sequence > 1

    def data_rank(self, rank: int) -> int:
        """This rank's place among the data-parallel ranks (the shard of the data it reads)."""
        if self.pipeline > 1:  # (pipe, data, model): model innermost, then data
            return (rank // self.tensor) % self.data
        return rank // (self.tensor * self.sequence)

    def describe(self) -> str:
        sequence = f" x sequence {self.sequence}" if self.sequence > 1 else ""
        return (
            f"parallel: tensor {self.tensor} x pipeline {self.pipeline}{sequence} x data {self.data} = "
            f"{self.world} rank(s)"
        )


def layout(parallel, world: int) -> Layout:
    """The layout of ``parallel`` (a :class:`~trainer_lib.config.sections.ParallelConfig`) over ``world``
    ranks; a ConfigError naming the keys when T x P x S does not divide the world."""
    tensor, pipeline, sequence = parallel.tensor, parallel.pipeline, parallel.sequence
    if world % (tensor * pipeline * sequence):  # (ParallelConfig refuses S with T or P)
        cut = f"parallel.tensor={tensor} x parallel.pipeline={pipeline} = {tensor * pipeline}"
        raise ConfigError(
            f"{f'parallel.sequence={sequence}' if sequence > 1 else cut} does not divide the world size {world} "
            f"(processes: --nproc or nodes x GPUs per node)"
        )
    return Layout(tensor, pipeline, world, sequence)


def text_config(config: dict) -> dict:
    """The language model's part of a model config (a vision-language config nests it)."""
    return config.get("text_config") or config.get("llm_config") or config


def check_model(parallel, config: dict) -> None:
    """A ConfigError when the model cannot be cut this way: T must divide the attention heads and the
    key-value heads (each rank holds whole heads), P the decoder layers (stages of equal depth), S the
    attention heads, and S the key-value heads or they S (Ulysses hands each rank whole query heads and
    replicates key-value heads when there are fewer than S)."""
    config = text_config(config)
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    layers = config.get("num_hidden_layers")
    kind = config.get("model_type", "model")
    if parallel.tensor > 1:
        for key, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
            if count is not None and count % parallel.tensor:
                raise ConfigError(
                    f"parallel.tensor={parallel.tensor} does not divide the {kind} model's {key} ({count}): "
                    f"each rank must hold whole heads"
                )
    sequence = getattr(parallel, "sequence", 1)
    if sequence > 1 and heads is not None and heads % sequence:
        raise ConfigError(
            f"parallel.sequence={sequence} does not divide the {kind} model's num_attention_heads ({heads}): "
            f"each rank attends with whole heads"
        )
    if sequence > 1 and kv_heads is not None and kv_heads % sequence and sequence % kv_heads:
        raise ConfigError(
            f"parallel.sequence={sequence} and the {kind} model's num_key_value_heads ({kv_heads}): neither "
            f"divides the other, so the key-value heads can be neither split nor replicated evenly"
        )
    if parallel.pipeline > 1 and layers is not None and layers % parallel.pipeline:
        raise ConfigError(
            f"parallel.pipeline={parallel.pipeline} does not divide the {kind} model's num_hidden_layers "
            f"({layers}): the stages must be of equal depth"
        )


def check_launch(cfg, world: int) -> Layout:
    """Before workers start (``--nproc``, a TrainJob): the layout over ``world`` ranks and, when the
    model is a local directory, its heads and layers; one ConfigError line instead of one per rank."""
    found = layout(cfg.parallel, world)
    path = os.path.join(cfg.model.path or "", "config.json")
    if found.model_parallel and os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            check_model(cfg.parallel, json.load(fh))
    return found


@contextlib.contextmanager
def tensor_shards_gathered(params: list):
    """Whole values of the AutoTP-sharded ``params`` for the duration (an all-gather in each tensor group,
    so every rank enters it, in the same order), sharded again after. DeepSpeed gathers a replaced layer's
    weight and bias together, in that order, so a layer is gathered whole when any of its tensors is asked for."""
    from deepspeed.module_inject.layers import DS_IS_REPLACED_MODULE

    layers, seen = [], set()
    for param in params:
        owner = getattr(param, "gather_params", None)
        layer = getattr(owner, "__self__", None)
        if getattr(param, DS_IS_REPLACED_MODULE, False) and layer is not None and id(layer) not in seen:
            seen.add(id(layer))
            layers.append([layer.weight, getattr(layer, "bias", None)])
    for pair in layers:
        pair[0].gather_params(pair)
    try:
        yield
    finally:
        for pair in layers:
            pair[0]._tp_partition(pair)
