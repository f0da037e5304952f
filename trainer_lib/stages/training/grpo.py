"""Critic-free RL: GRPO, Dr. GRPO, RLOO, DAPO, GSPO and REINFORCE++ on groups of ``rollout.n``
completions per prompt.

    posttrain grpo model.path=SFT data.path=PROMPTS output_dir=OUT reward.functions=code_execution

Every step: take ``prompts_per_step`` prompts (a pure function of seed and step), sample
``rollout.n`` completions of each with the current policy, score them, turn the group's
rewards into one advantage per completion, and take ``ppo_epochs`` passes of clipped-ratio
updates over shuffled mini-batches:

    loss_{i,t} = -min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - epsilon, 1 + epsilon) A_i) + beta * KL3_{i,t}

with ``rho = pi / pi_old`` and the k3 estimate of KL(pi || pi_ref) as a loss term (Shao et al.
2024, eq. 3-4). ``advantage`` picks, once, how advantages are formed and (unless
``loss_aggregation`` says otherwise) how token losses are averaged:

    grpo          (r - mean) / (std + eps) per group        mean over tokens, then over completions
    dr_grpo       r - mean per group                        sum over tokens / (completions * max_new_tokens)
    rloo          r - mean of the other n - 1 completions   mean over tokens, then over completions
    reinforce_pp  r - beta * KL to go, per token, z-scored  mean over all tokens
                  over the whole batch (KL in the reward, not in the loss)

``objective=gspo`` replaces the token ratio by one ratio per completion (GSPO); ``clip_low`` and
``clip_high`` set the clip range on each side (DAPO's clip-higher); ``overlong_buffer`` adds DAPO's
soft penalty for completions that run into the last tokens of the budget. The defaults are GRPO.

With ``env.class`` (:class:`trainer_lib.config.rl.EnvConfig`) a completion is a multi-turn episode with tools
or an environment (:mod:`trainer_lib.rl.multi_turn`): the group is the ``rollout.n`` episodes of a prompt, the
reward the episode's (``env.reward``: final or discounted sum) plus the reward functions on its final answer,
and advantages, loss, KL and entropy count only the model's tokens (``Rollout.loss_mask``), never the
environment's.

The models are built as in PPO, without a critic (:mod:`trainer_lib.rl.actor_critic`): by default
the policy is its own engine and the reference a frozen copy of ``model.path`` (under LoRA: the
policy with its adapters disabled). With ``multi_adapter=true`` (and LoRA) policy, reference and a
LoRA reward model of the same base share one frozen base (:mod:`trainer_lib.models.multi_adapter`):
the policy adapter, the base with adapters disabled, and the reward adapter with its score head.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from trainer_lib.config import opt
from trainer_lib.config.rl import RLConfig
from trainer_lib.errors import ConfigError

ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
OBJECTIVES = ("grpo", "gspo")
AGGREGATIONS = ("auto", "sequence", "token", "constant")


@dataclass
class GRPOConfig(RLConfig):
    advantage: str = opt(
        "grpo",
        "Advantage: group z-score, r - mean (dr_grpo), leave-one-out (rloo), or REINFORCE++ (reinforce_pp: "
        "per-token returns with the KL in the reward, normalized over the whole batch).",
        ADVANTAGES,
    )
    objective: str = opt(
        "grpo", "Importance ratio: per token (grpo), or one per completion clipped as a whole (gspo).", OBJECTIVES
    )
    loss_aggregation: str = opt(
        "auto",
        "Token losses to one number: mean per completion then over completions (sequence), mean over all "
        "tokens (token, DAPO), sum / (completions * max_new_tokens) (constant); auto: the advantage's own "
        "(constant for dr_grpo, token for reinforce_pp, else sequence).",
        AGGREGATIONS,
    )
    beta: float = opt(
        0.04,
        "KL(policy || reference) coefficient: of the k3 loss term, or of the per-token k1 penalty in the "
        "reward with advantage=reinforce_pp (0: no reference model).",
    )
    epsilon: float = opt(0.2, "Clip range of the probability ratio (both sides, unless clip_low/clip_high).")
    clip_low: float | None = opt(None, "Lower clip range: the ratio is kept above 1 - clip_low (default: epsilon).")
    clip_high: float | None = opt(
        None, "Upper clip range: the ratio is kept below 1 + clip_high (default: epsilon; DAPO uses 0.28)."
    )
    overlong_buffer: int = opt(
        0,
        "DAPO's overlong shaping: the reward falls linearly from 0 to -1 over the last this many tokens "
        "before rollout.max_new_tokens (0: off).",
    )

    def validate(self) -> None:
        super().validate()
        if self.rollout.n < 2:
            raise ConfigError("rollout.n: group methods need at least 2 completions per prompt")
        if self.beta < 0 or self.epsilon <= 0:
            raise ConfigError("beta: expected >= 0; epsilon: expected > 0")
        if any(c is not None and c <= 0 for c in (self.clip_low, self.clip_high)):
            raise ConfigError(f"clip_low, clip_high: expected > 0, got {self.clip_low}, {self.clip_high}")
        if not 0 <= self.overlong_buffer <= self.rollout.max_new_tokens:
            raise ConfigError(
                f"overlong_buffer: expected 0 to rollout.max_new_tokens ({self.rollout.max_new_tokens}), "
                f"got {self.overlong_buffer}"
            )
        if self.rollout.tis_cap < 0 or 0 < self.rollout.tis_cap < 1:
            raise ConfigError(f"rollout.tis_cap: expected 0 (off) or a cap >= 1, got {self.rollout.tis_cap}")
        if self.objective == "gspo" and self.advantage == "reinforce_pp":
            raise ConfigError("objective=gspo: needs one advantage per completion, not advantage=reinforce_pp")
        if self.env.class_ and self.overlong_buffer:
            raise ConfigError("overlong_buffer: measures one completion against rollout.max_new_tokens, not an episode")

        if self.parallel.sequence > 1 and (self.env.class_ or self.buffer.dynamic_sampling):
            key = "env.class" if self.env.class_ else "buffer.dynamic_sampling"
            raise ConfigError(
                f"parallel.sequence={self.parallel.sequence} with {key}: a sequence group trains its ranks' "
                f"micro-batches in turn, so every rank needs as many single-turn rows"
            )

    #: the training passes split rows over a sequence group (rollouts stay whole per rank)
    MODEL_PARALLEL = ("sequence",)

    def clip_range(self) -> tuple[float, float]:
        """(eps_low, eps_high) of the ratio's clip."""
        low = self.epsilon if self.clip_low is None else self.clip_low
        return low, self.epsilon if self.clip_high is None else self.clip_high


