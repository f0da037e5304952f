"""RLOO (Ahmadian et al. 2024), as ``trl rloo`` runs it: the GRPO loop of :mod:`.grpo` with leave-one-out
advantages, ``A_i = r_i - mean_{j != i} r_j`` over the ``rollout.n`` completions of a prompt.

    posttrain rloo model.path=SFT data.path=PROMPTS output_dir=OUT reward.functions=accuracy_reward

The same as ``posttrain grpo advantage=rloo``; this command exists so that TRL's RLOO files run as they
are. Every other key and default is GRPO's (docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_lib.config import opt
from trainer_lib.stages.training.grpo import ADVANTAGES, GRPOConfig, run

__all__ = ["CONFIG", "RLOOConfig", "run"]


@dataclass
class RLOOConfig(GRPOConfig):
    advantage: str = opt(
        "rloo", "Advantage: leave-one-out (rloo); grpo, dr_grpo and reinforce_pp as in posttrain grpo.", ADVANTAGES
    )


CONFIG = RLOOConfig
