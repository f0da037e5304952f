"""Supervised fine-tuning: prompt-masked next-token loss, padding-free packing, resumable.

    posttrain sft model.path=DIR data.path=FILE output_dir=OUT max_steps=200

The loop reads top to bottom: for every optimizer step, take ``gradient_accumulation_steps``
micro-batches for this rank, forward, backward, step; log, evaluate and checkpoint on their
schedules; at the end write a Hugging Face model at the root of ``output_dir``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_lib.config import TrainingConfig
from trainer_lib.errors import UserError
from trainer_lib.loop.micro_batches import MicroBatchSchedule, total_steps

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


def evaluate_loss(engine, strategy, examples, groups: list[list[int]], collate) -> dict:
    """``{"loss": x}``: token-weighted mean loss over ``groups`` (sharded across ranks)."""

    def sums(group: list[int]) -> dict:
        batch = {k: v.to(strategy.device) for k, v in collate([examples[i] for i in group]).items()}
        n = int((batch["labels"][:, 1:] != -100).sum())
        if n == 0:
            return {"total": 0.0, "count": 0.0}
        return {"total": float(engine(**batch, use_cache=False).loss) * n, "count": float(n)}

    totals = strategy.sharded_sums(groups, sums, {"total": 0.0, "count": 0.0}, models=(engine,))
    return {"loss": totals["total"] / max(totals["count"], 1)}


def run(cfg: SFTConfig) -> dict:
    from trainer_lib.data.dataset import training_data
    from trainer_lib.data.tokenize import count_tokens, micro_batches
    from trainer_lib.data.tokenized import tokenize_split
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.models.load import apply_lora, count_parameters, load_causal_lm, load_tokenizer

    resolve_batch_size(cfg)
    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed)
    strategy.setup_distributed()

    # ---- data: normalize (or load prepared), tokenize with prompt masking (data.num_workers processes,
    # cached: memory-mapped Arrow), group into micro-batches
    tokenizer = load_tokenizer(cfg.model)
    data = training_data(cfg.data, cfg.seed, allowed_formats=SFT_FORMATS, tokenizer=tokenizer)
    fmt, max_len = data.format, cfg.data.max_length

    def tokenized(name: str):
        return tokenize_split(
            data.splits[name],
            data.fingerprints[name],
            "sft",
            fmt,
            tokenizer,
            max_len,
            cfg.data.num_workers,
            what=f"{cfg.data.path} [{name}]",
        )

    train = tokenized("train")
    evals = tokenized("eval")
    if not len(train):
        raise UserError(f"data.path: {cfg.data.path} has no trainable rows (every completion is empty or truncated)")
    train_groups = micro_batches(train, cfg.batch_size, max_len, cfg.data.packing)
    eval_groups = micro_batches(evals, cfg.eval_batch_size, max_len, cfg.data.packing) if len(evals) else []
    schedule = MicroBatchSchedule(
        len(train_groups), cfg.engine.gradient_accumulation_steps, strategy.world_size, cfg.seed
    )
    steps = total_steps(cfg, len(train_groups), schedule.batches_per_step())
    collate = make_collate(cfg, tokenizer.pad_token_id)

    # ---- model and engine
    model = load_causal_lm(cfg.model, cfg.engine.precision)
    model = apply_lora(model, cfg.lora)
    engine = strategy.prepare(model, total_steps=steps, **cfg.optimizer_args())
    cadence = Cadence(
        cfg,
        strategy,
        "sft",
        steps,
        engine,
        parameters=count_parameters(model),
        evaluate=(lambda: evaluate_loss(engine, strategy, evals, eval_groups, collate)) if len(evals) else None,
    )
    cadence.restore(f"{len(train)} train / {len(evals)} eval examples ({fmt}), {len(train_groups)} micro-batches")

    # ---- the loop
    for step in cadence.steps():
        for slot in range(schedule.accumulation):
            epoch, group = schedule.index(step, slot, strategy.rank)
            batch = {k: v.to(strategy.device) for k, v in collate([train[i] for i in train_groups[group]]).items()}
            out = engine(**batch, use_cache=False)
            strategy.backward(out.loss, engine)
            strategy.optimizer_step(engine)
            cadence.window.add("loss", out.loss)
            cadence.window.count(samples=len(train_groups[group]), tokens=count_tokens(batch))
        cadence.after_step(step, epoch=epoch)

    # ---- final evaluation and Hugging Face export
    summary = cadence.finish({"stage": "sft", "train_examples": len(train), "format": fmt})
    if "eval" in summary:
        summary["eval_loss"] = summary["eval"]["loss"]
    return cadence.save_model(tokenizer, summary)
