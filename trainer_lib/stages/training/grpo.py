"""Critic-free RL: GRPO, Dr. GRPO and RLOO on groups of ``rollout.n`` completions per prompt.

    posttrain grpo model.path=SFT data.path=PROMPTS output_dir=OUT reward.functions=code_execution

Every step: take ``prompts_per_step`` prompts (a pure function of seed and step), sample
``rollout.n`` completions of each with the current policy, score them, turn the group's
rewards into one advantage per completion, and take ``ppo_epochs`` passes of clipped-ratio
updates over shuffled mini-batches:

    loss_{i,t} = -min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - epsilon, 1 + epsilon) A_i) + beta * KL3_{i,t}

with ``rho = pi / pi_old`` and the k3 estimate of KL(pi || pi_ref) as a loss term (Shao et al.
2024, eq. 3-4). ``advantage`` picks, once, how advantages are formed and how token losses are
averaged:

    grpo     (r - mean) / (std + eps) per group        mean over tokens, then over completions
    dr_grpo  r - mean per group                        sum over tokens / (completions * max_new_tokens)
    rloo     r - mean of the other n - 1 completions   mean over tokens, then over completions

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

ADVANTAGES = ("grpo", "dr_grpo", "rloo")


@dataclass
class GRPOConfig(RLConfig):
    advantage: str = opt("grpo", "Advantage in a group: z-score, r - mean (dr_grpo), leave-one-out (rloo).", ADVANTAGES)
    beta: float = opt(0.04, "Coefficient of the k3 KL(policy || reference) loss term (0: no reference model).")
    epsilon: float = opt(0.2, "Clip range of the probability ratio.")

    def validate(self) -> None:
        super().validate()
        if self.rollout.n < 2:
            raise ConfigError("rollout.n: group methods need at least 2 completions per prompt")
        if self.beta < 0 or self.epsilon <= 0:
            raise ConfigError("beta: expected >= 0; epsilon: expected > 0")


CONFIG = GRPOConfig


def advantage_and_loss(cfg: GRPOConfig):
    """(rewards (B,) -> advantages (B,), (per-token loss, mask) -> scalar loss) for ``cfg.advantage``."""
    from trainer_lib.losses import constant_normalized_sum, grpo_advantages, rloo_advantages, sequence_mean

    n = cfg.rollout.n
    return {
        "grpo": (functools.partial(grpo_advantages, group_size=n, scale=True), sequence_mean),
        "dr_grpo": (
            functools.partial(grpo_advantages, group_size=n, scale=False),
            functools.partial(constant_normalized_sum, max_tokens=cfg.rollout.max_new_tokens),
        ),
        "rloo": (functools.partial(rloo_advantages, group_size=n), sequence_mean),
    }[cfg.advantage]


def run(cfg: GRPOConfig) -> dict:
    import torch

    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.losses import clipped_surrogate, kl_k3, masked_mean
    from trainer_lib.rl import experience as rl
    from trainer_lib.rl.actor_critic import build_models
    from trainer_lib.rl.rollout import token_logprobs

    # ---- prompts, schedule; policy, reference and rewards in the configured layout (no critic)
    strategy, tokenizer, eval_rows, schedule = rl.start(cfg)
    steps, n, temperature = schedule.steps, cfg.rollout.n, cfg.rollout.temperature
    models = build_models(cfg, strategy, tokenizer, steps * cfg.updates_per_step(), use_reference=cfg.beta > 0)
    engine, rewards = models.actor_engine, models.rewards
    advantages_of, aggregate = advantage_and_loss(cfg)
    reuse_logprobs = cfg.updates_per_step() == 1  # one update: pi_old is the policy itself

    evaluation = rl.held_out_evaluation(engine, strategy, tokenizer, eval_rows, rewards, cfg)
    cadence = Cadence(cfg, strategy, "grpo", steps, engine, evaluate=evaluation, stateful={"rewards": rewards})
    try:
        cadence.restore(
            f"{cfg.advantage} advantages, {len(schedule.prompts)} train / {len(eval_rows)} eval prompts, "
            f"{cfg.prompts_per_step} prompts x {n} completions per step"
        )

        # ---- the loop
        for step in cadence.steps():
            # 1. rollout: sample, score, group advantages
            rollout, scores, metrics = rl.sample_and_score(engine, strategy, tokenizer, schedule, step, cfg, rewards)
            advantages = advantages_of(scores)
            # 2. log-probs before the update: pi_old (if it differs from pi) and the reference
            logprob_start = time.perf_counter()
            with torch.no_grad():
                old_logprobs = None if reuse_logprobs else models.actor_logprobs(rollout, temperature, cfg.batch_size)
                ref_logprobs = models.reference_logprobs(rollout, temperature, cfg.batch_size)
            # 3. clipped policy-gradient updates over shuffled mini-batches
            train_start = time.perf_counter()
            for micro in schedule.update_micro_batches(step):
                part = rollout.select(micro)
                width = part.response_ids.shape[1]
                mask = part.response_mask.to(strategy.device).float()
                logprobs, entropy = token_logprobs(engine, part, temperature, with_entropy=True)
                old = logprobs.detach() if old_logprobs is None else old_logprobs[micro, :width].to(logprobs.device)
                adv = advantages[micro].to(logprobs.device).unsqueeze(1)
                per_token, clipped = clipped_surrogate(logprobs, old, adv, cfg.epsilon)
                if ref_logprobs is not None:
                    kl = kl_k3(logprobs, ref_logprobs[micro, :width].to(logprobs.device))
                    per_token = per_token + cfg.beta * kl
                    cadence.window.add("kl", masked_mean(kl.detach(), mask))
                loss = aggregate(per_token, mask)
                strategy.backward(loss, engine)
                strategy.optimizer_step(engine)
                cadence.window.add_all(
                    {"loss": loss, "clip_fraction": masked_mean(clipped, mask), "entropy": masked_mean(entropy, mask)}
                )
            cadence.window.add_all(
                {
                    **metrics,
                    "logprob_time": train_start - logprob_start,
                    "train_time": time.perf_counter() - train_start,
                }
            )
            cadence.window.count(samples=len(rollout), tokens=rl.rollout_tokens(rollout))
            cadence.after_step(step)

        # ---- final evaluation and Hugging Face export
        summary = cadence.finish({"stage": "grpo", "advantage": cfg.advantage, "train_prompts": len(schedule.prompts)})
    finally:
        rewards.close()
    if "eval" in summary:
        summary["eval_reward"] = summary["eval"]["reward"]
    models.keep_policy_only()
    return cadence.save_model(tokenizer, summary)
