"""Reward model: Bradley-Terry pairwise loss on a causal-LM backbone with a scalar head.

    posttrain reward model.path=DIR data.path=PREFS output_dir=OUT max_steps=200

For every optimizer step: score chosen and rejected of each pair in one forward pass, take
``-log sigma(r_chosen - r_rejected - margin)`` (plus the optional centering term), step. Pairwise
accuracy and mean margin on the eval split are logged on ``eval_steps``. At the end the mean and
std of rewards on a reference set are stored with the model (``config.json`` and
``reward_stats.json``) and the model is written as an ``AutoModelForSequenceClassification``
directory (``num_labels=1``) at the root of ``output_dir``.

Data: preference rows in any form ``prepare`` produces (plain or conversational, explicit or
implicit prompt); an optional numeric ``margin`` column is the per-pair loss margin.

A ``model.path`` that is a CLIP-like dual encoder trains a multimodal reward model instead: the same loop
and loss on rows with an ``images`` column, scoring each completion by its similarity with the prompt's
images (:mod:`trainer_lib.models.dual_encoder`); it is saved as the dual encoder, for ``reward.clip_path``.

``objective=process`` trains a process reward model on step-labelled rows instead, scored at each step's
end token (:mod:`trainer_lib.stages.training.prm`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainer_lib.config import TrainingConfig, opt
from trainer_lib.data.step_labels import STEP_JOIN, STEP_SEPARATOR
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.loop.micro_batches import SplitBatches, TrainOrder


@dataclass
class RewardConfig(TrainingConfig):
    center_rewards_coefficient: float = opt(0.0, "Weight of the centering term (r_chosen + r_rejected)^2; 0: off.")
    reference_set: str = opt("eval", "Split for the stored reward mean/std; train if eval is empty.", ("eval", "train"))
    normalize_max_rows: int = opt(1000, "At most this many pairs (both answers) for the reward mean/std; 0: all.")
    objective: str = opt(
        "pairwise",
        "pairwise: a Bradley-Terry reward model on preference pairs; process: a process reward model (PRM) on "
        "step-labelled rows (prompt, completions: [steps], labels), scored at each step's last token.",
        ("pairwise", "process"),
    )
    step_join: str = opt(STEP_JOIN, "process: the text put after the prompt and after each step when training.")
    step_separator: str = opt(
        STEP_SEPARATOR,
        "process: regular expression splitting a generated text into steps (default: blank lines, or a line "
        "starting 'Step k:'); stored with the PRM in prm.json.",
    )

    def validate(self) -> None:
        super().validate()
        if self.objective == "process":
            import re

            try:
                re.compile(self.step_separator)
            except re.error as exc:
                raise ConfigError(f"step_separator: not a regular expression ({exc})") from None
            if not self.step_join or re.fullmatch(self.step_separator, self.step_join) is None:
                raise ConfigError(
                    f"step_join: {self.step_join!r} must be a separator that step_separator matches, so the "
                    "steps the PRM was trained on are found again in generated text"
                )
        if self.center_rewards_coefficient < 0:
            raise ConfigError(f"center_rewards_coefficient: expected >= 0, got {self.center_rewards_coefficient}")
        if self.normalize_max_rows < 0:
            raise ConfigError(f"normalize_max_rows: expected >= 0, got {self.normalize_max_rows}")


CONFIG = RewardConfig

METRICS = ("loss", "accuracy", "margin", "rewards/chosen", "rewards/rejected")


def pair_rewards(engine, batch: dict, device):
    """(chosen rewards, rejected rewards), each ``(B,)``, from ONE forward pass over ``2B`` rows (and, for a
    dual encoder, the rows' images)."""
    from trainer_lib.data.preference_batches import model_inputs, split_halves
    from trainer_lib.models.heads import sequence_rewards

    if "pixel_values" in batch:
        from trainer_lib.models.dual_encoder import pair_scores

        return pair_scores(engine, batch, device)
    return split_halves(sequence_rewards(engine, model_inputs(batch, device)))


def pair_losses(engine, batch: dict, device):
    """(Bradley-Terry loss per pair, chosen rewards, rejected rewards); the batch's ``margin`` if any."""
    from trainer_lib.losses import pairwise_reward_loss

    chosen, rejected = pair_rewards(engine, batch, device)
    margin = batch["margin"].to(chosen.device) if "margin" in batch else None
    return pairwise_reward_loss(chosen, rejected, margin), chosen, rejected


def pair_metrics(losses, chosen, rejected) -> dict:
    """Per-pair metric values (1-D tensors, no gradient) of a batch."""
    losses, chosen, rejected = losses.detach(), chosen.detach(), rejected.detach()
    return {
        "loss": losses,
        "accuracy": (chosen > rejected).float(),
        "margin": chosen - rejected,
        "rewards/chosen": chosen,
        "rewards/rejected": rejected,
    }


def load_data(cfg: RewardConfig, tokenizer) -> tuple[SplitBatches, SplitBatches, str]:
    """``(train, eval, format)``: preference pairs tokenized as prompt + completion (ending in eos), cached
    as memory-mapped Arrow, in micro-batches of ``batch_size`` pairs."""
    from trainer_lib.data.dataset import training_data
    from trainer_lib.data.preference_batches import PAIRED_FORMATS, collate_pairs
    from trainer_lib.data.tokenize import micro_batches
    from trainer_lib.data.tokenized import tokenize_train_eval

    data = training_data(
        cfg.data, cfg.seed, allowed_formats=PAIRED_FORMATS, tokenizer=tokenizer, stage="the reward stage"
    )
    train, evals = tokenize_train_eval(data, "pairs", tokenizer, cfg.data)
    if not len(train):
        raise UserError(f"data.path: {cfg.data.path} has no preference pairs to train on")

    # data.packing: a micro-batch's 2B sequences as one padding-free row, scored at each sequence's end
    # (models/heads.py); never for remote modelling code, whose attention may not honour position_ids
    packed = cfg.data.packing and not cfg.model.trust_remote_code

    def collate(examples):
        return collate_pairs(examples, tokenizer.pad_token_id, packed=packed)

    return (
        SplitBatches(train, micro_batches(train, cfg.batch_size, cfg.data.max_length, packing=False), collate),
        SplitBatches(evals, micro_batches(evals, cfg.eval_batch_size, cfg.data.max_length, packing=False), collate),
        data.format,
    )


def load_image_pairs(cfg: RewardConfig, processor) -> tuple[SplitBatches, SplitBatches, str]:
    """:func:`load_data` for a dual encoder: each pair's two completion texts and its prompt's images, in
    micro-batches of ``batch_size`` pairs (no tokenized cache: texts are short, images load per batch)."""
    from trainer_lib.data.dataset import training_data
    from trainer_lib.data.preference_batches import PAIRED_FORMATS
    from trainer_lib.models.dual_encoder import collate_pairs, encode_pairs, text_limit
    from trainer_lib.models.load import resolve_model_path

    data = training_data(cfg.data, cfg.seed, allowed_formats=PAIRED_FORMATS, stage="the reward stage")
    limit = text_limit(resolve_model_path(cfg.model.path, "model.path"), processor.tokenizer)
    train, evals = (encode_pairs(data.splits[name], processor, limit) for name in ("train", "eval"))
    if not train:
        raise UserError(f"data.path: {cfg.data.path} has no preference pairs to train on")

    def collate(examples):
        return collate_pairs(examples, processor, limit)

    def groups(rows: list, size: int) -> list[list[int]]:
        return [list(range(start, min(start + size, len(rows)))) for start in range(0, len(rows), size)]

    return (
        SplitBatches(train, groups(train, cfg.batch_size), collate),
        SplitBatches(evals, groups(evals, cfg.eval_batch_size), collate),
        data.format,
    )


def evaluate(engine, strategy, evals: SplitBatches) -> dict:
    """Mean loss, pairwise accuracy, margin and rewards over ``evals`` (sharded across ranks)."""

    def sums(group: list[int]) -> dict:
        losses, chosen, rejected = pair_losses(engine, evals.collated(group), strategy.device)
        return {key: float(values.sum()) for key, values in pair_metrics(losses, chosen, rejected).items()} | {
            "count": float(len(group))
        }

    totals = strategy.sharded_sums(evals.groups, sums, dict.fromkeys((*METRICS, "count"), 0.0), models=(engine,))
    return {k: totals[k] / max(totals["count"], 1) for k in METRICS}


def reference_batches(cfg: RewardConfig, train: SplitBatches, evals: SplitBatches) -> tuple[SplitBatches, str]:
    """``(batches, "eval" | "train")``: the pairs the stored reward mean/std come from, ``reference_set`` (train
    when eval is empty), at most ``normalize_max_rows`` of them."""
    from trainer_lib.data.tokenize import micro_batches

    use_eval = cfg.reference_set == "eval" and len(evals.examples)
    reference, name = (evals.examples, "eval") if use_eval else (train.examples, "train")
    if cfg.normalize_max_rows:
        kept = range(min(len(reference), cfg.normalize_max_rows))
        reference = reference.select(kept) if hasattr(reference, "select") else [reference[i] for i in kept]
    if isinstance(reference, list):  # a dual encoder's pairs: in order, eval_batch_size at a time
        groups = [
            list(range(i, min(i + cfg.eval_batch_size, len(reference))))
            for i in range(0, len(reference), cfg.eval_batch_size)
        ]
        return SplitBatches(reference, groups, train.collate), name
    groups = micro_batches(reference, cfg.eval_batch_size, cfg.data.max_length, packing=False)
    return SplitBatches(reference, groups, train.collate), name


def reward_statistics(engine, strategy, batches: SplitBatches) -> dict:
    """Mean and std of the rewards of every completion (chosen and rejected) in ``batches``."""
    import math

    import torch

    def sums(group: list[int]) -> dict:
        rewards = torch.cat(pair_rewards(engine, batches.collated(group), strategy.device)).double()
        return {"total": float(rewards.sum()), "squares": float((rewards**2).sum()), "count": float(rewards.numel())}

    totals = strategy.sharded_sums(batches.groups, sums, {"total": 0.0, "squares": 0.0, "count": 0.0}, models=(engine,))
    mean = totals["total"] / max(totals["count"], 1)
    var = max(totals["squares"] / max(totals["count"], 1) - mean**2, 0.0)
    return {"reward_mean": mean, "reward_std": math.sqrt(var), "count": int(totals["count"])}


def run(cfg: RewardConfig) -> dict:
    if cfg.objective == "process":
        from trainer_lib.stages.training import prm

        return prm.run(cfg)
    from trainer_lib.data.tokenize import count_tokens
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.losses import reward_centering_penalty
    from trainer_lib.models import dual_encoder
    from trainer_lib.models.heads import STATS_FILE, apply_reward_lora, load_reward_model, store_stats
    from trainer_lib.models.load import load_tokenizer, resolve_model_path

    resolve_batch_size(cfg, sequences_per_row=2)  # a chosen and a rejected sequence per pair
    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed, parallel=cfg.parallel)
    strategy.setup_distributed()

    # ---- data, and the order training takes its micro-batches in
    dual = dual_encoder.is_dual_encoder(resolve_model_path(cfg.model.path, "model.path"))
    if dual:  # a multimodal reward model: a dual encoder on image + text pairs
        tokenizer = dual_encoder.load_processor(resolve_model_path(cfg.model.path, "model.path"))
        train, evals, fmt = load_image_pairs(cfg, tokenizer)
    else:
        tokenizer = load_tokenizer(cfg.model)
        train, evals, fmt = load_data(cfg, tokenizer)
    order = TrainOrder(cfg, train, strategy.data_world_size, strategy.data_rank)

    # ---- model: backbone + scalar head (LoRA keeps the head fully trainable), or the dual encoder
    if dual:
        model = dual_encoder.load_for_training(cfg, placement=strategy.placement())
    else:
        model = load_reward_model(
            cfg.model, tokenizer.pad_token_id, cfg.engine.precision, placement=strategy.placement()
        )
        model = apply_reward_lora(model, cfg.lora)
    engine = strategy.prepare(model, total_steps=order.steps, **cfg.optimizer_args())
    evaluation = (lambda: evaluate(engine, strategy, evals)) if len(evals.examples) else None
    cadence = Cadence(cfg, strategy, "reward", order.steps, engine, evaluate=evaluation, window_keys=METRICS)
    cadence.restore(
        f"{len(train.examples)} train / {len(evals.examples)} eval pairs ({fmt}), {len(train.groups)} micro-batches"
    )

    # ---- the loop
    for step in cadence.steps():
        for ids, batch in order.micro_batches(step):
            losses, chosen, rejected = pair_losses(engine, batch, strategy.device)
            loss = losses.mean()
            if cfg.center_rewards_coefficient:
                loss = loss + cfg.center_rewards_coefficient * reward_centering_penalty(chosen, rejected).mean()
            strategy.backward(loss, engine)
            strategy.optimizer_step(engine)
            cadence.window.add_all(pair_metrics(losses, chosen, rejected))
            cadence.window.count(samples=len(ids), tokens=count_tokens(batch))
        cadence.after_step(step, epoch=order.epoch(step))

    # ---- final evaluation, reward statistics, Hugging Face export
    summary = cadence.finish({"stage": "reward", "train_pairs": len(train.examples), "format": fmt})
    reference, reference_name = reference_batches(cfg, train, evals)
    stats = reward_statistics(engine, strategy, reference) | {"reference_set": reference_name}
    summary["reward_stats"] = stats
    store_stats(strategy.unwrap(engine), stats)
    return cadence.save_model(tokenizer, summary, extra_files={STATS_FILE: json.dumps(stats, indent=2)})
