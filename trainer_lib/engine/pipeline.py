"""Pipeline parallelism (``parallel.pipeline=P``): a Hugging Face causal LM cut into P stages for
DeepSpeed's pipeline engine.

The model becomes a flat list of pipe layers: an embedding, one layer per decoder layer, the final
norm and the LM head. DeepSpeed cuts the list into P contiguous stages, each rank builds only its
own, and a micro-batch flows through them as the tuple ``(hidden, position_ids, attention_mask)``
(only ``hidden`` carries a gradient back). Each decoder pipe layer computes its rotary embeddings
and its attention mask itself from the position ids it receives, with transformers' own
``create_causal_mask``: packed rows (position ids restarting at 0) attend within each sequence
only, as in the unpipelined forward.

The pipe layers wrap the model's own modules (no copies): the weights the engine trains are the
model's. The layers of the other stages are released on each rank (their tensors emptied, the full
shape kept in ``ds_shape``), so a rank holds only its stage, and :func:`save_pipeline_hf_model`
sends each tensor from the stage holding it to rank 0, one at a time.

A training step is ``engine.train_batch`` over exactly ``gradient_accumulation_steps``
micro-batches (:func:`train_step`); its loss is the mean over the micro-batches of each one's
token-mean next-token cross entropy, the same as the unpipelined loop's.
"""

from __future__ import annotations

import contextlib
import functools
import types

from trainer_lib.errors import ConfigError

IGNORE = -100

#: The families whose forward the pipe layers reproduce: model type -> which mask layer ``i`` uses.
#: (Others may scale embeddings, cap logits or mix layer kinds differently: they are refused.)
MASK_KIND = {
    "llama": lambda config, i: "full_attention",
    "mistral": lambda config, i: "full_attention" if config.sliding_window is None else "sliding_attention",
    "qwen2": lambda config, i: config.layer_types[i],
    "qwen3": lambda config, i: config.layer_types[i],
}

#: Partitioning: the decoder layers are balanced (as Megatron/GPT-NeoX do), the embedding lands on
#: the first stage and norm + head on the last. DeepSpeed's "parameters" method would count the
#: vocabulary matrices and push decoder layers off the first and last stages of a large-vocabulary
#: model; "uniform" would count the embedding, norm and head as whole layers.
PARTITION = "type:^DecoderLayerPipe$"
TIED_KEY = "embed_tokens"


def _refuse(what: str) -> ConfigError:
    return ConfigError(f"parallel.pipeline: {what}")


def _causal_lm(model):
    """The transformers model inside a PEFT model (its LoRA layers in place), or ``model`` itself."""
    from trainer_lib.models.load import base_model

    return base_model(model)


