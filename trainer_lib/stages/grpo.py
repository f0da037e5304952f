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
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import ConfigError, TrainingConfig, opt
from trainer_lib.schedule import MicroBatchSchedule, total_steps
from trainer_lib.stages.rl_common import RewardSourcesConfig, RolloutConfig, validate_rl


@dataclass
class GRPOConfig(TrainingConfig):
    rollout: RolloutConfig = opt(RolloutConfig, "Sampling of completions.")
    reward: RewardSourcesConfig = opt(RewardSourcesConfig, "Reward sources and post-processing.")
    advantage: str = opt("grpo", "Advantage estimator (and loss averaging, see the stage's docs).",
                         ("grpo", "dr_grpo", "rloo"))
    beta: float = opt(0.04, "Coefficient of the k3 KL(policy || reference) loss term (0: no reference model).")
    epsilon: float = opt(0.2, "Clip range of the probability ratio.")
    prompts_per_step: int = opt(8, "Prompts per step, all ranks together (each gets rollout.n completions).")
    ppo_epochs: int = opt(1, "Passes over each step's completions (TRL's num_iterations).")
    mini_batch_size: int = opt(0, "Completions per optimizer step, all ranks together (0: all of a step).")

    def validate(self) -> None:
        super().validate()
        validate_rl(self)
        if self.rollout.n < 2:
            raise ConfigError("rollout.n: group methods need at least 2 completions per prompt")
        if self.beta < 0 or self.epsilon <= 0:
            raise ConfigError("beta: expected >= 0; epsilon: expected > 0")


CONFIG = GRPOConfig


def advantage_and_loss(cfg: GRPOConfig):
    """(rewards (B,) -> advantages (B,), (per-token loss, mask) -> scalar loss) for ``cfg.advantage``."""
    from trainer_lib.losses.rl import (constant_normalized_sum, grpo_advantages, rloo_advantages,
                                       sequence_mean)

    n = cfg.rollout.n
    return {
        "grpo": (functools.partial(grpo_advantages, group_size=n, scale=True), sequence_mean),
        "dr_grpo": (functools.partial(grpo_advantages, group_size=n, scale=False),
                    functools.partial(constant_normalized_sum, max_tokens=cfg.rollout.max_new_tokens)),
        "rloo": (functools.partial(rloo_advantages, group_size=n), sequence_mean),
    }[cfg.advantage]


