"""What the agent tests share: the answer checker, built from a reward function as the RL stage builds it."""

from __future__ import annotations

from trainer_lib.rewards.math_answer import AccuracyReward

ACCURACY = AccuracyReward()


def accuracy_checker(answer: str, row: dict) -> float:
    """The final answer scored by ``accuracy_reward`` against the row's ``answer`` (its ``solution``)."""
    return ACCURACY([row["prompt"]], [answer], solution=[row["answer"]])[0] or 0.0
