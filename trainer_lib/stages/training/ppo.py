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

``objective`` picks, once (:func:`objective_for`), the policy loss and the action space:

    ppo   (default)  the clipped ratio loss above, every token an action
    a2c              synchronous advantage actor-critic (Mnih et al. 2016): one update per rollout on
                     ``-A_t log pi(a_t | s_t)``, unclipped, and the unclipped value loss
    nlpo             PPO whose actions are the top ``nlpo.top_p`` tokens of a masking policy, a frozen
                     copy of the policy refreshed every ``nlpo.mask_update_steps`` steps
                     (Ramamurthy et al. 2023; :mod:`trainer_lib.rl.nlpo`)

``entropy_coef`` adds the entropy bonus ``-entropy_coef * H`` to the policy loss of each (0: off).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
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


OBJECTIVES = ("ppo", "a2c", "nlpo")
PPO_EPOCHS = 4  # ppo_epochs unless set (a2c: 1)


@dataclass
class NLPOConfig:
    top_p: float = opt(0.9, "objective=nlpo: the action mask is the masking policy's nucleus of this probability.")
    mask_update_steps: int = opt(20, "objective=nlpo: copy the policy into the masking policy every N steps.")


@dataclass
class PPOConfig(RLConfig):
    kl: KLConfig = opt(KLConfig, "KL penalty towards the reference policy.")
    critic: CriticConfig = opt(CriticConfig, "Value model.")
    objective: str = opt(
        "ppo",
        "Policy update: clipped ratio (ppo), one unclipped policy-gradient step per rollout (a2c), or PPO "
        "with actions masked to a frozen masking policy's top-p tokens (nlpo).",
        OBJECTIVES,
    )
    nlpo: NLPOConfig = opt(NLPOConfig, "NLPO's action mask (objective=nlpo).")
    ppo_epochs: int | None = opt(
        None, f"Passes over each step's completions (default {PPO_EPOCHS}; objective=a2c: 1, its only value)."
    )
    clip_range: float = opt(0.2, "Clip range of the policy probability ratio.")
    value_clip_range: float = opt(0.2, "Clip range of value updates around the rollout's values (0: off).")
    gamma: float = opt(1.0, "GAE discount.")
    lam: float = opt(0.95, "GAE lambda.")
    vf_coef: float = opt(0.5, "Weight of the value loss.")
    whiten_advantages: bool = opt(True, "Whiten advantages over each step's response tokens.")
    critic_lr: float | None = opt(None, "Critic learning rate (default: lr).")
    freeze_actor_steps: int = opt(0, "Train only the critic for the first N steps, so a new value head settles first.")
    entropy_coef: float = opt(0.0, "Weight of the entropy bonus subtracted from the policy loss (0: off).")

    def __post_init__(self) -> None:
        # ppo_epochs follows the objective unless set: resolved as the config is built, so that validate()
        # only checks, and the config written for other processes reads back the same
        self.ppo_epochs = self.update_epochs()

    def validate(self) -> None:
        super().validate()
        self.validate_objective()
        if self.rollout.tis_cap:
            raise ConfigError("rollout.tis_cap: truncated importance sampling is GRPO's (posttrain grpo) for now")
        if self.env.class_ and self.objective == "nlpo":
            raise ConfigError("env.class with objective=nlpo: NLPO's action mask is not built for multi-turn episodes")
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
        if self.entropy_coef < 0:
            raise ConfigError(f"entropy_coef: expected >= 0, got {self.entropy_coef}")
        split = self.parallel.sequence
        for key, on in (
            ("objective=nlpo", self.objective == "nlpo"),
            ("multi_adapter=true", self.multi_adapter),
            ("entropy_coef > 0", self.entropy_coef > 0),
            ("buffer.dynamic_sampling", self.buffer.dynamic_sampling),
            ("env.class", bool(self.env.class_)),
        ):
            if split > 1 and on:
                raise ConfigError(f"parallel.sequence={split} with {key}: not split over a sequence group yet")

    #: the training passes split rows over a sequence group (rollouts stay whole per rank)
    MODEL_PARALLEL = ("sequence",)
    TOKEN_REWARDS = True  # GAE carries a PRM's step scores back from each step's last token

    def update_epochs(self) -> int:
        if self.ppo_epochs is not None:
            return self.ppo_epochs
        return 1 if self.objective == "a2c" else PPO_EPOCHS

    def validate_objective(self) -> None:
        """A2C takes ONE gradient step per rollout, on the whole step's completions: its loss is an
        unbiased policy gradient only for the weights that sampled them, and without PPO's ratio and
        clip a second pass or a second mini-batch would follow a stale gradient unchecked. So
        ``ppo_epochs`` defaults to 1 under a2c, and a contradicting ``ppo_epochs`` or ``mini_batch_size``
        is refused rather than overridden: a config never says what the run does not do.
        NLPO's masking policy is a full frozen copy of the policy made from the actor's weights on
        each rank: refused with multi_adapter (its point is one base for every role) and ZeRO-3 (no
        rank holds the weights to copy)."""
        if self.objective == "a2c" and (self.ppo_epochs != 1 or self.mini_batch != self.sequences_per_step):
            raise ConfigError(
                f"objective=a2c: one update per rollout on all of a step's completions; expected ppo_epochs=1 "
                f"and mini_batch_size=0, got ppo_epochs={self.ppo_epochs}, mini_batch_size={self.mini_batch_size}"
            )
        if self.objective != "nlpo":
            return
        if not 0 < self.nlpo.top_p <= 1 or self.nlpo.mask_update_steps < 1:
            raise ConfigError(
                f"nlpo.top_p: expected 0 < top_p <= 1, nlpo.mask_update_steps: expected >= 1; got "
                f"{self.nlpo.top_p}, {self.nlpo.mask_update_steps}"
            )
        if self.multi_adapter or self.engine.zero_stage == 3:
            raise ConfigError(
                "objective=nlpo: not supported with multi_adapter=true or engine.zero_stage=3 (the masking "
                "policy is a full frozen copy of the policy's weights on each rank); use ZeRO 0-2 and separate models"
            )


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

    def update_rows(self) -> dict:
        """The ``(N, R)`` tensors a mini-batch update reads its rows of."""
        return {key: getattr(self, key) for key in ("old_logprobs", "advantages", "old_values", "returns")}

    def statistics(self, scores) -> dict:
        """The KL part of the reward, and how well the critic's values predicted the returns."""
        from trainer_lib.losses import explained_variance, masked_mean

        return {
            "non_score_reward": float(self.token_rewards.sum(1).mean() - scores.mean()),
            "explained_variance": float(explained_variance(self.old_values, self.returns, self.mask)),
            "value_mean": float(masked_mean(self.old_values, self.mask)),
        }

    def sample_rows(self, rollout, rewards, n: int) -> list[dict]:
        """``samples.jsonl`` rows of the step, each with its GAE advantage averaged over its tokens."""
        from trainer_lib.rl.experience import rollout_samples

        return rollout_samples(rollout, rewards, self.advantages, n, self.mask)


