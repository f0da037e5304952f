"""Online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback"): DPO on pairs the
current policy samples and a judge ranks, every step.

    posttrain online-dpo model.path=SFT data.path=PROMPTS output_dir=OUT reward.functions=accuracy_reward

Every step takes ``prompts_per_step`` prompts (a pure function of seed and step, as GRPO's), samples
``rollout.n`` completions of each with the current policy, and scores them with the configured reward
sources: reward functions, a reward model, an LLM judge, a PRM (the judge of the paper's Algorithm 1). The
best and the worst completion of a prompt form its pair, ``y_w`` and ``y_l``, ranked by the weighted sum of
the sources (before ``reward.normalize`` and ``reward.clip``). A prompt whose best and worst rewards differ
by ``min_reward_gap`` or less is a tie: it gives no pair, and is counted. The DPO loss of ``loss`` (the
paired losses of ``posttrain dpo``, :func:`trainer_lib.stages.training.dpo.select_objective`) is then taken
on the pairs against the frozen reference, and the policy takes one optimizer step:

    h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]
    L = mean over the step's pairs of -log sigma(beta * h)                     (loss=sigmoid)

Log-probs are the policy's own (temperature 1, summed over completion tokens), whatever
``rollout.temperature`` sampled with. A tied prompt's pair still goes through the forward pass with weight 0,
so every rank runs the same micro-batches (the engine's accumulation stays fixed); a step where every prompt
on every rank ties takes no optimizer step at all.

What this file calls rather than repeats: the prompt schedule, sampling and scoring
(:func:`trainer_lib.rl.experience.sample_and_score`), the policy, reference and reward sources in either
layout (:func:`trainer_lib.rl.actor_critic.build_models`: a frozen reference, or the LoRA policy with its
adapters disabled, or ``multi_adapter``), the held-out greedy reward, DPO's objectives and metrics, and the
cadence (log, eval, checkpoints, exact resume).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import ClassVar

from trainer_lib.config import opt
from trainer_lib.config.rl import RLConfig
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.stages.training.dpo import LOSSES, METRICS

#: DPO's paired losses (KTO needs unpaired rows, not a judge's pairs)
PAIRED_LOSSES = tuple(name for name in LOSSES if name != "kto")

#: the per-pair metrics of ``posttrain dpo`` (policy's implicit rewards and log-probs), named as there
DPO_KEYS = METRICS["paired"]


@dataclass
class OnlineDPOConfig(RLConfig):
    loss: str = opt(
        "sigmoid", "Preference loss on the judged pairs, as in posttrain dpo; simpo needs no reference.", PAIRED_LOSSES
    )
    beta: float = opt(0.1, "Inverse temperature of the implicit reward (IPO: tau). SimPO wants ~2-2.5.")
    label_smoothing: float = opt(0.0, "Assumed label-flip rate eps for sigmoid (cDPO) and robust (0 <= eps < 0.5).")
    simpo_gamma: float = opt(1.0, "SimPO target reward margin gamma.")
    rpo_alpha: float = opt(0.0, "Weight of an NLL term that keeps chosen answers likely (RPO); 0: off.")
    min_reward_gap: float = opt(
        0.0,
        "A prompt's best and worst completions pair up only when their rewards differ by more than this; "
        "otherwise the prompt is a tie, skipped and counted (0: only equal rewards tie).",
    )

    #: one pass over the step's pairs, one optimizer step per step
    ppo_epochs: ClassVar[int] = 1
    mini_batch_size: ClassVar[int] = 0

    def validate(self) -> None:
        super().validate()
        if not self.beta > 0:
            raise ConfigError(f"beta: expected a positive number, got {self.beta}")
        if self.label_smoothing and self.loss not in ("sigmoid", "robust"):
            raise ConfigError(f"label_smoothing: only used by loss=sigmoid or loss=robust, not loss={self.loss}")
        if not 0.0 <= self.label_smoothing < 0.5 or self.rpo_alpha < 0 or self.min_reward_gap < 0:
            raise ConfigError("expected 0 <= label_smoothing < 0.5, rpo_alpha >= 0 and min_reward_gap >= 0")
        if self.rollout.n < 2:
            raise ConfigError("rollout.n: online DPO needs at least 2 completions per prompt to pair")
        if self.rollout.temperature == 0:
            raise ConfigError("rollout.temperature: 0 samples one greedy completion n times; every prompt would tie")
        if self.rollout.tis_cap:
            raise ConfigError("rollout.tis_cap: truncated importance sampling is GRPO's, not online DPO's")
        if self.env.class_:
            raise ConfigError("env.class: multi-turn episodes are GRPO's; online DPO pairs single completions")
        if self.batch_size != "auto" and self.prompts_per_step % self.batch_size:
            raise ConfigError(
                f"batch_size: online DPO's micro-batch is batch_size pairs (2 * batch_size sequences), one pair per "
                f"prompt; {self.batch_size} does not divide prompts_per_step ({self.prompts_per_step})"
            )

    @property
    def mini_batch(self) -> int:
        """Pairs per optimizer step, all ranks together: one per prompt of the step (a tie's with weight 0)."""
        return self.prompts_per_step

    def updates_per_step(self) -> int:
        return 1


CONFIG = OnlineDPOConfig


# --------------------------------------------------------------------------- the judge's pairs


@dataclass
class Pairs:
    """Each prompt's pair among its ``n`` consecutive rows: the best and the worst by the judge's reward."""

    chosen: list[int]  # row of each prompt's best completion
    rejected: list[int]  # row of its worst
    kept: list[bool]  # False: a tie, no pair
    chosen_reward: list[float]
    rejected_reward: list[float]

    def __len__(self) -> int:
        return len(self.chosen)


def pick_pairs(rewards, n: int, min_gap: float) -> Pairs:
    """Best and worst of each group of ``n`` consecutive ``rewards`` (the first of equals); a group whose
    best and worst differ by ``min_gap`` or less is a tie."""
    import torch

    groups = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1, n)
    best, worst = groups.argmax(1), groups.argmin(1)
    high, low = groups.max(1).values, groups.min(1).values
    start = torch.arange(len(groups)) * n
    return Pairs(
        (start + best).tolist(), (start + worst).tolist(), (high - low > min_gap).tolist(), high.tolist(), low.tolist()
    )


