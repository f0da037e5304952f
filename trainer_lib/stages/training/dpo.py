"""Preference optimization: DPO and its variants (IPO, hinge/SLiC, robust DPO, SimPO, KTO).

    posttrain dpo model.path=SFT_DIR data.path=PREFS output_dir=OUT loss=sigmoid beta=0.1

Every step: one forward pass of the policy over chosen and rejected together (``2B`` sequences, one
padding-free packed row with ``data.packing``, the default; padded rows otherwise), the
reference's log-probs for the same rows (a frozen model, a precomputed table, or the LoRA policy
with its adapters disabled), the configured loss (picked once at setup by :func:`select_objective`),
backward, step. Log-probs are summed over completion tokens (SimPO averages them). KTO trains on
unpaired rows (``prompt``/``completion``/``label``; pairs are split into a desirable and an
undesirable row) and takes its KL reference point from mismatched prompt/completion pairs. With
``beta_alpha`` or ``beta_filter`` the sigmoid loss trains as beta-DPO (:class:`DynamicBetaDPO`: a
beta per micro-batch from its margins, margin-guided filtering, running statistics in checkpoints).

Metrics (train and eval): ``loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracy`` (implicit reward ``beta * (log pi - log pi_ref)`` of chosen above rejected),
``logps/chosen``, ``logps/rejected`` and ``logps/accuracy`` (policy log-prob of chosen above
rejected: at step 0 this is the starting model's held-out preference accuracy). beta-DPO's train
records add ``beta``, ``beta/kept`` and ``beta/margin_mean``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import TrainingConfig, opt
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.loop.micro_batches import SplitBatches, TrainOrder

LOSSES = ("sigmoid", "ipo", "hinge", "robust", "simpo", "kto")
REFERENCES = ("auto", "model", "precomputed", "adapter")


@dataclass
class DPOConfig(TrainingConfig):
    loss: str = opt("sigmoid", "Preference loss; simpo needs no reference, kto takes unpaired rows.", LOSSES)
    beta: float = opt(0.1, "Inverse temperature of the implicit reward (IPO: tau). SimPO wants ~2-2.5.")
    label_smoothing: float = opt(0.0, "Assumed label-flip rate eps for sigmoid (cDPO) and robust (0 <= eps < 0.5).")
    simpo_gamma: float = opt(1.0, "SimPO target reward margin gamma.")
    rpo_alpha: float = opt(0.0, "Weight of an NLL term that keeps chosen answers likely (RPO); 0: off; not with kto.")
    kto_desirable_weight: float = opt(1.0, "KTO lambda_D, weight of desirable completions.")
    kto_undesirable_weight: float = opt(1.0, "KTO lambda_U, weight of undesirable completions.")
    beta_alpha: float = opt(
        0.0, "beta-DPO: beta per batch = beta*(1 + beta_alpha*(batch margin - running mean)); 0: fixed beta."
    )
    beta_momentum: float = opt(0.9, "beta-DPO: momentum of the running mean and std of the log-ratio margin.")
    beta_filter: float = opt(
        0.0, "beta-DPO: share of each batch's pairs dropped, sampled by a Gaussian around the running margin."
    )
    reference: str = opt("auto", "Reference: frozen model, cached table, LoRA off; auto: docs/training.md.", REFERENCES)
    reference_model_path: str | None = opt(None, "Reference model; default model.path.")
    reference_logps_path: str | None = opt(None, "Precomputed log-probs' cache; default <output_dir>/reference_logps.")

    MODEL_PARALLEL = ("tensor", "pipeline", "sequence")

    def reference_mode(self, whole_epoch: bool = False) -> str:
        """``whole_epoch``: the run trains on every train row at least once. Then ``auto`` precomputes a
        paired loss's reference (each row's log-probs once, instead of a forward per row, epoch and
        evaluation; no reference model in memory while training). KTO's KL completions depend on
        which rows share a micro-batch, so they are never precomputed by ``auto``."""
        if self.loss == "simpo":
            return "none"
        if self.reference == "auto" and self.parallel.pipeline > 1:  # the pipeline computes it once, up front
            return "precomputed"
        if self.reference == "auto":
            if whole_epoch and self.loss != "kto":
                return "precomputed"
            return "adapter" if self.lora.r > 0 else "model"
        return self.reference

    def validate(self) -> None:
        super().validate()
        if not self.beta > 0:
            raise ConfigError(f"beta: expected a positive number, got {self.beta}")
        if self.label_smoothing and self.loss not in ("sigmoid", "robust"):
            raise ConfigError(f"label_smoothing: only used by loss=sigmoid or loss=robust, not loss={self.loss}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"label_smoothing: expected 0 <= x < 0.5, got {self.label_smoothing}")
        if self.rpo_alpha < 0 or (self.rpo_alpha and self.loss == "kto"):
            raise ConfigError(
                f"rpo_alpha: expected >= 0 with a paired loss (not kto), got {self.rpo_alpha} with loss={self.loss}"
            )
        if (self.beta_alpha or self.beta_filter) and self.loss != "sigmoid":
            raise ConfigError(f"beta_alpha/beta_filter: beta-DPO needs loss=sigmoid, not loss={self.loss}")
        if not (self.beta_alpha >= 0 and 0.0 <= self.beta_momentum < 1.0 and 0.0 <= self.beta_filter < 1.0):
            raise ConfigError("beta_alpha >= 0, 0 <= beta_momentum < 1 and 0 <= beta_filter < 1 expected")
        if min(self.kto_desirable_weight, self.kto_undesirable_weight) < 0:
            raise ConfigError("kto_desirable_weight/kto_undesirable_weight: expected >= 0")
        uses_base = self.reference_model_path in (None, self.model.path)
        if self.parallel.pipeline > 1:
            self.check_pipeline(uses_base)
        if self.reference_mode() == "adapter" and (self.lora.r == 0 or not uses_base):
            raise ConfigError(
                "reference: 'adapter' needs lora.r > 0 and the reference to be model.path "
                "(set reference=model for another reference model)"
            )

    def check_pipeline(self, uses_base: bool) -> None:
        """Under ``parallel.pipeline > 1`` the policy is the only model: paired losses, the reference
        precomputed with it before training (so the starting model), no loss that reduces across ranks."""
        why = None
        if self.loss == "kto":
            why = "loss=kto (its KL reference point pairs rows across the micro-batch)"
        elif self.beta_alpha or self.beta_filter:
            why = "beta-DPO (beta_alpha, beta_filter: its batch statistics are reduced across ranks mid-step)"
        elif self.reference_mode() in ("model", "adapter") or not uses_base:
            why = "a reference other than the starting model, precomputed (reference=auto or precomputed)"
        if why:
            raise ConfigError(f"parallel.pipeline={self.parallel.pipeline}: not with {why}; docs/parallelism.md")


CONFIG = DPOConfig


# --------------------------------------------------------------------------- objectives and metrics


def select_objective(cfg: DPOConfig) -> Callable:
    """The configured loss as ``objective(policy, reference, batch) -> (B,)``, chosen once."""
    from trainer_lib.data.preference_batches import average_logps
    from trainer_lib.losses import (
        dpo_sigmoid_loss,
        hinge_loss,
        ipo_loss,
        kto_loss,
        kto_reference_point,
        robust_dpo_loss,
        simpo_loss,
    )

    beta, eps = cfg.beta, cfg.label_smoothing
    objectives = {
        "sigmoid": lambda p, r, b: dpo_sigmoid_loss(p.chosen, p.rejected, r.chosen, r.rejected, beta, eps),
        "ipo": lambda p, r, b: ipo_loss(p.chosen, p.rejected, r.chosen, r.rejected, beta),
        "hinge": lambda p, r, b: hinge_loss(p.chosen, p.rejected, r.chosen, r.rejected, beta),
        "robust": lambda p, r, b: robust_dpo_loss(p.chosen, p.rejected, r.chosen, r.rejected, beta, eps),
        "simpo": lambda p, r, b: simpo_loss(
            average_logps(p.chosen, p.chosen_tokens),
            average_logps(p.rejected, p.rejected_tokens),
            beta,
            cfg.simpo_gamma,
        ),
        # KTO halves: completion, mismatched KL completion (see trainer_lib.data.preference_batches)
        "kto": lambda p, r, b: kto_loss(
            p.chosen,
            r.chosen,
            b["label"].to(p.chosen.device),
            kto_reference_point(p.rejected, r.rejected),
            beta,
            cfg.kto_desirable_weight,
            cfg.kto_undesirable_weight,
        ),
    }
    return with_rpo(objectives[cfg.loss], cfg.rpo_alpha)


def with_rpo(objective: Callable, alpha: float) -> Callable:
    """``objective`` plus RPO's NLL term on the chosen answer at weight ``alpha`` (0: ``objective`` itself)."""
    from trainer_lib.losses import rpo_nll_term

    if not alpha:
        return objective
    return lambda p, r, b: objective(p, r, b) + alpha * rpo_nll_term(p.chosen, p.chosen_tokens)