@dataclass
class Objective:
    """What ``objective`` changes in the loop, chosen once by :func:`objective_for`."""

    policy_loss: Callable  # (logprobs, old_logprobs, advantages, mask) -> (loss, statistics)
    value_clip_range: float  # of ppo_value_loss (0: unclipped)
    actions: object  # the action space (trainer_lib.rl.nlpo): sampling and log-probs


def objective_for(cfg: PPOConfig, strategy, models, passes) -> Objective:
    """The policy loss, value clip and action space of ``cfg.objective`` (``models`` built with a
    masking copy for nlpo; ``passes``: how the update's log-probs are taken, :mod:`trainer_lib.rl.update_passes`)."""
    from trainer_lib.losses import policy_gradient_loss, ppo_policy_loss
    from trainer_lib.rl import nlpo

    if cfg.objective == "a2c":  # one pass: V == V_old, so a value clip could never act

        def unclipped(logprobs, old_logprobs, advantages, mask):  # no ratio: pi_old is not needed
            return policy_gradient_loss(logprobs, advantages, mask)

        return Objective(unclipped, 0.0, nlpo.FullVocabulary(passes))
    clipped = functools.partial(ppo_policy_loss, clip_range=cfg.clip_range)
    if cfg.objective == "nlpo":
        actor = strategy.unwrap(models.actor_engine)
        masking = nlpo.MaskingPolicy(
            actor, models.masking_copy, cfg.nlpo.top_p, cfg.nlpo.mask_update_steps, cfg.rollout.temperature
        )
        return Objective(clipped, cfg.value_clip_range, nlpo.MaskedActions(masking))
    return Objective(clipped, cfg.value_clip_range, nlpo.FullVocabulary(passes))