class PairCounts:
    """Pairs trained and ties skipped since step 0, all ranks; checkpointed, so a resumed run counts on."""

    def __init__(self):
        self.pairs, self.ties = 0, 0

    def state_dict(self) -> dict:
        return {"pairs": self.pairs, "ties": self.ties}

    def load_state_dict(self, state: dict) -> None:
        self.pairs, self.ties = int(state["pairs"]), int(state["ties"])


def judge_metrics(pairs: Pairs, strategy) -> dict:
    """The step's ``pairs/*`` metrics, over all ranks: pairs trained and ties skipped (counts per step), and
    the judge's mean reward of chosen and rejected and their margin over the trained pairs (none without)."""
    kept = [i for i, keep in enumerate(pairs.kept) if keep]
    sums = strategy.all_reduce(
        {
            "pairs": float(len(kept)),
            "ties": float(len(pairs) - len(kept)),
            "chosen": sum(pairs.chosen_reward[i] for i in kept),
            "rejected": sum(pairs.rejected_reward[i] for i in kept),
        },
        op="sum",
    )
    metrics = {"pairs/trained": sums["pairs"], "pairs/ties_skipped": sums["ties"]}
    if sums["pairs"]:
        chosen, rejected = sums["chosen"] / sums["pairs"], sums["rejected"] / sums["pairs"]
        metrics.update(
            {"pairs/chosen_reward": chosen, "pairs/rejected_reward": rejected, "pairs/reward_margin": chosen - rejected}
        )
    return metrics


# --------------------------------------------------------------------------- log-probs and the update


def pair_rollout(rollout, pairs: Pairs, indices: list[int]):
    """The rows of the pairs ``indices``: their chosen completions, then their rejected ones."""
    return rollout.select([pairs.chosen[i] for i in indices] + [pairs.rejected[i] for i in indices])