def _check_splittable(model) -> None:
    """ConfigError unless ``model`` is a causal LM of a family the pipe layers reproduce (LoRA
    adapters inside are fine; PEFT's ``modules_to_save`` copies are not)."""
    for name, adapter in getattr(model, "peft_config", {}).items():
        if getattr(adapter, "modules_to_save", None):
            raise _refuse(f"the LoRA adapter {name!r} has modules_to_save {adapter.modules_to_save}: not supported")
    model = _causal_lm(model)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    base = getattr(model, "model", None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if model_type not in MASK_KIND or base is None or not all(hasattr(base, p) for p in parts):
        raise _refuse(
            f"cannot split a {model_type} model ({type(model).__name__}) into pipeline stages; "
            f"supported: {', '.join(sorted(MASK_KIND))}"
        )
    head = getattr(model, "lm_head", None)
    if head is None:
        raise _refuse(f"the {model_type} model has no lm_head")
    import torch

    if config.tie_word_embeddings and type(head) is not torch.nn.Linear:  # (PEFT's LoRA layer is another class)
        raise _refuse(f"a LoRA adapter on the tied lm_head of the {model_type} model is not supported")


@functools.cache
def _layer_types() -> types.SimpleNamespace:
    """The pipe layer classes (built on first use: torch is imported only then)."""
    import torch
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    masks = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}

    class EmbeddingPipe(torch.nn.Module):
        """``(input_ids, position_ids, attention_mask)`` -> ``(hidden, position_ids, attention_mask)``."""

        def __init__(self, embed_tokens):
            super().__init__()
            self.embed_tokens = embed_tokens

        def forward(self, inputs):
            input_ids, position_ids, attention_mask = inputs
            return self.embed_tokens(input_ids), position_ids, attention_mask

    class DecoderLayerPipe(torch.nn.Module):
        """One decoder layer; its mask and rotary embeddings come from the position ids it is given."""

        def __init__(self, layer, rotary_emb, config, mask_kind: str):
            super().__init__()
            self.layer, self.rotary_emb = layer, rotary_emb
            self.config, self.make_mask = config, masks[mask_kind]

        def forward(self, inputs):
            hidden, position_ids, attention_mask = inputs
            # an all-ones mask is no mask: with None, transformers finds packed rows in the position ids
            padding = None if bool(attention_mask.all()) else attention_mask
            mask = self.make_mask(
                config=self.config, inputs_embeds=hidden, attention_mask=padding, cache=None, position_ids=position_ids
            )
            rotary = self.rotary_emb(hidden, position_ids=position_ids)
            out = self.layer(
                hidden, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids, use_cache=False
            )
            return out[0] if isinstance(out, tuple) else out, position_ids, attention_mask

    class NormPipe(torch.nn.Module):
        """The final norm; the position ids and mask are not needed past it."""

        def __init__(self, norm):
            super().__init__()
            self.norm = norm

        def forward(self, inputs):
            return self.norm(inputs[0])

    class HeadPipe(torch.nn.Module):
        def __init__(self, lm_head):
            super().__init__()
            self.lm_head = lm_head

        def forward(self, hidden):
            return self.lm_head(hidden)

    return types.SimpleNamespace(
        EmbeddingPipe=EmbeddingPipe, DecoderLayerPipe=DecoderLayerPipe, NormPipe=NormPipe, HeadPipe=HeadPipe
    )


def _tied_logits(embedding_pipe, hidden):
    """The LM head of a tied model: the embedding matrix, held by the last stage's copy of the tied layer."""
    import torch

    return torch.nn.functional.linear(hidden, embedding_pipe.embed_tokens.weight)


def next_token_loss(logits, labels, summed: bool = False):
    """Next-token cross entropy over the labels that are not -100: their mean (a micro-batch's loss,
    as ``causal_lm_loss``), or with ``summed`` their sum (evaluation's token-weighted totals).
    A micro-batch without labels has loss 0."""
    import torch

    targets = labels[:, 1:].reshape(-1)
    scores = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    total = torch.nn.functional.cross_entropy(scores, targets, ignore_index=IGNORE, reduction="sum")
    return total if summed else total / (targets != IGNORE).sum().clamp(min=1)


def _layer_list(model) -> list:
    """The pipe layers of ``model``, in order (a TiedLayerSpec at both ends when the head is the embedding)."""
    from deepspeed.pipe import TiedLayerSpec

    model = _causal_lm(model)
    kinds, base, config = _layer_types(), model.model, model.config
    tied = model.lm_head.weight is base.embed_tokens.weight
    embed = (
        TiedLayerSpec(TIED_KEY, kinds.EmbeddingPipe, base.embed_tokens, tied_weight_attr="embed_tokens.weight")
        if tied
        else kinds.EmbeddingPipe(base.embed_tokens)
    )
    decoders = [
        kinds.DecoderLayerPipe(layer, base.rotary_emb, config, MASK_KIND[config.model_type](config, i))
        for i, layer in enumerate(base.layers[: config.num_hidden_layers])
    ]
    head = (
        TiedLayerSpec(
            TIED_KEY,
            kinds.EmbeddingPipe,
            base.embed_tokens,
            forward_fn=_tied_logits,
            tied_weight_attr="embed_tokens.weight",
        )
        if tied
        else kinds.HeadPipe(model.lm_head)
    )
    return [embed, *decoders, kinds.NormPipe(base.norm), head]


def _layer_modules(layer):
    """The HF modules a pipe layer (or tied spec) holds, for finding which stage owns a weight."""
    return [layer.module_args[0]] if hasattr(layer, "module_args") else [layer]


