"""The training recipes: one module per algorithm (sft, reward, dpo, ppo, grpo), each a typed ``CONFIG``
and a ``run(cfg)`` whose loop reads as the algorithm, around the shared cadence (trainer_lib.loop).
``rloo`` and ``kto`` are GRPO's and DPO's loops under TRL's command names, with their own defaults."""