def summed_logps(token_logprobs, part):
    """:class:`~trainer_lib.models.reference.SequenceLogps` of a :func:`pair_rollout`: its ``(2B, R)`` token
    log-probs summed over each completion's tokens, the chosen half and the rejected half."""
    from trainer_lib.data.preference_batches import split_halves
    from trainer_lib.models.reference import SequenceLogps

    mask = part.loss_mask.to(token_logprobs.device)
    return SequenceLogps(*split_halves((token_logprobs * mask).sum(1)), *split_halves(mask.sum(1)))


class PairUpdate:
    """One optimizer step of DPO's ``objective(policy, reference, batch) -> (B,)`` on a step's pairs,
    ``batch_size`` pairs per micro-batch; ``metrics(policy, reference) -> dict`` gives the per-pair values
    (:func:`trainer_lib.stages.training.dpo.batch_metrics`) that are logged for the trained pairs."""

    def __init__(self, models, strategy, objective, metrics, batch_size: int):
        self.models, self.strategy, self.objective, self.metrics = models, strategy, objective, metrics
        self.batch_size = batch_size

    def __call__(self, rollout, pairs: Pairs, trained: float, window) -> list[dict]:
        """Backward and step over this rank's pairs; ``trained``: the pairs kept on all ranks (the loss is
        their mean). Returns each micro-batch's pair indices and implicit rewards of chosen and rejected (still on
        the device; :func:`pair_samples` reads them at logging steps only)."""
        import torch

        from trainer_lib.rl.experience import reference_logprobs
        from trainer_lib.rl.rollout import token_logprobs

        engine, models = self.models.actor_engine, self.models
        chunks = [list(range(i, min(i + self.batch_size, len(pairs)))) for i in range(0, len(pairs), self.batch_size)]
        # DeepSpeed divides each micro-batch's loss by the accumulation and averages the ranks' gradients
        scale = len(chunks) * self.strategy.world_size / trained
        implicit = []
        for indices in chunks:
            # one forward over the chosen and rejected completions; log-probs of pi itself (temperature 1)
            part = pair_rollout(rollout, pairs, indices)
            reference = None
            if models.use_reference:  # a frozen model, a shared base, or the LoRA policy with adapters off
                reference = summed_logps(reference_logprobs(models.reference, engine, part, 1.0), part)
            policy = summed_logps(token_logprobs(engine, part, 1.0)[0], part)
            losses = self.objective(policy, reference, {})
            keep = torch.tensor([pairs.kept[i] for i in indices], device=losses.device)
            self.strategy.backward((losses * keep).sum() * scale, engine)
            self.strategy.optimizer_step(engine)
            values = {"loss": losses, **self.metrics(policy, reference)}
            window.add_all({key: value.detach()[keep] for key, value in values.items()})
            implicit.append((indices, values["rewards/chosen"].detach(), values["rewards/rejected"].detach()))
        return implicit


def pair_samples(rollout, pairs: Pairs, implicit: list) -> list[dict]:
    """``samples.jsonl`` rows (:mod:`trainer_lib.loop.samples`) of the step's trained pairs: prompt, chosen and
    rejected completions, the judge's reward of each (``chosen_score``, ``rejected_score``) and the policy's
    implicit rewards (``chosen_reward``, ``rejected_reward``, ``margin``, as ``posttrain dpo`` logs them)."""
    from trainer_lib.rl.experience import prompt_text

    rows = []
    for indices, chosen_rewards, rejected_rewards in implicit:
        for i, chosen_reward, rejected_reward in zip(indices, chosen_rewards.tolist(), rejected_rewards.tolist()):
            if not pairs.kept[i]:
                continue
            chosen, rejected = pairs.chosen[i], pairs.rejected[i]
            rows.append(
                {
                    "kind": "pair",
                    "group": i,
                    "prompt": prompt_text(rollout.prompts[chosen]) if rollout.prompts else "",
                    "chosen": rollout.completions[chosen],
                    "rejected": rollout.completions[rejected],
                    "chosen_score": pairs.chosen_reward[i],
                    "rejected_score": pairs.rejected_reward[i],
                    "chosen_reward": chosen_reward,
                    "rejected_reward": rejected_reward,
                    "margin": chosen_reward - rejected_reward,
                }
            )
    return rows


