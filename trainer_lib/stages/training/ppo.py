"""PPO with a critic, GAE and KL control (Ouyang et al. 2022; Ziegler et al. 2019).

    posttrain ppo model.path=SFT data.path=PROMPTS output_dir=OUT reward.model_path=RM

Every step:

1. sample ``rollout.n`` completions for each of ``prompts_per_step`` prompts and score them;
2. with the weights that sampled them, compute per-token log-probs (actor, reference) and
   values (critic);
3. fold the KL penalty into per-token rewards, the score landing on the last token:
       r_t = -beta * KL_t  (+ score on the final token),   KL_t by ``kl.estimator``
4. GAE advantages and returns (``gamma``, ``lam``), advantages optionally whitened;
5. ``ppo_epochs`` passes over shuffled mini-batches: clipped policy loss on the actor,
   clipped value loss on the critic, an update per mini-batch (the actor's only after
   ``freeze_actor_steps``);
6. adapt beta towards ``kl.target`` if ``kl.adaptive``.

The models come in one of two layouts with the same methods (:mod:`trainer_lib.rl.actor_critic`),
so the loop above is the same for both:

* by default, actor and critic are separate DeepSpeed engines, each stepped once per mini-batch;
  the reference policy is a frozen copy of ``model.path`` (under LoRA: the actor with its adapters
  disabled). The critic is a sequence-classification model (scalar head ``score``) read at every
  token: it starts from ``critic.path`` (default: the reward model, else the policy with a new
  head) and must share the policy's tokenizer.
* with ``multi_adapter=true`` (and LoRA) the four models are one frozen base with adapters
  (:mod:`trainer_lib.models.multi_adapter`): policy and value adapters (plus the value head) in one
  engine, the reference as the base with adapters disabled, a LoRA reward model of the same base as
  a frozen adapter. Step 5 then takes ONE optimizer step per mini-batch on
  ``policy_loss + vf_coef * value_loss``, the value adapter and head in a parameter group at
  ``critic_lr``. Unlike two engines: the gradient is clipped as one vector, and the policy's LR
  schedule counts from step 0 (during ``freeze_actor_steps`` the policy term is left out and its
  group's lr is 0 for the step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer_lib.config import opt
from trainer_lib.config.rl import RLConfig
from trainer_lib.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass
class KLConfig:
    coef: float = opt(0.05, "KL penalty coefficient beta (initial value when adaptive; 0: no reference model).")
    estimator: str = opt("k1", "Per-token KL estimator folded into the reward.", ("k1", "k2", "k3"))
    adaptive: bool = opt(False, "Adapt the coefficient towards kl.target (Ziegler et al. 2019).")
    target: float = opt(6.0, "Adaptive control: target KL per completion (nats, summed over tokens).")
    horizon: int = opt(10000, "Adaptive control: horizon in completions.")


@dataclass
class CriticConfig:
    path: str | None = opt(None, "Critic init (reward model or causal LM); default reward.model_path, else model.path.")


@dataclass
class PPOConfig(RLConfig):
    kl: KLConfig = opt(KLConfig, "KL penalty towards the reference policy.")
    critic: CriticConfig = opt(CriticConfig, "Value model.")
    ppo_epochs: int = opt(4, "Passes over each step's completions.")
    clip_range: float = opt(0.2, "Clip range of the policy probability ratio.")
    value_clip_range: float = opt(0.2, "Clip range of value updates around the rollout's values (0: off).")
    gamma: float = opt(1.0, "GAE discount.")
    lam: float = opt(0.95, "GAE lambda.")
    vf_coef: float = opt(0.5, "Weight of the value loss.")
    whiten_advantages: bool = opt(True, "Whiten advantages over each step's response tokens.")
    critic_lr: float | None = opt(None, "Critic learning rate (default: lr).")
    freeze_actor_steps: int = opt(0, "Train only the critic for the first N steps, so a new value head settles first.")

    def validate(self) -> None:
        super().validate()
        if self.multi_adapter and self.engine.gradient_checkpointing:
            raise ConfigError(
                "engine.gradient_checkpointing: not supported with multi_adapter=true in PPO (the one "
                "backward pass would recompute the policy's and the value's layers under one adapter)"
            )
        if self.clip_range <= 0 or self.value_clip_range < 0 or self.vf_coef < 0:
            raise ConfigError("clip_range: expected > 0; value_clip_range, vf_coef: expected >= 0")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"gamma, lam: expected values in [0, 1], got {self.gamma}, {self.lam}")
        if self.kl.coef < 0 or self.kl.target <= 0 or self.kl.horizon < 1:
            raise ConfigError("kl.coef: expected >= 0; kl.target, kl.horizon: expected > 0")
        if self.freeze_actor_steps < 0:
            raise ConfigError(f"freeze_actor_steps: expected >= 0, got {self.freeze_actor_steps}")
        if self.critic_lr is not None and self.critic_lr <= 0:
            raise ConfigError(f"critic_lr: expected a positive number, got {self.critic_lr}")


CONFIG = PPOConfig


@dataclass
class Experience:
    """What the update phase needs from one step's rollout, every tensor ``(N, R)`` on the CPU."""

    mask: torch.Tensor  # 1.0 on response tokens
    old_logprobs: torch.Tensor  # the actor's, with the weights that sampled the rollout
    old_values: torch.Tensor  # the critic's, likewise
    kl: torch.Tensor  # per-token KL estimate towards the reference (zeros without one)
    token_rewards: torch.Tensor  # -beta * KL_t, plus the score on the last token
    advantages: torch.Tensor
    returns: torch.Tensor

    def statistics(self, scores) -> dict:
        """The KL part of the reward, and how well the critic's values predicted the returns."""
        from trainer_lib.losses import explained_variance, masked_mean

        return {
            "non_score_reward": float(self.token_rewards.sum(1).mean() - scores.mean()),
            "explained_variance": float(explained_variance(self.old_values, self.returns, self.mask)),
            "value_mean": float(masked_mean(self.old_values, self.mask)),
        }