CONFIG = GRPOConfig


class GroupAdvantage:
    """One advantage per completion from its group's rewards; the KL stays a loss term (GRPO eq. 3)."""

    needs_old_logprobs = False

    def __init__(self, estimate, kl_coef: float):
        self.estimate, self.kl_coef = estimate, kl_coef

    def __call__(self, scores, mask, old_logprobs, ref_logprobs):
        return self.estimate(scores).unsqueeze(1)  # (B, 1): broadcast over the tokens


class ReinforcePPAdvantage:
    """REINFORCE++: per-token returns with a k1 KL penalty (sampling policy vs reference) in the reward,
    normalized over every token of the step on all ranks; no KL term in the loss."""

    needs_old_logprobs = True
    kl_coef = 0.0

    def __init__(self, beta: float, strategy):
        self.beta, self.strategy = beta, strategy

    def __call__(self, scores, mask, old_logprobs, ref_logprobs):
        import torch

        from trainer_lib.losses import kl_k1, reinforce_pp_advantages

        kl = torch.zeros_like(old_logprobs) if ref_logprobs is None else kl_k1(old_logprobs, ref_logprobs)
        reduce = functools.partial(self.strategy.all_reduce, op="sum")
        return reinforce_pp_advantages(scores, kl, mask, self.beta, reduce=reduce)


def advantage_estimator(cfg: GRPOConfig, strategy):
    """The advantage of ``cfg.advantage``: called as ``(scores (B,), mask, pi_old, pi_ref log-probs (B, T))``,
    it returns ``(B, 1)`` or ``(B, T)`` advantages; ``kl_coef`` weighs the k3 KL loss term."""
    from trainer_lib.losses import grpo_advantages, rloo_advantages

    n = cfg.rollout.n
    if cfg.advantage == "reinforce_pp":
        return ReinforcePPAdvantage(cfg.beta, strategy)
    return GroupAdvantage(
        {
            "grpo": functools.partial(grpo_advantages, group_size=n, scale=True),
            "dr_grpo": functools.partial(grpo_advantages, group_size=n, scale=False),
            "rloo": functools.partial(rloo_advantages, group_size=n),
        }[cfg.advantage],
        cfg.beta,
    )


