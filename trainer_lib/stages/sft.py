"""Supervised fine-tuning: prompt-masked next-token loss, padding-free packing, resumable.

    posttrain sft model.path=DIR data.path=FILE output_dir=OUT max_steps=200

The loop reads top to bottom: for every optimizer step, take ``gradient_accumulation_steps``
micro-batches for this rank, forward, backward, step; log, evaluate and checkpoint on their
schedules; at the end write a Hugging Face model at the root of ``output_dir``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import TrainingConfig
from trainer_lib.errors import UserError
from trainer_lib.schedule import MicroBatchSchedule, total_steps

SFT_FORMATS = ("text", "prompt_completion", "messages")


@dataclass
class SFTConfig(TrainingConfig):
    """SFT adds nothing to the shared training keys; packing lives in ``data.packing``."""


CONFIG = SFTConfig


def make_collate(cfg: TrainingConfig, pad_token_id: int):
    from trainer_lib.data.tokenize import collate_packed, collate_padded

    if cfg.data.packing:
        return collate_packed
    return lambda examples: collate_padded(examples, pad_token_id)


def evaluate_loss(engine, strategy, examples: list[dict], groups: list[list[int]], collate) -> float:
    """Token-weighted mean loss over ``groups`` (sharded across ranks)."""
    import torch

    engine.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for group in groups[strategy.rank::strategy.world_size]:
            batch = {k: v.to(strategy.device) for k, v in collate([examples[i] for i in group]).items()}
            n = int((batch["labels"][:, 1:] != -100).sum())
            if n == 0:
                continue
            out = engine(**batch, use_cache=False)
            total += float(out.loss) * n
            count += n
    engine.train()
    sums = strategy.all_reduce({"total": total, "count": count}, op="sum")
    return sums["total"] / max(sums["count"], 1)


def run(cfg: SFTConfig) -> dict:
    from trainer_lib.checkpoint import CheckpointManager
    from trainer_lib.data.dataset import load_training_data
    from trainer_lib.data.tokenize import micro_batches, tokenize_sft
    from trainer_lib.models.load import apply_lora, count_parameters, load_causal_lm, load_tokenizer
    from trainer_lib.strategy import DeepSpeedStrategy
    from trainer_lib.tracking import Tracker

    storage.configure(endpoint_url=cfg.storage.endpoint_url, region=cfg.storage.region,
                      cache_dir=cfg.storage.cache_dir)
    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed)
    strategy.setup_distributed()
    ckpt = CheckpointManager.for_stage(cfg, strategy)

    # ---- data: normalize (or load prepared), tokenize with prompt masking, group into micro-batches
    tokenizer = load_tokenizer(cfg.model)
    splits, fmt = load_training_data(cfg.data, cfg.seed, allowed_formats=SFT_FORMATS, tokenizer=tokenizer)
    max_len = cfg.data.max_length

    def tokenized(split) -> list[dict]:
        rows = [tokenize_sft(row, fmt, tokenizer, max_len) for row in split]
        return [r for r in rows if any(label != -100 for label in r["labels"][1:])]

    train = tokenized(splits["train"])
    evals = tokenized(splits["eval"]) if "eval" in splits else []
    if not train:
        raise UserError(f"data.path: {cfg.data.path} has no trainable rows (every completion is empty or truncated)")
    train_groups = micro_batches(train, cfg.batch_size, max_len, cfg.data.packing)
    eval_groups = micro_batches(evals, cfg.eval_batch_size, max_len, cfg.data.packing) if evals else []
    schedule = MicroBatchSchedule(len(train_groups), cfg.engine.gradient_accumulation_steps,
                                  strategy.world_size, cfg.seed)
    steps = total_steps(cfg, len(train_groups), schedule.batches_per_step())
    collate = make_collate(cfg, tokenizer.pad_token_id)

    # ---- model and engine
    model = load_causal_lm(cfg.model, cfg.engine.precision)
    model = apply_lora(model, cfg.lora)
    trainable, total = count_parameters(model)
    engine = strategy.prepare(model, lr=cfg.lr, weight_decay=cfg.weight_decay, total_steps=steps,
                              warmup_steps=cfg.warmup_steps, lr_scheduler=cfg.lr_scheduler)
    state = ckpt.restore(engine) if cfg.resume else None
    start = int(state["step"]) if state else 0
    strategy.print(f"sft: {len(train)} train / {len(evals)} eval examples ({fmt}), {len(train_groups)} "
                   f"micro-batches, {steps} steps, {trainable:,}/{total:,} trainable params, "
                   f"world size {strategy.world_size}" + (f", resuming at step {start}" if start else ""))
    tracker = Tracker(ckpt.local_dir, enabled=strategy.is_rank_0, total_steps=steps, initial_step=start, desc="sft")
    if state is None and evals:
        tracker.log(0, {"loss": evaluate_loss(engine, strategy, evals, eval_groups, collate)}, split="eval")

    # ---- the loop
    engine.train()
    window_loss, window_tokens, window_start = 0.0, 0, time.time()
    epoch = 0
    for step in range(start, steps):
        for slot in range(schedule.accumulation):
            epoch, group = schedule.index(step, slot, strategy.rank)
            batch = {k: v.to(strategy.device) for k, v in collate([train[i] for i in train_groups[group]]).items()}
            out = engine(**batch, use_cache=False)
            strategy.backward(out.loss, engine)
            strategy.optimizer_step(engine)
            window_loss += out.loss.detach().item() / schedule.accumulation
            window_tokens += int(batch["input_ids"].numel())
        done = step + 1
        tracker.advance()
        if done % cfg.logging_steps == 0 or done == steps:
            n = cfg.logging_steps if done % cfg.logging_steps == 0 else done % cfg.logging_steps
            elapsed = time.time() - window_start
            metrics = strategy.all_reduce({"loss": window_loss / n})
            tokens = strategy.all_reduce(float(window_tokens), op="sum")
            tracker.log(done, {**metrics, "lr": engine.get_lr()[0], "epoch": epoch,
                               "grad_norm": strategy.grad_norm(engine), "tokens_per_s": tokens / max(elapsed, 1e-9)})
            window_loss, window_tokens, window_start = 0.0, 0, time.time()
        if evals and cfg.eval_steps and done % cfg.eval_steps == 0 and done != steps:
            tracker.log(done, {"loss": evaluate_loss(engine, strategy, evals, eval_groups, collate)}, split="eval")
        if cfg.save_steps and done % cfg.save_steps == 0 and done != steps:
            ckpt.save(engine, done, {"step": done})

    # ---- final evaluation and Hugging Face export
    summary = {"stage": "sft", "steps": steps, "train_examples": len(train), "format": fmt,
               "output_dir": cfg.output_dir}
    if evals:
        summary["eval_loss"] = evaluate_loss(engine, strategy, evals, eval_groups, collate)
        tracker.log(steps, {"loss": summary["eval_loss"]}, split="eval")
    if cfg.save_steps and start < steps:
        ckpt.save(engine, steps, {"step": steps})
    tracker.close()
    ckpt.finish(engine, tokenizer, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    from trainer_lib.cli import main as cli_main

    return cli_main(["sft", *(argv or [])])