def run(cfg: GRPOConfig) -> dict:
    import torch

    from trainer_lib.checkpoint import CheckpointManager
    from trainer_lib.losses.rl import clipped_surrogate, kl_k3, masked_mean
    from trainer_lib.models.load import apply_lora, count_parameters, load_causal_lm, load_tokenizer
    from trainer_lib.rollout import token_logprobs
    from trainer_lib.stages import rl_common as rl
    from trainer_lib.tracking import Tracker

    storage.configure(endpoint_url=cfg.storage.endpoint_url, region=cfg.storage.region,
                      cache_dir=cfg.storage.cache_dir)
    strategy = rl.make_strategy(cfg)
    ckpt = CheckpointManager.for_stage(cfg, strategy)
    world, n, temperature = strategy.world_size, cfg.rollout.n, cfg.rollout.temperature

    # ---- prompts, schedule, models, rewards
    tokenizer = load_tokenizer(cfg.model)
    train_rows, eval_rows = rl.load_prompts(cfg, tokenizer)
    prompts_per_rank = cfg.prompts_per_step // world
    schedule = MicroBatchSchedule(len(train_rows), prompts_per_rank, world, cfg.seed)
    steps = total_steps(cfg, len(train_rows), cfg.prompts_per_step)
    sequences = prompts_per_rank * n
    mini = (cfg.mini_batch_size or cfg.prompts_per_step * n) // world
    policy = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision), cfg.lora)
    rl.disable_dropout(policy)
    trainable, total = count_parameters(policy)
    engine = strategy.prepare(policy, lr=cfg.lr, weight_decay=cfg.weight_decay,
                              total_steps=steps * rl.updates_per_step(cfg), warmup_steps=cfg.warmup_steps,
                              lr_scheduler=cfg.lr_scheduler)
    reference = rl.load_reference(cfg, strategy) if cfg.beta > 0 else None
    rewards = rl.build_rewards(cfg, strategy, tokenizer)
    advantages_of, aggregate = advantage_and_loss(cfg)
    reuse_logprobs = rl.updates_per_step(cfg) == 1  # one update: pi_old is the policy itself

    state = ckpt.restore(engine) if cfg.resume else None
    start = int(state["step"]) if state else 0
    if state:
        rewards.load_state_dict(state["rewards"])
    strategy.print(f"grpo ({cfg.advantage}): {len(train_rows)} train / {len(eval_rows)} eval prompts, {steps} "
                   f"steps of {cfg.prompts_per_step} prompts x {n} completions, {trainable:,}/{total:,} "
                   f"trainable params, world size {world}" + (f", resuming at step {start}" if start else ""))
    tracker = Tracker(ckpt.local_dir, enabled=strategy.is_rank_0, total_steps=steps, initial_step=start, desc="grpo")
    if state is None and eval_rows:
        tracker.log(0, rl.evaluate(engine, strategy, tokenizer, eval_rows, rewards, cfg.rollout, cfg.seed), "eval")

    # ---- the loop
    window: dict[str, float] = defaultdict(float)
    window_steps = 0
    try:
        for step in range(start, steps):
            # 1. rollout: sample, score, group advantages
            rows = [train_rows[schedule.index(step, slot, strategy.rank)[1]] for slot in range(prompts_per_rank)]
            rollout, prompts, columns = rl.sample(engine, strategy, tokenizer, rows, cfg.rollout,
                                                  rl.step_seed(cfg.seed, step, strategy.rank))
            scores, metrics = rl.score(rewards, strategy, rollout, prompts, columns, n)
            advantages = advantages_of(scores)
            # 2. log-probs before the update: pi_old (if it differs from pi) and the reference
            logprob_start = time.perf_counter()
            with torch.no_grad():
                old_logprobs = None if reuse_logprobs else rl.per_micro_batch(
                    lambda part: token_logprobs(engine, part, temperature)[0], rollout, cfg.batch_size)
                ref_logprobs = None if cfg.beta == 0 else rl.per_micro_batch(
                    lambda part: rl.reference_logprobs(reference, engine, part, temperature), rollout, cfg.batch_size)
            # 3. clipped policy-gradient updates over shuffled mini-batches
            train_start = time.perf_counter()
            stats: dict[str, float] = defaultdict(float)
            updates = 0
            for epoch in range(cfg.ppo_epochs):
                order = rl.minibatch_order(sequences, mini, cfg.batch_size,
                                           rl.step_seed(cfg.seed, step, strategy.rank) + epoch)
                for minibatch in order:
                    for micro in minibatch:
                        part = rollout.select(micro)
                        width = part.response_ids.shape[1]
                        mask = part.response_mask.to(strategy.device).float()
                        logprobs, entropy = token_logprobs(engine, part, temperature, with_entropy=True)
                        old = (logprobs.detach() if old_logprobs is None
                               else old_logprobs[micro, :width].to(logprobs.device))
                        adv = advantages[micro].to(logprobs.device).unsqueeze(1)
                        per_token, clipped = clipped_surrogate(logprobs, old, adv, cfg.epsilon)
                        if ref_logprobs is not None:
                            kl = kl_k3(logprobs, ref_logprobs[micro, :width].to(logprobs.device))
                            per_token = per_token + cfg.beta * kl
                            stats["kl"] += float(masked_mean(kl.detach(), mask))
                        loss = aggregate(per_token, mask)
                        strategy.backward(loss, engine)
                        strategy.optimizer_step(engine)
                        stats["loss"] += float(loss.detach())
                        stats["clip_fraction"] += float(masked_mean(clipped, mask))
                        stats["entropy"] += float(masked_mean(entropy, mask))
                        updates += 1
            metrics.update({key: value / updates for key, value in stats.items()})
            metrics.update(logprob_time=train_start - logprob_start, train_time=time.perf_counter() - train_start)
            for key, value in metrics.items():
                window[key] += value
            window_steps += 1

            done = step + 1
            tracker.advance()
            if done % cfg.logging_steps == 0 or done == steps:
                logged = strategy.all_reduce({k: v / window_steps for k, v in window.items()})
                tracker.log(done, {**logged, "lr": engine.get_lr()[0], "grad_norm": strategy.grad_norm(engine)})
                window, window_steps = defaultdict(float), 0
            if eval_rows and cfg.eval_steps and done % cfg.eval_steps == 0 and done != steps:
                tracker.log(done, rl.evaluate(engine, strategy, tokenizer, eval_rows, rewards, cfg.rollout, cfg.seed),
                            "eval")
            if cfg.save_steps and done % cfg.save_steps == 0 and done != steps:
                ckpt.save(engine, done, {"step": done, "rewards": rewards.state_dict()})

        # ---- final evaluation and Hugging Face export
        summary = {"stage": "grpo", "advantage": cfg.advantage, "steps": steps, "train_prompts": len(train_rows),
                   "output_dir": cfg.output_dir}
        if eval_rows:
            final = rl.evaluate(engine, strategy, tokenizer, eval_rows, rewards, cfg.rollout, cfg.seed)
            tracker.log(steps, final, "eval")
            summary["eval_reward"] = final["reward"]
            summary["eval"] = final
        if cfg.save_steps and start < steps:
            ckpt.save(engine, steps, {"step": steps, "rewards": rewards.state_dict()})
    finally:
        rewards.close()
    tracker.close()
    ckpt.finish(engine, tokenizer, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    from trainer_lib.cli import main as cli_main

    return cli_main(["grpo", *(argv or [])])
