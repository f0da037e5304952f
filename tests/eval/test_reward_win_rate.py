"""Reward mean and win rate against a baseline, with hand-computed values."""

import pytest

from trainer_lib.eval.reward_win_rate import reward_metrics, win_rate


def test_win_rate_counts_ties_half():
    assert win_rate([1.0, 0.0, 2.0, 0.5], [0.0, 0.0, 3.0, 0.5]) == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)


def test_reward_metrics_score_every_model_on_the_same_prompts():
    prompts = ["Say hi.", [{"role": "user", "content": "Refuse this."}]]
    seen = []

    def scorer(prompts_, completions):
        seen.append(completions)
        return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]

    answers = {"sft": ["hi", "no"], "dpo": ["hello", "no"], "base": ["", "nope"]}
    metrics = reward_metrics(scorer, prompts, answers, baseline="sft")
    assert list(metrics) == ["sft", "dpo", "base"]
    assert metrics["sft"] == {"reward_mean": 2.0}  # the baseline gets no win rate
    assert metrics["dpo"] == {"reward_mean": 3.5, "reward_win_rate": (1 + 0.5) / 2}
    assert metrics["base"] == {"reward_mean": 2.0, "reward_win_rate": (0 + 1) / 2}
    assert seen[0] == ["hi", [{"role": "assistant", "content": "no"}]]  # chat prompts get an assistant turn
    assert "reward_win_rate" not in reward_metrics(scorer, prompts, answers, baseline=None)["dpo"]