def policy_loss(cfg: GRPOConfig):
    """``(logprobs, old_logprobs, advantages, mask) -> (per-token loss, clipped marker)`` for ``cfg.objective``."""
    from trainer_lib.losses import clipped_surrogate, sequence_clipped_surrogate

    low, high = cfg.clip_range()
    if cfg.objective == "gspo":
        return functools.partial(sequence_clipped_surrogate, clip_low=low, clip_high=high)
    return lambda logprobs, old, advantages, mask: clipped_surrogate(logprobs, old, advantages, low, high)


def token_aggregation(cfg: GRPOConfig):
    """``(per-token loss, mask) -> scalar loss`` for ``cfg.loss_aggregation``."""
    from trainer_lib.losses import constant_normalized_sum, sequence_mean, token_mean

    name = cfg.loss_aggregation
    if name == "auto":
        name = {"dr_grpo": "constant", "reinforce_pp": "token"}.get(cfg.advantage, "sequence")
    return {
        "sequence": sequence_mean,
        "token": token_mean,
        "constant": functools.partial(constant_normalized_sum, max_tokens=cfg.rollout.max_new_tokens),
    }[name]


def reward_shaping(cfg: GRPOConfig, strategy):
    """``(rollout, scores, metrics) -> scores``: DAPO's overlong penalty added (logged as
    ``overlong_penalty``) when ``overlong_buffer`` is set, else the scores unchanged."""
    if not cfg.overlong_buffer:
        return lambda rollout, scores, metrics: scores

    def shape(rollout, scores, metrics):
        from trainer_lib.losses import overlong_penalty

        penalty = overlong_penalty(rollout.response_lengths(), cfg.rollout.max_new_tokens, cfg.overlong_buffer)
        metrics["overlong_penalty"] = strategy.all_reduce(float(penalty.mean()))
        return scores + penalty.to(scores.dtype)

    return shape


def rollout_correction(cfg: GRPOConfig):
    """``(per-token loss, pi_old log-probs, sampler log-probs, mask, metrics window) -> per-token loss``:
    truncated importance sampling (``rollout.tis_cap``; docs/training.md), else the loss unchanged."""
    cap = cfg.rollout.tis_cap
    if not cap:
        return lambda per_token, old, sampled, mask, window: per_token

    def correct(per_token, old, sampled, mask, window):
        from trainer_lib.losses import masked_mean, truncated_importance_weights

        sampled = sampled.to(old.device)
        weights = truncated_importance_weights(old, sampled, cap)
        window.add_all(
            {
                "tis_weight": masked_mean(weights, mask),
                "tis_capped_fraction": masked_mean((weights >= cap).float(), mask),
                "rollout_logprob_gap": masked_mean((old - sampled).abs(), mask),
            }
        )
        return per_token * weights

    return correct


class PolicyUpdate:
    """One micro-batch's clipped policy-gradient loss (with the k3 KL term), backward and, at the accumulation
    boundary, the optimizer step; its log-probs through ``passes`` (:mod:`trainer_lib.rl.update_passes`: whole
    sequences, or a row split over a sequence group)."""

    def __init__(self, cfg: GRPOConfig, engine, strategy, cadence, kl_coef: float):
        from trainer_lib.rl.update_passes import update_passes

        self.engine, self.strategy, self.cadence, self.kl_coef = engine, strategy, cadence, kl_coef
        self.temperature, self.passes = cfg.rollout.temperature, update_passes(strategy)
        self.loss_of, self.aggregate = policy_loss(cfg), token_aggregation(cfg)
        self.correct = rollout_correction(cfg)
        self.optimizer_time = 0.0

    def __call__(self, part, given: dict) -> None:
        """``part``: a rollout's micro-batch; ``given``: its rows of the old and reference log-probs (None when
        not computed) and of the advantages."""
        from trainer_lib.losses import kl_k3, masked_mean

        window = self.cadence.window
        mask = part.loss_mask.to(self.strategy.device).float()  # the model's tokens (not the environment's)
        logprobs, entropy = self.passes.logprobs(self.engine, part, self.temperature, with_entropy=True)
        old = logprobs.detach() if given["old"] is None else given["old"].to(logprobs.device)
        per_token, clipped = self.loss_of(logprobs, old, given["advantages"].to(logprobs.device), mask)
        per_token = self.correct(per_token, old, part.logprobs, mask, window)
        if given["reference"] is not None:
            kl = kl_k3(logprobs, given["reference"].to(logprobs.device))
            if self.kl_coef:  # reinforce_pp has its KL in the reward instead
                per_token = per_token + self.kl_coef * kl
            window.add("kl", masked_mean(kl.detach(), mask))
        loss = self.aggregate(per_token, mask)
        self.strategy.backward(loss, self.engine)
        optimizer_start = time.perf_counter()
        self.strategy.optimizer_step(self.engine)
        self.optimizer_time += time.perf_counter() - optimizer_start
        window.add_all(
            {"loss": loss, "clip_fraction": masked_mean(clipped, mask), "entropy": masked_mean(entropy, mask)}
        )