def pipeline_module(
    model, stages: int, *, tensor: int = 1, activation_checkpoint_interval: int = 0, seed_layers: bool = False
):
    """A ``deepspeed.pipe.PipelineModule`` of ``stages`` stages over a loaded HF causal LM (Llama,
    Mistral, Qwen2/3), or a PEFT LoRA model of one; call after the process group is up, on every rank,
    with the same model.

    ``activation_checkpoint_interval=k`` recomputes each run of k decoder layers in the backward pass
    (torch's non-reentrant checkpoint; the embedding is never checkpointed). Tied embeddings work:
    the first and last stages share the embedding through DeepSpeed's tied layers, whose gradients
    are summed across the two. The weights of the other stages' layers are released on this rank:
    ``model`` is then only good for :func:`save_pipeline_hf_model`.

    ``tensor=T > 1`` splits each stage's decoder layers over T ranks as well (:func:`_shard_stage`): the
    topology is then (pipe, data, model), a stage's T ranks its tensor group.

    Raises ConfigError for families it cannot split, LoRA ``modules_to_save`` or LoRA on a tied head,
    and fewer decoder layers than stages.
    """
    _check_splittable(model)  # (before DeepSpeed loads: a refusal is quick)
    if model.config.num_hidden_layers < stages:
        raise _refuse(
            f"{stages} stages for a model of {model.config.num_hidden_layers} decoder layers; "
            f"each stage needs at least one"
        )
    import torch
    import torch.distributed as dist
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    layers = _layer_list(model)
    shape = {"num_stages": stages}
    if tensor > 1:
        replicas = dist.get_world_size() // (stages * tensor)
        shape = {"topology": PipeModelDataParallelTopology(num_pp=stages, num_mp=tensor, num_dp=replicas)}
    module = PipelineModule(
        layers=layers,
        **shape,
        loss_fn=next_token_loss,
        seed_layers=seed_layers,
        partition_method=PARTITION,
        activation_checkpoint_interval=activation_checkpoint_interval,
        activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
        checkpointable_layers=["DecoderLayerPipe"],
        dynamic_shape=True,  # micro-batches differ in length: each activation send carries its shape
    )
    sharded = _shard_stage(module) if tensor > 1 else set()
    first_of_group = module._grid.get_slice_parallel_rank() == 0
    for param in module.parameters():
        # DeepSpeed's fp32 clipping (ZeRO-0) sums squared gradient norms over the pipeline's ranks but counts
        # only the first stage's parameters unless they are marked model-parallel: without this the clip
        # coefficient comes from the first stage's gradients alone. A tied copy on a later stage counts once,
        # and so does a weight every rank of a tensor group holds whole (norms, embeddings).
        whole = id(param) not in sharded
        param.model_parallel = not getattr(param, "ds_pipe_replicated", False) and (first_of_group or not whole)
    module.posttrain_owners = _owners(model, layers, module)
    _release_other_stages(model, module)
    return module


#: the projections AutoTP's layers split by output (column parallel) and by input (row parallel, all-reduced)
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def _shard_stage(module) -> set[int]:
    """Split the projections of this rank's decoder layers over its tensor group with DeepSpeed's AutoTP
    training layers (``LinearLayer``, ``LinearAllreduce``), in place: each rank keeps whole heads. The ids
    of the parameters now sharded."""
    from deepspeed.module_inject.layers import LinearAllreduce, LinearLayer, set_autotp_mode

    set_autotp_mode(training=True)
    group, sharded = module._grid.get_slice_parallel_group(), set()
    for layer in module.forward_funcs:
        if type(layer).__name__ != "DecoderLayerPipe":
            continue
        for parent in (layer.layer.self_attn, layer.layer.mlp):
            for name in (*COLUMN, *ROW):
                linear = getattr(parent, name, None)
                if linear is None:
                    continue
                split = (LinearLayer if name in COLUMN else LinearAllreduce)(linear, group)
                setattr(parent, name, split)
                sharded.update(id(p) for p in split.parameters() if getattr(p, "tensor_model_parallel", False))
    return sharded