class DynamicBetaDPO:
    """beta-DPO's training loss and the running statistics it keeps (Wu et al. 2024; the math is in
    :func:`trainer_lib.losses.beta_dpo_loss`).

    Per micro-batch: the log-ratio margins ``M_i`` update the running mean ``M_0`` and std ``sigma``
    (``x <- m * x + (1 - m) * batch value``, averaged over ranks so every rank holds the same numbers),
    the filter keeps ``1 - beta_filter`` of the pairs (drawn by a generator seeded from ``seed`` and
    the update count, so a resumed run draws the same ones), and the loss uses the batch's beta.
    ``state_dict``/``load_state_dict`` carry the statistics across a checkpoint. Evaluation uses the
    fixed ``beta`` (a yardstick that does not move with training) and leaves the statistics alone.
    """

    def __init__(self, beta, alpha, momentum, filter_ratio, label_smoothing, seed, reduce=lambda values: values):
        self.beta, self.alpha, self.momentum, self.filter_ratio = beta, alpha, momentum, filter_ratio
        self.label_smoothing, self.seed, self.reduce = label_smoothing, seed, reduce
        self.margin_mean, self.margin_std, self.updates = 0.0, 0.0, 0
        self.last_beta, self.last_kept = float(beta), 1.0

    @classmethod
    def from_config(cls, cfg: DPOConfig, reduce) -> DynamicBetaDPO | None:
        """The objective for ``cfg``'s beta-DPO keys, or None when they are off (plain DPO)."""
        if not (cfg.beta_alpha or cfg.beta_filter):
            return None
        return cls(cfg.beta, cfg.beta_alpha, cfg.beta_momentum, cfg.beta_filter, cfg.label_smoothing, cfg.seed, reduce)

    def __call__(self, policy, reference, batch):
        import torch

        from trainer_lib.losses import beta_dpo_loss, margin_filter_mask

        margins = ((policy.chosen - reference.chosen) - (policy.rejected - reference.rejected)).detach()
        batch_stats = self.reduce({"mean": margins.mean(), "std": margins.std(correction=0)})
        m = self.momentum
        self.margin_mean = m * self.margin_mean + (1.0 - m) * float(batch_stats["mean"])
        self.margin_std = m * self.margin_std + (1.0 - m) * float(batch_stats["std"])
        keep = None
        if self.filter_ratio:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.updates)
            keep = margin_filter_mask(margins, self.margin_mean, self.margin_std, self.filter_ratio, generator)
        self.updates += 1
        losses, beta_batch = beta_dpo_loss(
            policy.chosen,
            policy.rejected,
            reference.chosen,
            reference.rejected,
            self.beta,
            self.alpha,
            self.margin_mean,
            keep,
            self.label_smoothing,
        )
        self.last_beta = float(beta_batch)
        self.last_kept = 1.0 if keep is None else float(keep.float().mean())
        return losses

    def log_values(self) -> dict:
        """Keys for each train log record: the last micro-batch's beta and kept share, the running mean."""
        return {"beta": self.last_beta, "beta/kept": self.last_kept, "beta/margin_mean": self.margin_mean}

    def state_dict(self) -> dict:
        return {"margin_mean": self.margin_mean, "margin_std": self.margin_std, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.margin_mean, self.margin_std = float(state["margin_mean"]), float(state["margin_std"])
        self.updates = int(state["updates"])


#: metric keys of paired (preference) and unpaired (KTO) batches
METRICS = {
    "paired": (
        "loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracy",
        "logps/chosen",
        "logps/rejected",
        "logps/accuracy",
    ),
    "unpaired": ("loss", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected", "kl"),
}


def batch_metrics(kind: str, policy, reference, beta: float, batch: dict) -> dict:
    """Per-example metric values (1-D tensors) of a batch; rewards are DPO's implicit rewards
    ``beta * (log pi - log pi_ref)`` (reference-free SimPO: ``beta * mean token log pi``)."""
    from trainer_lib.data.preference_batches import average_logps

    if reference is None:
        chosen = beta * average_logps(policy.chosen, policy.chosen_tokens)
        rejected = beta * average_logps(policy.rejected, policy.rejected_tokens)
    else:
        chosen = beta * (policy.chosen - reference.chosen)
        rejected = beta * (policy.rejected - reference.rejected)
    if kind == "paired":
        return {
            "rewards/chosen": chosen,
            "rewards/rejected": rejected,
            "rewards/margins": chosen - rejected,
            "rewards/accuracy": (chosen > rejected).float(),
            "logps/chosen": policy.chosen,
            "logps/rejected": policy.rejected,
            "logps/accuracy": (policy.chosen > policy.rejected).float(),
        }
    label = batch["label"].to(chosen.device)
    kl = (policy.rejected - reference.rejected).mean(0, keepdim=True)
    return {
        "rewards/chosen": chosen[label],
        "rewards/rejected": chosen[~label],
        "logps/chosen": policy.chosen[label],
        "logps/rejected": policy.chosen[~label],
        "kl": kl,
    }


def pair_samples(last: tuple[list[int], dict], examples: list[dict], tokenizer) -> list[dict]:
    """``samples.jsonl`` rows (:mod:`trainer_lib.loop.samples`) of the pairs of a step's last micro-batch: the
    texts and the policy's implicit rewards of chosen and rejected (:func:`batch_metrics`)."""
    ids, values = last
    chosen, rejected = values.get("rewards/chosen"), values.get("rewards/rejected")
    if chosen is None or rejected is None:
        return []
    chosen, rejected = chosen.detach().float().cpu().tolist(), rejected.detach().float().cpu().tolist()
    rows = []
    for i, index in enumerate(ids[: len(chosen)]):
        example = examples[index]
        rows.append(
            {
                "kind": "pair",
                "prompt": tokenizer.decode(example["prompt_ids"], skip_special_tokens=True),
                "chosen": tokenizer.decode(example["chosen_ids"], skip_special_tokens=True),
                "rejected": tokenizer.decode(example["rejected_ids"], skip_special_tokens=True),
                "chosen_reward": chosen[i],
                "rejected_reward": rejected[i],
                "margin": chosen[i] - rejected[i],
            }
        )
    return rows


# --------------------------------------------------------------------------- data


@dataclass
class Split(SplitBatches):
    kind: str  # "paired", or "unpaired" (KTO's rows, each with a mismatched KL completion)


def build_splits(cfg: DPOConfig, tokenizer) -> tuple[dict, str]:
    """``({"train": Split, "eval": Split?, "eval_unpaired": Split?}, format)``.

    Paired losses train on pairs; KTO on unpaired rows (pairs are split into two). Paired eval
    data is always evaluated as pairs (preference accuracy); under KTO also as unpaired rows (loss).
    """
    from trainer_lib.data import preference_batches as pref
    from trainer_lib.data.dataset import training_data
    from trainer_lib.data.tokenize import micro_batches
    from trainer_lib.data.tokenized import tokenize_train_eval
    from trainer_lib.data.vision_tokenize import with_pair_images
    from trainer_lib.models.load import load_processor

    kto = cfg.loss == "kto"
    allowed = pref.PAIRED_FORMATS + (pref.UNPAIRED_FORMATS if kto else ())
    data = training_data(
        cfg.data,
        cfg.seed,
        allowed_formats=allowed,
        tokenizer=tokenizer,
        stage=f"dpo loss={cfg.loss}" + ("" if kto else " (unpaired data needs loss=kto)"),
    )
    max_len, pad = cfg.data.max_length, tokenizer.pad_token_id
    paired = data.format in pref.PAIRED_FORMATS
    processor = load_processor(cfg.model, tokenizer)  # a vision-language model's; None for a text model
    if processor is not None and kto:
        raise UserError("loss=kto: not supported for vision-language models yet; use a paired loss (sigmoid, ...)")

    def unpaired(examples: list[dict], seed: int) -> list[dict]:
        return pref.assign_kl_completions(pref.unpair(examples) if paired else examples, seed, max_len)

    # data.packing: a micro-batch's 2B sequences as one padding-free row (models/attention.py attends
    # each on its own); never for remote modelling code, whose attention may not honour position_ids.
    packed = cfg.data.packing and not cfg.model.trust_remote_code

    def split(kind: str, examples: list[dict], batch_size: int) -> Split:
        collate = pref.collate_pairs if kind == "paired" else pref.collate_unpaired
        groups = micro_batches(examples, batch_size, max_len, packing=False)

        def collated(rows: list[dict]) -> dict:
            return collate(rows, pad, packed=packed)

        return Split(examples, groups, collated if processor is None else with_pair_images(collated, processor), kind)

    # tokenized by data.num_workers processes and cached; the examples are then lists (KTO pairs them up)
    kind = ("pairs" if processor is None else "pairs_images") if paired else "unpaired"
    train, evals = (ds.to_list() for ds in tokenize_train_eval(data, kind, processor or tokenizer, cfg.data))
    if not train:
        raise UserError(f"data.path: {cfg.data.path} has no rows to train on")
    sets = {
        "train": split("unpaired", unpaired(train, cfg.seed), cfg.batch_size)
        if kto
        else split("paired", train, cfg.batch_size)
    }
    if evals and paired:
        sets["eval"] = split("paired", evals, cfg.eval_batch_size)
    if evals and kto:
        sets["eval_unpaired"] = split("unpaired", unpaired(evals, cfg.seed + 1), cfg.eval_batch_size)
    return sets, data.format


def evaluate(steps, strategy, name: str, split: Split, reference, objective, cfg: DPOConfig) -> dict:
    """Mean metrics over one eval split (sharded across ranks); the loss where it applies."""
    from trainer_lib.loop.metrics import means_of, sums_and_counts

    with_loss = split.kind == ("unpaired" if cfg.loss == "kto" else "paired")
    keys = METRICS[split.kind]

    def sums(group: list[int]) -> dict:
        batch = split.collated(group)
        policy = steps.logps(batch)
        ref = reference(name, group, batch) if reference is not None else None
        values = batch_metrics(split.kind, policy, ref, cfg.beta, batch)
        if with_loss:
            values["loss"] = objective(policy, ref, batch)
        return sums_and_counts(values)

    zeros = {f"{k}{suffix}": 0.0 for k in keys for suffix in ("", "#n")}
    return means_of(strategy.sharded_sums(split.groups, sums, zeros, models=(steps.engine,)), keys)


def evaluate_all(steps, strategy, sets: dict, reference, objective, cfg: DPOConfig) -> dict:
    metrics = {}
    for name in ("eval", "eval_unpaired"):
        if name in sets:
            result = evaluate(steps, strategy, name, sets[name], reference, objective, cfg)
            if name == "eval_unpaired" and "eval" in sets:  # KTO on pairs: its loss and KL only
                result = {k: result[k] for k in ("loss", "kl") if k in result}
            metrics.update(result)
    return metrics


# --------------------------------------------------------------------------- reference


def build_reference(cfg: DPOConfig, strategy, steps, sets: dict, mode: str) -> tuple[Callable | None, str | None]:
    """``(reference, status)`` for ``mode`` (``cfg.reference_mode()``): a frozen model, the LoRA policy with its
    adapters disabled, a precomputed table (status "loaded" or "computed"), or None (SimPO is reference-free)."""
    from trainer_lib.models.load import load_causal_lm
    from trainer_lib.models.reference import (
        AdapterReference,
        FrozenModelReference,
        StartingPolicyReference,
        precomputed_reference,
    )

    def frozen_model():
        key = "reference_model_path" if cfg.reference_model_path else "model.path"
        path = cfg.reference_model_path or cfg.model.path
        model = load_causal_lm(cfg.model, cfg.engine.precision, path, strategy.placement(train=False), key)
        return FrozenModelReference(strategy.prepare_frozen(model), strategy.device, strategy.sequence_shards())

    def live():  # what a precomputed table is computed with, once, before the policy's first step (or resume)
        if strategy.is_pipeline(steps.engine):  # the policy before its first step (DPOConfig.check_pipeline)
            return lambda split, ids, batch: steps.logps(batch)
        if cfg.reference_model_path not in (None, cfg.model.path):
            return frozen_model()
        # the reference is the starting model: the policy itself (its base weights under LoRA), not a second copy
        starting = AdapterReference if cfg.lora.r > 0 else StartingPolicyReference
        return starting(steps.engine, strategy, strategy.sequence_shards())

    if mode == "model":
        return frozen_model(), None
    if mode == "adapter":
        return AdapterReference(steps.engine, strategy, strategy.sequence_shards()), None
    if mode == "precomputed":
        directory = cfg.reference_logps_path or storage.join(cfg.output_dir, "reference_logps")
        identity = [cfg.reference_model_path or cfg.model.path, cfg.engine.precision]
        return precomputed_reference(sets, strategy, live, directory, identity, cfg.eval_batch_size)
    return None, None


# --------------------------------------------------------------------------- run


def run(cfg: DPOConfig) -> dict:
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.models.load import apply_lora, load_causal_lm, load_tokenizer
    from trainer_lib.stages.training.dpo_steps import MicroBatchSteps, PipelineSteps

    resolve_batch_size(cfg, sequences_per_row=2)  # a chosen and a rejected sequence per pair
    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed, parallel=cfg.parallel)
    strategy.setup_distributed()

    # ---- data, and the order training takes its micro-batches in
    tokenizer = load_tokenizer(cfg.model)
    sets, fmt = build_splits(cfg, tokenizer)
    train = sets["train"]
    order = TrainOrder(cfg, train, strategy.data_world_size, strategy.data_rank)
    objective = select_objective(cfg)  # evaluation's, and training's unless beta-DPO's keys are set
    dynamic = DynamicBetaDPO.from_config(cfg, strategy.all_reduce)
    train_objective = objective if dynamic is None else with_rpo(dynamic, cfg.rpo_alpha)

    # ---- policy engine
    model = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision, placement=strategy.placement()), cfg.lora)
    engine = strategy.prepare(strategy.pipelined(model), total_steps=order.steps, **cfg.optimizer_args())
    steps = (PipelineSteps if strategy.is_pipeline(engine) else MicroBatchSteps)(
        engine,
        strategy,
        train_objective,
        lambda policy, ref, batch: batch_metrics(train.kind, policy, ref, cfg.beta, batch),
    )
    evaluation = (lambda: evaluate_all(steps, strategy, sets, reference, objective, cfg)) if len(sets) > 1 else None
    cadence = Cadence(
        cfg,
        strategy,
        "dpo",
        order.steps,
        engine,
        evaluate=evaluation,
        window_keys=METRICS[train.kind],
        stateful={"dynamic_beta": dynamic} if dynamic is not None else None,
        log_extra=dynamic.log_values if dynamic is not None else None,
    )

    # ---- reference (before the step-0 evaluation, which uses it)
    mode = cfg.reference_mode(whole_epoch=order.covers_epoch())
    reference, status = build_reference(cfg, strategy, steps, sets, mode)
    cadence.restore(
        f"loss={cfg.loss}, reference={mode}, {len(train.examples)} train examples ({fmt}), "
        f"{len(train.groups)} micro-batches"
    )

    # ---- the loop
    for step in cadence.steps():
        steps.train(order.micro_batches(step), reference, cadence.window)
        if train.kind == "paired":
            cadence.log_samples(step, lambda: pair_samples(steps.last, train.examples, tokenizer))
        cadence.after_step(step, epoch=order.epoch(step))

    # ---- final evaluation and Hugging Face export (LoRA merged)
    summary = cadence.finish(
        {"stage": "dpo", "loss": cfg.loss, "reference": mode, "train_examples": len(train.examples), "format": fmt}
    )
    if status:
        summary["reference_logps"] = status
    return cadence.save_model(tokenizer, summary)