def run(cfg: GRPOConfig) -> dict:
    import torch

    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.rl import experience as rl
    from trainer_lib.rl.actor_critic import build_models

    # ---- prompts, schedule, the environment (multi-turn); policy, reference and rewards (no critic)
    strategy, tokenizer, eval_rows, schedule = rl.start(cfg)
    episodes = rl.build_episodes(cfg)  # None: one completion per prompt
    steps, n, temperature = schedule.steps, cfg.rollout.n, cfg.rollout.temperature
    models = build_models(cfg, strategy, tokenizer, steps * cfg.updates_per_step(), use_reference=cfg.beta > 0)
    engine, rewards = models.actor_engine, models.rewards
    advantage_of, shape_rewards = advantage_estimator(cfg, strategy), reward_shaping(cfg, strategy)
    # one update and no advantage that needs them up front: pi_old is the policy itself
    reuse_logprobs = cfg.updates_per_step() == 1 and not advantage_of.needs_old_logprobs

    evaluation = rl.held_out_evaluation(engine, strategy, tokenizer, eval_rows, rewards, cfg, episodes)
    cadence = Cadence(
        cfg, strategy, "grpo", steps, engine, evaluate=evaluation, stateful={"rewards": rewards, **schedule.stateful()}
    )
    update = PolicyUpdate(cfg, engine, strategy, cadence, advantage_of.kl_coef)
    try:
        cadence.restore(
            f"{cfg.advantage} advantages, {len(schedule.prompts)} train / {len(eval_rows)} eval prompts, "
            f"{cfg.prompts_per_step} prompts x {n} completions per step"
        )

        # ---- the loop
        for step in cadence.steps():
            # 1. rollout: sample, score (and shape the rewards)
            rollout, scores, metrics = rl.sample_and_score(
                engine, strategy, tokenizer, schedule, step, cfg, rewards, episodes=episodes
            )
            scores = shape_rewards(rollout, scores, metrics)
            # 2. log-probs before the update: pi_old (if it differs from pi) and the reference; advantages
            logprob_start = time.perf_counter()
            with torch.no_grad():
                old_logprobs = None if reuse_logprobs else models.actor_logprobs(rollout, temperature, cfg.batch_size)
                ref_logprobs = models.reference_logprobs(rollout, temperature, cfg.batch_size)
            advantages = advantage_of(scores, rollout.loss_mask, old_logprobs, ref_logprobs)
            # 3. clipped policy-gradient updates over shuffled mini-batches
            train_start, update.optimizer_time = time.perf_counter(), 0.0
            per_row = {"old": old_logprobs, "advantages": advantages, "reference": ref_logprobs}
            for micro in schedule.update_micro_batches(step):
                for part, given in update.passes.parts(rollout, micro, per_row):  # (each member's, under S)
                    update(part, given)
            cadence.window.add_all(
                {
                    **metrics,
                    "logprob_time": train_start - logprob_start,
                    "train_time": time.perf_counter() - train_start,
                    "optimizer_time": update.optimizer_time,
                }
            )
            cadence.window.count(**rl.window_counts(rollout, update.passes.rows_counted))
            cadence.log_samples(step, functools.partial(rl.rollout_samples, rollout, rewards, advantages, n))
            cadence.after_step(step)

        # ---- final evaluation and Hugging Face export
        summary = cadence.finish({"stage": "grpo", "advantage": cfg.advantage, "train_prompts": len(schedule.prompts)})
    finally:
        rl.close(rewards, episodes)
    if "eval" in summary:
        summary["eval_reward"] = summary["eval"]["reward"]
    models.keep_policy_only()
    return cadence.save_model(tokenizer, summary)