def make_experience(models, rollout, scores, kl_coef: float, cfg: PPOConfig, actions, tokenizer) -> Experience:
    """Steps 2-4: log-probs (actor in its action space, reference) and values (critic) of the weights that
    sampled the rollout, KL-shaped per-token rewards with the score on each completion's last token (and the
    token-level sources': a PRM's step scores on each step's last token, an episode's turn rewards on each
    turn's last token), GAE over the model's tokens (a multi-turn row's environment tokens skipped)."""
    import torch

    from trainer_lib.losses import gae_advantages, kl_penalty, masked_whiten
    from trainer_lib.rl import experience as rl

    temperature = cfg.rollout.temperature
    mask = rollout.loss_mask.float()  # the model's tokens (a multi-turn row's, not the environment's)
    with torch.no_grad():
        old_logprobs = actions.rollout_logprobs(models, rollout, temperature, cfg.batch_size)
        old_values = rl.per_micro_batch(models.token_values, rollout, cfg.batch_size)
        reference_logprobs = models.reference_logprobs(rollout, temperature, cfg.batch_size)
        if reference_logprobs is None:  # kl.coef=0: no reference, no penalty
            kl = torch.zeros_like(mask)
        else:
            kl = kl_penalty(old_logprobs, reference_logprobs, cfg.kl.estimator) * mask
    token_rewards = -kl_coef * kl
    last = (mask * torch.arange(mask.shape[1])).argmax(1)  # each row's last token of its own
    token_rewards[torch.arange(len(rollout)), last] += scores
    steps = rl.step_token_rewards(models.rewards, rollout, tokenizer)
    if steps is not None:
        token_rewards += steps[:, : token_rewards.shape[1]].to(token_rewards.device)
    advantages, returns = gae_advantages(token_rewards, old_values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        advantages = masked_whiten(advantages, mask) * mask
    return Experience(mask, old_logprobs, old_values, kl, token_rewards, advantages, returns)


def mini_batch_update(
    models, part, given: dict, cfg: PPOConfig, objective: Objective, train_actor: bool, passes
) -> dict:
    """Step 5 on one mini-batch ``part`` (``given``: its rows of the experience's old log-probs, advantages, old
    values and returns): the objective's policy loss (plus the entropy bonus) and value loss, then the layout's
    update on ``policy_loss + vf_coef * value_loss``. Returns the mini-batch's metrics."""
    import torch

    from trainer_lib.losses import entropy_bonus, masked_mean, ppo_value_loss

    device = models.strategy.device
    mask = part.loss_mask.to(device).float()
    given = {key: value.to(device) for key, value in given.items()}

    with torch.set_grad_enabled(train_actor):  # a frozen actor needs no graph
        logprobs, entropy, action_stats = objective.actions.logprobs(
            models.actor_engine, part, cfg.rollout.temperature, entropy_grad=cfg.entropy_coef > 0
        )
        policy_loss, policy_stats = objective.policy_loss(logprobs, given["old_logprobs"], given["advantages"], mask)
        bonus = entropy_bonus(entropy, mask, cfg.entropy_coef)  # exactly 0, and no graph, when entropy_coef=0
    value_loss = value_stats = None

    def weighted_value_loss():  # the layout calls it when the critic may run: after a separate actor's step
        nonlocal value_loss, value_stats
        values = passes.values(models, part)
        value_loss, value_stats = ppo_value_loss(
            values, given["old_values"], given["returns"], mask, objective.value_clip_range
        )
        return cfg.vf_coef * value_loss

    models.update(policy_loss + bonus, weighted_value_loss, train_actor)
    return {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": masked_mean(entropy.detach(), mask),
        **policy_stats,
        **value_stats,
        **action_stats,
    }


def run(cfg: PPOConfig) -> dict:
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.losses import KLController
    from trainer_lib.rl import experience as rl
    from trainer_lib.rl.actor_critic import build_models
    from trainer_lib.rl.buffer import reward_deviation
    from trainer_lib.rl.update_passes import update_passes

    # ---- prompts, schedule; actor, critic, reference and rewards in the configured layout
    strategy, tokenizer, eval_rows, schedule = rl.start(cfg, priority_signal=reward_deviation)
    episodes = rl.build_episodes(cfg)  # None: one completion per prompt
    steps, n = schedule.steps, cfg.rollout.n
    actor_updates = (steps - min(cfg.freeze_actor_steps, steps - 1)) * cfg.updates_per_step()
    models = build_models(
        cfg,
        strategy,
        tokenizer,
        steps * cfg.updates_per_step(),
        use_reference=cfg.kl.coef > 0,
        with_critic=True,
        actor_updates=actor_updates,
        with_masking_copy=cfg.objective == "nlpo",
    )
    actor_engine, rewards = models.actor_engine, models.rewards
    kl_ctl = KLController(cfg.kl.coef, cfg.kl.target if cfg.kl.adaptive else None, cfg.kl.horizon)
    passes = update_passes(strategy)  # each rank its own micro-batches, or a sequence group's in turn
    objective = objective_for(cfg, strategy, models, passes)
    actions = objective.actions  # the action space: sampling and log-probs (NLPO's masked one)

    cadence = Cadence(
        cfg,
        strategy,
        "ppo",
        steps,
        actor_engine,
        evaluate=rl.held_out_evaluation(actor_engine, strategy, tokenizer, eval_rows, rewards, cfg, episodes),
        stateful={"rewards": rewards, "kl_controller": kl_ctl, **schedule.stateful(), **actions.stateful},
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
            # 1. rollout (in the objective's action space) and scores
            actions.begin_step(step)
            rollout, scores, metrics = rl.sample_and_score(
                actor_engine, strategy, tokenizer, schedule, step, cfg, rewards, actions.logits_processor, episodes
            )

            # 2-4. log-probs and values of the sampling weights, KL-shaped rewards, GAE
            prep_start = time.perf_counter()
            experience = make_experience(models, rollout, scores, kl_ctl.value, cfg, actions, tokenizer)

            # 5. policy and value updates over shuffled mini-batches (a2c: one, on the whole step)
            train_start, train_actor = time.perf_counter(), step >= cfg.freeze_actor_steps
            for micro in schedule.update_micro_batches(step):
                for part, given in passes.parts(rollout, micro, experience.update_rows()):
                    cadence.window.add_all(mini_batch_update(models, part, given, cfg, objective, train_actor, passes))

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
            cadence.window.count(**rl.window_counts(rollout, passes.rows_counted))
            cadence.log_samples(step, functools.partial(experience.sample_rows, rollout, rewards, n))
            cadence.after_step(step)

        # ---- final evaluation and Hugging Face export (the policy)
        summary = cadence.finish({"stage": "ppo", "objective": cfg.objective, "train_prompts": len(schedule.prompts)})
    finally:
        rl.close(rewards, episodes)
    summary["kl_coef"] = kl_ctl.value
    if "eval" in summary:
        summary["eval_reward"] = summary["eval"]["reward"]
    models.keep_policy_only()
    return cadence.save_model(tokenizer, summary)