def _owners(model, layers: list, module) -> dict[str, int]:
    """``{parameter name in model: pipeline stage holding it}``; a tied weight belongs to the first stage."""
    stage_of = {}
    for index, layer in enumerate(layers):
        for held in _layer_modules(layer):
            for param in held.parameters():
                stage_of.setdefault(id(param), module.stage_owner(index))
    return {name: stage_of[id(p)] for name, p in model.named_parameters(remove_duplicate=False) if id(p) in stage_of}


def _release_other_stages(model, module) -> None:
    """Empty the parameters this rank's stage does not hold (their full shape kept in ``ds_shape``, as
    ZeRO-3 keeps it, so the save plan still sees every tensor's size)."""
    import torch

    kept = {id(p) for p in module.parameters()}
    for param in model.parameters():
        if id(param) not in kept and param.numel():
            param.ds_shape = param.shape
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)


# ---------------------------------------------------------------------------------------- training


def pipe_inputs(batch: dict, labels=None) -> tuple:
    """A collated batch (input_ids, labels, maybe position_ids and attention_mask) as the pipe engine
    takes a micro-batch: ``((input_ids, position_ids, attention_mask), labels)``, all long tensors;
    ``labels`` (a tensor or a tuple of tensors for the last stage's loss) instead of the batch's."""
    import torch

    ids = batch["input_ids"]
    positions = batch.get("position_ids")
    if positions is None:  # padded rows: positions count from 0 as in the unpipelined forward
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask.long()
    return (ids, positions.expand_as(ids).contiguous(), mask), batch["labels"] if labels is None else labels


def train_step(engine, batches: list[dict], labels: list | None = None) -> float:
    """One optimizer step of the pipeline over exactly ``gradient_accumulation_steps`` micro-batches,
    every rank of the pipeline passing the same list (the first stage reads the inputs, the last the
    labels, or ``labels[i]`` for micro-batch i). Returns the step's loss, the mean of the micro-batches'
    losses, on every rank."""
    if len(batches) != engine.micro_batches:
        raise ValueError(
            f"a pipeline step takes gradient_accumulation_steps={engine.micro_batches} micro-batches, "
            f"got {len(batches)}"
        )
    if not hasattr(engine, "posttrain_grad_norm"):
        _record_grad_norm(engine)
    labels = labels or [None] * len(batches)
    return float(engine.train_batch(data_iter=iter([pipe_inputs(b, y) for b, y in zip(batches, labels)])))


def from_last_stage(engine, value):
    """``value`` as the last stage of this rank's pipeline has it (any picklable object, e.g. CPU tensors
    a loss function kept), on every rank of the pipeline."""
    import torch.distributed as dist

    grid = engine.grid
    last = grid.stage_to_global(stage_id=engine.num_stages - 1, data=grid.data_parallel_id)
    box = [value if engine.is_last_stage() else None]
    dist.broadcast_object_list(box, src=last, group=grid.get_pipe_parallel_group())
    return box[0]


def last_stage_outputs(engine, batches: list[dict], labels: list, output_fn) -> list:
    """``output_fn(logits, labels[i])`` of each micro-batch without gradients, computed by the last stage
    and returned on every rank of the pipeline (as CPU tensors). Every rank of every replica calls it
    equally often (it holds a barrier)."""
    loss_fn, kept = engine.module.loss_fn, []

    def keep(logits, batch_labels):
        out = output_fn(logits, batch_labels)
        kept.append(out.detach().cpu())
        return out.sum()

    engine.module.loss_fn = keep
    try:
        data = iter([pipe_inputs(b, y) for b, y in zip(batches, labels)])
        engine.eval_batch(data, compute_loss=True, reduce_output=None, bcast_loss=False, num_micro_batches=len(batches))
    finally:
        engine.module.loss_fn = loss_fn
    return from_last_stage(engine, kept)


def _record_grad_norm(engine) -> None:
    """Keep the gradient norm DeepSpeed's fp32 clipping computes (ZeRO-0 records none of its own; ZeRO-1
    and bf16 do): the same clip, its result kept for :func:`grad_norm`."""
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip():
        norm = clip_grad_norm_(
            parameters=engine.module.parameters(), max_norm=engine.gradient_clipping(), mpu=engine.mpu
        )
        engine.posttrain_grad_norm = float(norm)

    engine.posttrain_grad_norm = None
    engine.clip_fp32_gradients = clip