def make_experience(models, rollout, scores, kl_coef: float, cfg: PPOConfig) -> Experience:
    """Steps 2-4: log-probs (actor, reference) and values (critic) of the weights that sampled the
    rollout, KL-shaped per-token rewards with the score on each completion's last token, GAE."""
    import torch

    from trainer_lib.losses import gae_advantages, kl_penalty, masked_whiten
    from trainer_lib.rl import experience as rl

    temperature = cfg.rollout.temperature
    mask = rollout.response_mask.float()
    with torch.no_grad():
        old_logprobs = models.actor_logprobs(rollout, temperature, cfg.batch_size)
        old_values = rl.per_micro_batch(models.token_values, rollout, cfg.batch_size)
        reference_logprobs = models.reference_logprobs(rollout, temperature, cfg.batch_size)
        if reference_logprobs is None:  # kl.coef=0: no reference, no penalty
            kl = torch.zeros_like(mask)
        else:
            kl = kl_penalty(old_logprobs, reference_logprobs, cfg.kl.estimator) * mask
    token_rewards = -kl_coef * kl
    last = (rollout.response_lengths() - 1).clamp(min=0)
    token_rewards[torch.arange(len(rollout)), last] += scores
    advantages, returns = gae_advantages(token_rewards, old_values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        advantages = masked_whiten(advantages, mask) * mask
    return Experience(mask, old_logprobs, old_values, kl, token_rewards, advantages, returns)


def mini_batch_update(models, part, rows, experience: Experience, cfg: PPOConfig, train_actor: bool) -> dict:
    """Step 5 on one mini-batch ``part`` (the rollout's ``rows``): clipped policy and value losses, then
    the layout's update on ``policy_loss + vf_coef * value_loss``. Returns the mini-batch's metrics."""
    import torch

    from trainer_lib.losses import masked_mean, ppo_policy_loss, ppo_value_loss
    from trainer_lib.rl.rollout import token_logprobs

    device = models.strategy.device
    width = part.response_ids.shape[1]
    mask = part.response_mask.to(device).float()

    def cut(tensor):  # the step's (N, R) tensor, cut to these rows and this part's width
        return tensor[rows, :width].to(device)

    with torch.set_grad_enabled(train_actor):  # a frozen actor needs no graph
        logprobs, entropy = token_logprobs(models.actor_engine, part, cfg.rollout.temperature, with_entropy=True)
        policy_loss, policy_stats = ppo_policy_loss(
            logprobs, cut(experience.old_logprobs), cut(experience.advantages), mask, cfg.clip_range
        )
    value_loss = value_stats = None

    def weighted_value_loss():  # the layout calls it when the critic may run: after a separate actor's step
        nonlocal value_loss, value_stats
        values = models.token_values(part)
        value_loss, value_stats = ppo_value_loss(
            values, cut(experience.old_values), cut(experience.returns), mask, cfg.value_clip_range
        )
        return cfg.vf_coef * value_loss

    models.update(policy_loss, weighted_value_loss, train_actor)
    return {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": masked_mean(entropy, mask),
        **policy_stats,
        **value_stats,
    }


def run(cfg: PPOConfig) -> dict:
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.losses import KLController
    from trainer_lib.rl import experience as rl
    from trainer_lib.rl.actor_critic import build_models

    # ---- prompts, schedule; actor, critic, reference and rewards in the configured layout
    strategy, tokenizer, eval_rows, schedule = rl.start(cfg)
    steps, n = schedule.steps, cfg.rollout.n
    updates = steps * cfg.updates_per_step()
    actor_updates = (steps - min(cfg.freeze_actor_steps, steps - 1)) * cfg.updates_per_step()
    models = build_models(
        cfg, strategy, tokenizer, updates, use_reference=cfg.kl.coef > 0, with_critic=True, actor_updates=actor_updates
    )
    actor_engine, rewards = models.actor_engine, models.rewards
    kl_ctl = KLController(cfg.kl.coef, cfg.kl.target if cfg.kl.adaptive else None, cfg.kl.horizon)

    cadence = Cadence(
        cfg,
        strategy,
        "ppo",
        steps,
        actor_engine,
        evaluate=rl.held_out_evaluation(actor_engine, strategy, tokenizer, eval_rows, rewards, cfg),
        stateful={"rewards": rewards, "kl_controller": kl_ctl},
        extra_engines=models.extra_engines,
        log_extra=models.log_extra,
    )
    try:
        cadence.restore(
            f"{len(schedule.prompts)} train / {len(eval_rows)} eval prompts, {cfg.prompts_per_step} prompts x "
            f"{n} completions per step (trainable params: {models.trainable})"
        )

        # ---- the loop
        for step in cadence.steps():
            # 1. rollout and scores
            rollout, scores, metrics = rl.sample_and_score(
                actor_engine, strategy, tokenizer, schedule, step, cfg, rewards
            )

            # 2-4. log-probs and values of the sampling weights, KL-shaped rewards, GAE
            prep_start = time.perf_counter()
            experience = make_experience(models, rollout, scores, kl_ctl.value, cfg)

            # 5. clipped policy and value updates over shuffled mini-batches
            train_start = time.perf_counter()
            train_actor = step >= cfg.freeze_actor_steps
            for micro in schedule.update_micro_batches(step):
                cadence.window.add_all(
                    mini_batch_update(models, rollout.select(micro), micro, experience, cfg, train_actor)
                )

            # 6. statistics and KL control
            sequence_kl = float(strategy.all_reduce(experience.kl.sum(1).mean()))
            cadence.window.add_all(
                {
                    **metrics,
                    "kl": sequence_kl,
                    "kl_coef": kl_ctl.value,
                    **experience.statistics(scores),
                    "logprob_time": train_start - prep_start,
                    "train_time": time.perf_counter() - train_start,
                }
            )
            kl_ctl.update(sequence_kl, cfg.prompts_per_step * n)
            cadence.window.count(samples=len(rollout), tokens=rl.rollout_tokens(rollout))
            cadence.after_step(step)

        # ---- final evaluation and Hugging Face export (the policy)
        summary = cadence.finish({"stage": "ppo", "train_prompts": len(schedule.prompts)})
    finally:
        rewards.close()
    summary["kl_coef"] = kl_ctl.value
    if "eval" in summary:
        summary["eval_reward"] = summary["eval"]["reward"]
    models.keep_policy_only()
    return cadence.save_model(tokenizer, summary)
