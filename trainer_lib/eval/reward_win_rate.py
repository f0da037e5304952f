"""The reward model's view of several models: mean reward, and win rate against a baseline.

Every model answers the same prompts; the reward model scores each answer.

    reward_mean       mean reward of a model's answers
    reward_win_rate   P(reward(model) > reward(baseline)) over the prompts, ties counting half
"""

from __future__ import annotations

from trainer_lib.rewards.functions import as_completions


def win_rate(rewards: list[float], baseline_rewards: list[float]) -> float:
    """Fraction of prompts where ``rewards`` beats the baseline's reward on the same prompt; a tie counts half."""
    wins = [1.0 if r > b else 0.5 if r == b else 0.0 for r, b in zip(rewards, baseline_rewards)]
    return sum(wins) / len(wins)


def reward_metrics(scorer, prompts: list, answers: dict[str, list[str]], baseline: str | None) -> dict[str, dict]:
    """``{label: {"reward_mean", "reward_win_rate"}}`` for the models' ``answers`` to ``prompts`` (one
    answer per prompt), scored by ``scorer(prompts, completions) -> rewards``; the baseline itself, or
    every model when there is no baseline, gets no win rate."""
    rewards = {label: scorer(prompts, as_completions(prompts, texts)) for label, texts in answers.items()}
    metrics = {}
    for label, values in rewards.items():
        metrics[label] = {"reward_mean": sum(values) / len(values)}
        if baseline and label != baseline:
            metrics[label]["reward_win_rate"] = win_rate(values, rewards[baseline])
    return metrics