def grad_norm(engine) -> float | None:
    """The global gradient norm (all stages, before clipping) of the last :func:`train_step`; None under
    ZeRO-0 without gradient clipping, where nothing computes it."""
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else getattr(engine, "posttrain_grad_norm", None)


def eval_sums(engine, batches: list[dict]) -> tuple[float, float]:
    """``(sum of next-token losses, number of scored tokens)`` over ``batches`` without gradients, the same
    on every rank of this pipeline (not summed over data-parallel replicas: the caller reduces, as
    ``sharded_sums`` does). Every rank of every replica must call it equally often (it holds a barrier)."""
    import torch
    import torch.distributed as dist

    count = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
    loss_fn = engine.module.loss_fn
    engine.module.loss_fn = functools.partial(next_token_loss, summed=True)
    try:
        sums = engine.eval_batch(
            iter([pipe_inputs(b) for b in batches]),
            compute_loss=True,
            reduce_output=None,
            bcast_loss=False,
            num_micro_batches=len(batches),
        )
    finally:
        engine.module.loss_fn = loss_fn
    total = torch.zeros(1, dtype=torch.float64, device=engine.device)
    if engine.is_last_stage():
        total += sum(float(s) for s in sums)
    grid = engine.grid
    last = grid.stage_to_global(stage_id=engine.num_stages - 1, data=grid.data_parallel_id)
    dist.broadcast(total, src=last, group=grid.get_pipe_parallel_group())
    return float(total), float(count)


# ---------------------------------------------------------------------------------------- export


@contextlib.contextmanager
def _sent_to_writer(owner_ranks: dict[int, int], rank: int, writer: int, device, tensors):
    """Within the block, ``tensors`` hold their full values on ``writer``: each one held by another
    rank's stage is sent from there alone (point to point), then released again afterwards."""
    import torch
    import torch.distributed as dist

    borrowed = []
    try:
        for tensor in tensors:
            source = owner_ranks.get(id(tensor), writer)
            if source == writer:
                continue
            if rank == source:
                dist.send(tensor.detach().contiguous(), dst=writer)
            elif rank == writer:
                full = torch.empty(tuple(tensor.ds_shape), dtype=tensor.dtype, device=device)
                dist.recv(full, src=source)
                borrowed.append((tensor, tensor.data))
                tensor.data = full
        yield
    finally:
        for tensor, empty in borrowed:
            tensor.data = empty


def save_pipeline_hf_model(
    engine, model, tokenizer, out_dir: str, extra_files: dict[str, str] | None = None, merge_lora: bool = True
) -> None:
    """The trained model as a normal Hugging Face directory, equal to the unpipelined model's save (a
    LoRA model merged, or with ``merge_lora=False`` its adapter alone).

    ``model`` is the model :func:`pipeline_module` was built from. Every rank calls this; rank 0
    writes, through :func:`trainer_lib.models.save.save_hf_model` (shards, config, tokenizer), and
    each tensor held by another stage is sent to it alone, so no rank holds more than its stage and
    one tensor. Only the first data-parallel replica's stages send.
    """
    import torch.distributed as dist

    from trainer_lib.models.save import save_hf_model

    grid = engine.grid
    first = {"data": 0, **({"model": 0} if grid.get_slice_parallel_world_size() > 1 else {})}
    rank, writer = dist.get_rank(), grid.stage_to_global(stage_id=0, **first)
    owners = engine.module.posttrain_owners
    owner_ranks = {
        id(p): grid.stage_to_global(stage_id=owners[name], **first)
        for name, p in model.named_parameters(remove_duplicate=False)
        if name in owners
    }
    sent = functools.partial(_sent_to_writer, owner_ranks, rank, writer, engine.device)

    @contextlib.contextmanager
    def gather(tensors):
        from trainer_lib.engine.parallel import tensor_shards_gathered

        with tensor_shards_gathered(list(tensors)), sent(tensors):  # a stage's shards joined, then sent
            yield

    save_hf_model(
        model,
        tokenizer,
        out_dir,
        gather=gather,
        is_writer=rank == writer,
        extra_files=extra_files,
        merge_lora=merge_lora,
    )
    dist.barrier()
