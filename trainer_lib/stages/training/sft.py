"""Supervised fine-tuning: prompt-masked next-token loss, padding-free packing, resumable.

    posttrain sft model.path=DIR data.path=FILE output_dir=OUT max_steps=200

The loop reads top to bottom: for every optimizer step, take ``gradient_accumulation_steps``
micro-batches for this rank, forward, backward, step (:class:`MicroBatchSteps`; through the stages of
a pipeline with ``parallel.pipeline > 1``, :class:`PipelineSteps`); log, evaluate and checkpoint on
their schedules; at the end write a Hugging Face model at the root of ``output_dir``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from trainer_lib.config import TrainingConfig
from trainer_lib.errors import UserError
from trainer_lib.loop.micro_batches import SplitBatches, TrainOrder

SFT_FORMATS = ("text", "prompt_completion", "messages")


@dataclass
class SFTConfig(TrainingConfig):
    """SFT adds nothing to the shared training keys; packing lives in ``data.packing``."""

    MODEL_PARALLEL = ("tensor", "pipeline", "sequence")


CONFIG = SFTConfig


def make_collate(cfg: TrainingConfig, pad_token_id: int, device, processor=None):
    """Tokenized examples -> one micro-batch on ``device``: a packed row (``data.packing``, with its sequence
    boundaries as flash-attention kwargs unless the model's code is remote) or padded rows; with a
    vision-language model's ``processor``, the pixels of the examples' images too."""
    import torch

    from trainer_lib.data.tokenize import boundary_kwargs, collate_packed, collate_padded

    def collate(examples: list[dict]) -> dict:
        if not cfg.data.packing:
            return {k: v.to(device) for k, v in collate_padded(examples, pad_token_id).items()}
        batch = {k: v.to(device) for k, v in collate_packed(examples).items()}
        if cfg.model.trust_remote_code:  # a fixed forward signature would refuse the kwargs
            return batch
        bounds = torch.tensor([0, *itertools.accumulate(len(ex["input_ids"]) for ex in examples)])
        return {**batch, **boundary_kwargs(bounds, device)}

    if processor is not None:
        from trainer_lib.data.vision_tokenize import with_images

        return with_images(collate, processor, device)
    return collate


def load_data(cfg: SFTConfig, tokenizer, device) -> tuple[SplitBatches, SplitBatches, str]:
    """``(train, eval, format)``: rows normalized (or loaded prepared), tokenized with prompt masking
    (``data.num_workers`` processes, cached as memory-mapped Arrow) and grouped into micro-batches."""
    from trainer_lib.data.dataset import training_data
    from trainer_lib.data.tokenize import micro_batches
    from trainer_lib.data.tokenized import tokenize_train_eval
    from trainer_lib.models.load import load_processor

    data = training_data(cfg.data, cfg.seed, allowed_formats=SFT_FORMATS, tokenizer=tokenizer)
    processor = load_processor(cfg.model, tokenizer)  # a vision-language model's; None for a text model
    kind = "sft" if processor is None else "sft_images"
    train, evals = tokenize_train_eval(data, kind, processor or tokenizer, cfg.data)
    if not len(train):
        raise UserError(f"data.path: {cfg.data.path} has no trainable rows (every completion is empty or truncated)")
    max_len, packing = cfg.data.max_length, cfg.data.packing
    collate = make_collate(cfg, tokenizer.pad_token_id, device, processor)
    return (
        SplitBatches(train, micro_batches(train, cfg.batch_size, max_len, packing), collate),
        SplitBatches(evals, micro_batches(evals, cfg.eval_batch_size, max_len, packing) if len(evals) else [], collate),
        data.format,
    )


class MicroBatchSteps:
    """An optimizer step as data and tensor parallelism take it: forward, backward and step per micro-batch
    (DeepSpeed steps the optimizer at the accumulation boundary)."""

    def __init__(self, engine, strategy):
        self.engine, self.strategy = engine, strategy

    def train(self, micro_batches, window) -> None:
        from trainer_lib.data.tokenize import count_tokens
        from trainer_lib.models.lm_head import causal_lm_loss

        for ids, batch in micro_batches:
            loss = causal_lm_loss(self.engine, batch)
            self.strategy.backward(loss, self.engine)
            self.strategy.optimizer_step(self.engine)
            window.add("loss", loss)
            window.count(samples=len(ids), tokens=count_tokens(batch))

    def loss_sums(self, batch: dict) -> tuple[float, float]:
        """(summed next-token loss, scored tokens) of one micro-batch, without gradients."""
        from trainer_lib.models.lm_head import causal_lm_loss

        n = int((batch["labels"][:, 1:] != -100).sum())
        return (float(causal_lm_loss(self.engine, batch)) * n, float(n)) if n else (0.0, 0.0)


class SequenceParallelSteps(MicroBatchSteps):
    """An optimizer step under ``parallel.sequence > 1``: each micro-batch's packed row split over the
    sequence group, every rank scoring its chunk's positions, its loss its share of the row's mean
    (:mod:`trainer_lib.engine.sequence`)."""

    def __init__(self, engine, strategy):
        super().__init__(engine, strategy)
        self.shards = strategy.sequence_shards()

    def train(self, micro_batches, window) -> None:
        from trainer_lib.data.tokenize import count_tokens
        from trainer_lib.models.lm_head import shifted_lm_loss

        for ids, batch in micro_batches:
            local, shifted = self.shards.split(batch, {"labels": -100})
            count = int((batch["labels"][:, 1:] != -100).sum())
            loss = shifted_lm_loss(self.engine, local, shifted["labels"], 1.0 / max(count, 1))
            self.strategy.backward(loss, self.engine)
            self.strategy.optimizer_step(self.engine)
            window.add("loss", self.shards.sum(loss))  # the row's mean, as one process logs it
            window.count(samples=len(ids), tokens=count_tokens(batch))

    def loss_sums(self, batch: dict) -> tuple[float, float]:
        from trainer_lib.models.lm_head import shifted_lm_loss

        local, shifted = self.shards.split(batch, {"labels": -100})
        n = int((batch["labels"][:, 1:] != -100).sum())
        total = self.shards.sum(shifted_lm_loss(self.engine, local, shifted["labels"], 1.0))
        return (float(total), float(n)) if n else (0.0, 0.0)


class PipelineSteps(MicroBatchSteps):
    """An optimizer step through DeepSpeed's pipeline engine (``parallel.pipeline > 1``): the step's
    micro-batches flow through the stages in one ``train_batch`` (:mod:`trainer_lib.engine.pipeline`)."""

    def train(self, micro_batches, window) -> None:
        from trainer_lib.data.tokenize import count_tokens
        from trainer_lib.engine.pipeline import train_step

        taken = list(micro_batches)
        window.add("loss", train_step(self.engine, [batch for _, batch in taken]))  # the micro-batches' mean
        for ids, batch in taken:
            window.count(samples=len(ids), tokens=count_tokens(batch))

    def loss_sums(self, batch: dict) -> tuple[float, float]:
        from trainer_lib.engine.pipeline import eval_sums

        return eval_sums(self.engine, [batch])


def evaluate_loss(steps: MicroBatchSteps, strategy, evals: SplitBatches) -> dict:
    """``{"loss": x}``: token-weighted mean loss over ``evals`` (sharded across ranks)."""

    def sums(group: list[int]) -> dict:
        total, count = steps.loss_sums(evals.collated(group))
        return {"total": total, "count": count}

    totals = strategy.sharded_sums(evals.groups, sums, {"total": 0.0, "count": 0.0}, models=(steps.engine,))
    return {"loss": totals["total"] / max(totals["count"], 1)}


def run(cfg: SFTConfig) -> dict:
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.models.load import apply_lora, load_causal_lm, load_tokenizer

    resolve_batch_size(cfg)
    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed, parallel=cfg.parallel)
    strategy.setup_distributed()

    # ---- data, and the order training takes its micro-batches in
    tokenizer = load_tokenizer(cfg.model)
    train, evals, fmt = load_data(cfg, tokenizer, strategy.device)
    order = TrainOrder(cfg, train, strategy.data_world_size, strategy.data_rank)

    # ---- model and engine
    model = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision, placement=strategy.placement()), cfg.lora)
    engine = strategy.prepare(strategy.pipelined(model), total_steps=order.steps, **cfg.optimizer_args())
    steps = (
        PipelineSteps
        if strategy.is_pipeline(engine)
        else SequenceParallelSteps
        if cfg.parallel.sequence > 1
        else MicroBatchSteps
    )(engine, strategy)
    evaluation = (lambda: evaluate_loss(steps, strategy, evals)) if len(evals.examples) else None
    cadence = Cadence(cfg, strategy, "sft", order.steps, engine, evaluate=evaluation)
    cadence.restore(
        f"{len(train.examples)} train / {len(evals.examples)} eval examples ({fmt}), {len(train.groups)} micro-batches"
    )

    # ---- the loop
    for step in cadence.steps():
        steps.train(order.micro_batches(step), cadence.window)
        cadence.after_step(step, epoch=order.epoch(step))

    # ---- final evaluation and Hugging Face export
    summary = cadence.finish({"stage": "sft", "train_examples": len(train.examples), "format": fmt})
    if "eval" in summary:
        summary["eval_loss"] = summary["eval"]["loss"]
    return cadence.save_model(tokenizer, summary)
