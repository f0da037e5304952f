"""What the online RL stages (``ppo``, ``grpo``) share; each stage's loop stays in its own file.

* :mod:`trainer_lib.config.rl`: the RL config sections and keys, their validation, and the
  engine settings derived from them (gradient accumulation from the mini-batch size).
* :mod:`trainer_lib.rl.experience`: experience making: prompts, sampling, scoring with the
  reward sources, reference log-probs, per-micro-batch forward passes, held-out evaluation.
* :mod:`trainer_lib.rl.actor_critic`: the stage's models (actor, PPO's critic, reference, reward
  sources) in one of two layouts with the same methods: separate engines, or one shared base with
  adapters (``multi_adapter=true``).
* :mod:`trainer_lib.rl.prompts`: which prompts each rank takes at each step, the sampling seed,
  and the walk over shuffled mini-batches of micro-batches in the update phase.
* :mod:`trainer_lib.rl.buffer`: the live prompt pool (``buffer.mode`` uniform or priority):
  priorities learned from each group's rewards, DAPO's dynamic sampling, state in checkpoints.
* :mod:`trainer_lib.rl.feedback`: prompt files read from ``data.feedback_path`` while training runs.
* :mod:`trainer_lib.rl.nlpo`: the policy's action space: every token, or NLPO's nucleus mask.
"""
