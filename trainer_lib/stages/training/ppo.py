"""PPO with a critic, GAE and KL control (Ouyang et al. 2022; Ziegler et al. 2019).

    posttrain ppo model.path=SFT data.path=PROMPTS output_dir=OUT reward.model_path=RM

Actor and critic are separate DeepSpeed engines; the reference policy is a frozen copy of
``model.path`` (under LoRA: the actor with its adapters disabled). Every step:

1. sample ``rollout.n`` completions for each of ``prompts_per_step`` prompts and score them;
2. with the weights that sampled them, compute per-token log-probs (actor, reference) and
   values (critic);
3. fold the KL penalty into per-token rewards, the score landing on the last token:
       r_t = -beta * KL_t  (+ score on the final token),   KL_t by ``kl.estimator``
4. GAE advantages and returns (``gamma``, ``lam``), advantages optionally whitened;
5. ``ppo_epochs`` passes over shuffled mini-batches: clipped policy loss on the actor,
   clipped value loss on the critic, one optimizer step each per mini-batch (the actor's
   only after ``freeze_actor_steps``);
6. adapt beta towards ``kl.target`` if ``kl.adaptive``.

The critic is a sequence-classification model (scalar head ``score``) read at every token:
it starts from ``critic.path`` (default: the reward model, else the policy with a new head)
and must share the policy's tokenizer.

With ``multi_adapter=true`` (and LoRA) the four models are one frozen base with adapters
(:mod:`trainer_lib.models.multi_adapter`): policy and value adapters (plus the value head) in one
engine, the reference as the base with adapters disabled, a LoRA reward model of the same base as
a frozen adapter. Step 5 then takes ONE optimizer step per mini-batch on
``policy_loss + vf_coef * value_loss``, the value adapter and head in a parameter group at
``critic_lr``. Unlike two engines: the gradient is clipped as one vector, and the policy's LR
schedule counts from step 0 (during ``freeze_actor_steps`` the policy term is left out and its
group's lr is 0 for the step).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from trainer_lib.config import opt
from trainer_lib.config.rl import RLConfig
from trainer_lib.errors import ConfigError


@dataclass
class KLConfig:
    coef: float = opt(0.05, "KL penalty coefficient beta (initial value when adaptive; 0: no reference model).")
    estimator: str = opt("k1", "Per-token KL estimator folded into the reward.", ("k1", "k2", "k3"))
    adaptive: bool = opt(False, "Adapt the coefficient towards kl.target (Ziegler et al. 2019).")
    target: float = opt(6.0, "Adaptive control: target KL per completion (nats, summed over tokens).")
    horizon: int = opt(10000, "Adaptive control: horizon in completions.")


@dataclass
class CriticConfig:
    path: str | None = opt(
        None,
        "Critic initialization: a reward model or causal LM (default: "
        "reward.model_path, else model.path, with a new scalar head).",
    )


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
    freeze_actor_steps: int = opt(
        0,
        "Train only the critic for the first N steps, so a new value head "
        "does not steer the policy with noise (OpenRLHF's freezing_actor_steps).",
    )

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


def token_values(critic, rollout):
    """Critic values ``(N, R)``: the scalar head read at the positions that predict each response
    token, i.e. V(prompt, response_<t)."""
    outputs = []
    head = next(m for name, m in critic.named_modules() if name.rsplit(".", 1)[-1] == "score")
    hook = head.register_forward_hook(lambda module, args, out: outputs.append(out))
    try:
        critic(**rollout.model_inputs(next(critic.parameters()).device), use_cache=False)
    finally:
        hook.remove()
    width = rollout.response_ids.shape[1]
    return outputs[-1][:, -(width + 1) : -1, 0].float() * rollout.response_mask.to(outputs[-1].device)


def load_critic(cfg: PPOConfig, pad_token_id: int, vocab: int):
    from trainer_lib.errors import UserError
    from trainer_lib.models.heads import apply_reward_lora, load_reward_model

    path = cfg.critic.path or cfg.reward.model_path or cfg.model.path
    critic = load_reward_model(cfg.model, pad_token_id, cfg.engine.precision, path=path)  # model.revision: policy only
    if critic.config.vocab_size < vocab:
        raise UserError(
            f"critic.path: {path} has a vocabulary of {critic.config.vocab_size} tokens, the policy's "
            f"tokenizer {vocab}; the critic must share the policy's tokenizer"
        )
    return apply_reward_lora(critic, cfg.lora)


def critic_log(strategy, actor_engine, critic_engine) -> dict:
    """The critic's lr and gradient norm (multi_adapter: its parameter group's lr; the norm is the actor's)."""
    if critic_engine is not None:
        return {"critic_lr": critic_engine.get_lr()[0], "critic_grad_norm": strategy.grad_norm(critic_engine)}
    from trainer_lib.models.multi_adapter import VALUE

    return {"critic_lr": next(g["lr"] for g in actor_engine.optimizer.param_groups if g.get("name") == VALUE)}