def check_source_labels(rewards) -> None:
    """A reward source whose label is one of DPO's ``rewards/*`` keys would log into the same metric."""
    clash = sorted({label for _, _, label in rewards.sources} & {key.split("/")[1] for key in DPO_KEYS[1:5]})
    if clash:
        raise UserError(
            f"reward.functions: a source named {clash[0]!r} would log as rewards/{clash[0]}, which online DPO "
            "keeps for the implicit reward; rename the function"
        )


# --------------------------------------------------------------------------- run


def run(cfg: OnlineDPOConfig) -> dict:
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.rl import experience as rl
    from trainer_lib.rl.actor_critic import build_models
    from trainer_lib.stages.training.dpo import batch_metrics, select_objective

    # ---- prompts, schedule; policy, reference and the judge's reward sources
    strategy, tokenizer, eval_rows, schedule = rl.start(cfg, sequences_per_row=2)
    steps, n = schedule.steps, cfg.rollout.n
    models = build_models(cfg, strategy, tokenizer, steps, use_reference=cfg.loss != "simpo")
    engine, rewards = models.actor_engine, models.rewards
    check_source_labels(rewards)
    update = PairUpdate(
        models,
        strategy,
        select_objective(cfg),
        lambda policy, reference: batch_metrics("paired", policy, reference, cfg.beta, {}),
        cfg.batch_size,
    )
    counts = PairCounts()

    evaluation = rl.held_out_evaluation(engine, strategy, tokenizer, eval_rows, rewards, cfg)
    cadence = Cadence(
        cfg,
        strategy,
        "online-dpo",
        steps,
        engine,
        evaluate=evaluation,
        stateful={"rewards": rewards, "pair_counts": counts, **schedule.stateful()},
        window_keys=DPO_KEYS,
    )
    try:
        cadence.restore(
            f"loss={cfg.loss}, {len(schedule.prompts)} train / {len(eval_rows)} eval prompts, "
            f"{cfg.prompts_per_step} prompts x {n} completions per step, best vs worst"
        )

        # ---- the loop
        for step in cadence.steps():
            # 1. sample and judge; each prompt's best and worst completion, or a tie
            rollout, _, metrics = rl.sample_and_score(engine, strategy, tokenizer, schedule, step, cfg, rewards)
            pairs = pick_pairs(rewards.weighted(rollout.reward_table), n, cfg.min_reward_gap)
            metrics.update(judge_metrics(pairs, strategy))
            counts.pairs += int(metrics["pairs/trained"])
            counts.ties += int(metrics["pairs/ties_skipped"])
            # 2. DPO on the pairs against the reference: one optimizer step (none when every prompt tied)
            train_start, implicit = time.perf_counter(), []
            if metrics["pairs/trained"]:
                implicit = update(rollout, pairs, metrics["pairs/trained"], cadence.window)
            cadence.window.add_all({**metrics, "train_time": time.perf_counter() - train_start})
            cadence.window.count(samples=len(rollout), tokens=rl.rollout_tokens(rollout))
            cadence.log_samples(step, functools.partial(pair_samples, rollout, pairs, implicit))
            cadence.after_step(step)

        # ---- final evaluation and Hugging Face export
        summary = cadence.finish(
            {
                "stage": "online-dpo",
                "loss": cfg.loss,
                "train_prompts": len(schedule.prompts),
                "pairs_trained": counts.pairs,
                "ties_skipped": counts.ties,
            }
        )
    finally:
        rewards.close()
    if "eval" in summary:
        summary["eval_reward"] = summary["eval"]["reward"]
    models.keep_policy_only()
    return cadence.save_model(tokenizer, summary)