def run(cfg: PPOConfig) -> dict:
    import torch

    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.losses import (
        KLController,
        explained_variance,
        gae_advantages,
        kl_penalty,
        masked_mean,
        masked_whiten,
        ppo_policy_loss,
        ppo_value_loss,
    )
    from trainer_lib.models import multi_adapter
    from trainer_lib.models.load import apply_lora, count_parameters, disable_dropout, load_causal_lm
    from trainer_lib.rl import experience as rl
    from trainer_lib.rl.rollout import token_logprobs

    # ---- prompts, schedule, actor, critic, reference, rewards
    strategy, tokenizer, eval_rows, schedule = rl.start(cfg)
    steps, n, temperature = schedule.steps, cfg.rollout.n, cfg.rollout.temperature
    updates = steps * cfg.updates_per_step()
    actor_updates = (steps - min(cfg.freeze_actor_steps, steps - 1)) * cfg.updates_per_step()
    use_reference = cfg.kl.coef > 0
    shared = None
    if cfg.multi_adapter:  # one frozen base; the actor engine also trains the value adapter and head
        shared = multi_adapter.build(cfg, strategy, with_value=True)
        actor = shared.model
        disable_dropout(actor)
        groups = functools.partial(multi_adapter.param_group, lr=cfg.lr, critic_lr=cfg.critic_lr or cfg.lr)
        actor_engine = strategy.prepare(actor, total_steps=updates, **cfg.optimizer_args(), param_group=groups)
        critic_engine = None
        reference = shared.reference() if use_reference else None
        rewards = rl.build_rewards(cfg, strategy, tokenizer, reward_model=shared.reward_model())
    else:
        actor = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision), cfg.lora)
        critic = load_critic(cfg, tokenizer.pad_token_id, len(tokenizer))
        for model in (actor, critic):
            disable_dropout(model)
        actor_engine = strategy.prepare(actor, total_steps=actor_updates, **cfg.optimizer_args())
        critic_engine = strategy.prepare(
            critic, total_steps=updates, **{**cfg.optimizer_args(), "lr": cfg.critic_lr or cfg.lr}
        )
        reference = rl.load_reference(cfg, strategy) if use_reference else None
        rewards = rl.build_rewards(cfg, strategy, tokenizer)

    def values_of(part):
        return shared.token_values(part) if shared else token_values(critic_engine, part)

    kl_ctl = KLController(cfg.kl.coef, cfg.kl.target if cfg.kl.adaptive else None, cfg.kl.horizon)

    def restore_state(state: dict) -> None:
        rewards.load_state_dict(state["rewards"])
        kl_ctl.load_state_dict(state["kl_controller"])

    cadence = Cadence(
        cfg,
        strategy,
        "ppo",
        steps,
        actor_engine,
        parameters=count_parameters(actor),
        extra_engines={"critic": critic_engine} if critic_engine else {},
        evaluate=rl.held_out_evaluation(actor_engine, strategy, tokenizer, eval_rows, rewards, cfg),
        client_state=lambda step: {"rewards": rewards.state_dict(), "kl_controller": kl_ctl.state_dict()},
        restore_state=restore_state,
        log_extra=lambda: critic_log(strategy, actor_engine, critic_engine),
    )
    try:
        cadence.restore(
            f"{len(schedule.prompts)} train / {len(eval_rows)} eval prompts, {cfg.prompts_per_step} prompts x "
            f"{n} completions per step (trainable params: the actor's"
            f"{', the value adapter and head' if shared else ''})"
        )

        # ---- the loop
        for step in cadence.steps():
            rewards.trainer_state = schedule.trainer_state(step)  # reward functions may read the step
            # 1. rollout and scores
            rollout, scores, metrics = rl.sample_and_score(
                actor_engine, strategy, tokenizer, schedule.rows(step), cfg, rewards, schedule.sampling_seed(step)
            )

            # 2-4. log-probs and values of the sampling weights, KL-shaped rewards, GAE
            prep_start = time.perf_counter()
            mask = rollout.response_mask.float()
            with torch.no_grad():
                old_logprobs = rl.per_micro_batch(
                    lambda part: token_logprobs(actor_engine, part, temperature)[0], rollout, cfg.batch_size
                )
                old_values = rl.per_micro_batch(values_of, rollout, cfg.batch_size)
                if use_reference:
                    ref_logprobs = rl.per_micro_batch(
                        lambda part: rl.reference_logprobs(reference, actor_engine, part, temperature),
                        rollout,
                        cfg.batch_size,
                    )
                    kl = kl_penalty(old_logprobs, ref_logprobs, cfg.kl.estimator) * mask
                else:
                    kl = torch.zeros_like(mask)
            token_rewards = -kl_ctl.value * kl
            last = (rollout.response_lengths() - 1).clamp(min=0)
            token_rewards[torch.arange(len(rollout)), last] += scores
            advantages, returns = gae_advantages(token_rewards, old_values, mask, cfg.gamma, cfg.lam)
            if cfg.whiten_advantages:
                advantages = masked_whiten(advantages, mask) * mask

            # 5. clipped policy and value updates over shuffled mini-batches
            train_start = time.perf_counter()
            train_actor = step >= cfg.freeze_actor_steps
            for micro in schedule.update_micro_batches(step):
                part = rollout.select(micro)
                width = part.response_ids.shape[1]
                part_mask = part.response_mask.to(strategy.device).float()

                def cut(tensor, micro=micro, width=width):
                    return tensor[micro, :width].to(strategy.device)

                with torch.set_grad_enabled(train_actor):
                    logprobs, entropy = token_logprobs(actor_engine, part, temperature, with_entropy=True)
                    policy_loss, policy_stats = ppo_policy_loss(
                        logprobs, cut(old_logprobs), cut(advantages), part_mask, cfg.clip_range
                    )
                if train_actor and not shared:
                    strategy.backward(policy_loss, actor_engine)
                    strategy.optimizer_step(actor_engine)

                values = values_of(part)
                value_loss, value_stats = ppo_value_loss(
                    values, cut(old_values), cut(returns), part_mask, cfg.value_clip_range
                )
                if shared:  # one engine over both adapters: one loss, one step (see the module docs)
                    multi_adapter.freeze_policy_group(actor_engine, frozen=not train_actor)
                    strategy.backward(cfg.vf_coef * value_loss + (policy_loss if train_actor else 0.0), actor_engine)
                    strategy.optimizer_step(actor_engine)
                else:
                    strategy.backward(cfg.vf_coef * value_loss, critic_engine)
                    strategy.optimizer_step(critic_engine)
                cadence.window.add_all(
                    {
                        "policy_loss": policy_loss,
                        "value_loss": value_loss,
                        "entropy": masked_mean(entropy, part_mask),
                        **policy_stats,
                        **value_stats,
                    }
                )

            # 6. statistics and KL control
            sequence_kl = float(strategy.all_reduce(kl.sum(1).mean()))
            cadence.window.add_all(
                {
                    **metrics,
                    "kl": sequence_kl,
                    "kl_coef": kl_ctl.value,
                    "non_score_reward": float(token_rewards.sum(1).mean() - scores.mean()),
                    "explained_variance": float(explained_variance(old_values, returns, mask)),
                    "value_mean": float(masked_mean(old_values, mask)),
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
    if shared:
        shared.keep_policy_only()  # the output is the policy (merged per lora.merge), as without multi_adapter
    return cadence.save_model(tokenizer, summary)
