"""The prompt pool's math by hand: draw probabilities, weighted draws without replacement, priority
updates, the saved state, and DAPO's dynamic sampling over stand-in rollouts."""

import math
from types import SimpleNamespace

import pytest
import torch

from trainer_lib.rl.buffer import (
    BufferedSchedule,
    PromptBuffer,
    concat_rollouts,
    group_reward_std,
    reward_deviation,
)
from trainer_lib.rl.rollout import Rollout


def _rows(count: int) -> list[dict]:
    return [{"prompt": f"question {i}", "row": i} for i in range(count)]


def test_probabilities_are_tempered_priorities_mixed_with_uniform():
    buffer = PromptBuffer(_rows(4), seed=0, prioritized=True, temperature=0.5, mix=0.2)
    buffer.priority = [1.0, 0.5, 0.0, 0.25]
    weights = [1.0, 0.25, 0.0, 0.0625]  # p ** (1 / 0.5)
    expected = [0.8 * w / sum(weights) + 0.2 / 4 for w in weights]
    assert buffer.probabilities() == pytest.approx(expected, abs=1e-15)
    assert sum(buffer.probabilities()) == pytest.approx(1.0)
    assert min(buffer.probabilities()) == pytest.approx(0.05)  # the floor: uniform_mix / N
    buffer.priority = [0.0] * 4  # no signal anywhere: uniform
    assert buffer.probabilities() == [0.25] * 4
    uniform = PromptBuffer(_rows(4), seed=0, prioritized=False)
    uniform.priority = [1.0, 0.5, 0.0, 0.25]
    assert uniform.probabilities() == [0.25] * 4


def test_draws_are_distinct_deterministic_and_follow_the_probabilities():
    buffer = PromptBuffer(_rows(5), seed=7, prioritized=True, temperature=1.0, mix=0.0)
    buffer.priority = [8.0, 4.0, 2.0, 1.0, 1.0]  # P = 8/16, 4/16, 2/16, 1/16, 1/16
    draw = buffer.draw(step=3, round_=0, count=3)
    assert len(set(draw)) == 3 and draw == buffer.draw(step=3, round_=0, count=3)
    assert buffer.draw(step=3, round_=1, count=3) != draw or buffer.draw(step=4, round_=0, count=3) != draw
    assert sorted(buffer.draw(step=3, round_=0, count=9)) == [0, 1, 2, 3, 4]  # at most the pool
    assert set(buffer.draw(step=3, round_=0, count=5, exclude={0, 1})) == {2, 3, 4}
    # the first index drawn is a draw with P(i): frequencies over 4000 steps
    firsts = [buffer.draw(step, 0, 1)[0] for step in range(4000)]
    for i, p in enumerate([0.5, 0.25, 0.125, 0.0625, 0.0625]):
        assert abs(firsts.count(i) / 4000 - p) < 0.03, (i, firsts.count(i))
    # a zero-probability prompt (uniform_mix=0) comes last, never instead of a positive one
    buffer.priority = [0.0, 1.0, 1.0, 1.0, 1.0]
    assert all(0 not in buffer.draw(step, 0, 4) for step in range(50))
    assert 0 in buffer.draw(0, 0, 5)


def test_signals_by_hand():
    groups = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    assert group_reward_std(groups, 0.5).tolist() == [0.0, 0.5, math.sqrt(0.75)]
    # |r - 0.5|: 0.5 each; 0.5 each; (0.5 * 3 + 1.5) / 4
    assert reward_deviation(groups, 0.5).tolist() == [0.5, 0.5, 0.75]


def test_updates_additions_and_state_round_trip():
    rows = _rows(4)
    buffer = PromptBuffer(rows, seed=1, prioritized=True)
    buffer.update([2, 0], [0.3, 0.0])
    assert buffer.priority == [0.0, 1.0, 0.3, 1.0] and buffer.visits == [1, 0, 1, 0]
    added = buffer.add([{"prompt": "question 1", "row": None}, {"prompt": "new", "row": None}])
    assert added == 1 and len(rows) == 5 and buffer.priority[-1] == 1.0  # duplicates are skipped
    state = buffer.state_dict()
    assert state["added"] == [{"prompt": "new", "row": None}]
    assert state["priority"].tolist() == [0.0, 1.0, 0.3, 1.0, 1.0] and state["priority"].dtype == torch.float64
    fresh = PromptBuffer(_rows(4), seed=1, prioritized=True)
    fresh.load_state_dict(state)
    assert fresh.rows == rows and fresh.priority == buffer.priority and fresh.visits == buffer.visits
    assert [fresh.draw(s, 0, 3) for s in range(10)] == [buffer.draw(s, 0, 3) for s in range(10)]
    assert fresh.add([{"prompt": "new", "row": None}]) == 0
    fresh.update([1], [float("nan")])  # a reward function's NaN: no signal, not a broken draw
    assert fresh.priority[1] == 0.0 and len(set(fresh.draw(0, 0, 5))) == 5


# --------------------------------------------------------------------------- dynamic sampling


class OneProcess:
    """The strategy of a single process, where every collective returns its input."""

    world_size, rank, is_rank_0, device = 1, 0, True, "cpu"

    def all_reduce(self, value, op="mean"):
        return value

    def print(self, *args):
        pass


def _config(**buffer) -> SimpleNamespace:
    settings = {"mode": "priority", "dynamic_sampling": True, "max_resample_rounds": 2, **buffer}
    return SimpleNamespace(
        seed=0,
        prompts_per_step=4,
        rollout=SimpleNamespace(n=2),
        mini_batch=8,
        batch_size=4,
        ppo_epochs=1,
        num_epochs=0,
        max_steps=10,
        buffer=SimpleNamespace(temperature=1.0, uniform_mix=0.1, **settings),
        data=SimpleNamespace(feedback_path=None),
    )


def _stand_in_run(calls: list):
    """``run(rows, seed)``: two completions per row of ``len(prompt)`` tokens; the rewards of even rows
    are equal (0, 0), those of odd rows differ (0, 1)."""

    def run(rows, seed):
        calls.append([r["row"] for r in rows])
        width = max(len(r["prompt"]) for r in rows)
        prompt = torch.zeros(2 * len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(prompt)
        for i, r in enumerate(rows):
            mask[2 * i : 2 * i + 2, width - len(r["prompt"]) :] = 1
            prompt[2 * i : 2 * i + 2, width - len(r["prompt"]) :] = r["row"] + 1
        response = torch.full((2 * len(rows), 3), 9)
        scores = torch.tensor([float(r["row"] % 2 * j) for r in rows for j in (0, 1)])
        completions = [f"{r['row']}/{j}" for r in rows for j in (0, 1)]
        rollout = Rollout(prompt, mask, response, torch.ones_like(response), completions, [True] * len(completions))
        return rollout, scores, {"reward": float(scores.mean()), "generate_time": 1.0}

    return run


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal():
    rows = [{"prompt": "x" * (1 + i % 3), "row": i} for i in range(12)]
    schedule = BufferedSchedule(
        _config(max_resample_rounds=8), PromptBuffer(rows, 0, True), OneProcess(), group_reward_std
    )
    calls = []
    rollout, scores, metrics = schedule.collect(0, _stand_in_run(calls))
    kept = sorted({int(c.split("/")[0]) for c in rollout.completions})
    first = calls[0]
    assert len(calls) >= 2 and len(calls[1]) == sum(1 for r in first if r % 2 == 0)  # one refill per drop
    assert all(r % 2 == 1 for r in kept) and len(kept) == 4  # only groups whose rewards differ
    assert scores.tolist() == [0.0, 1.0] * 4 and len(rollout) == 8
    # the kept groups' rows are intact: prompt tokens = row + 1 behind left padding, completions in order
    for i, completion in enumerate(rollout.completions):
        row = int(completion.split("/")[0])
        assert rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist() == [row + 1] * len(rows[row]["prompt"])
    dropped = sum(1 for call in calls for r in call if r % 2 == 0)
    assert metrics["dynamic_sampling/dropped_groups"] == dropped
    assert metrics["dynamic_sampling/refilled_groups"] == 4 - sum(1 for r in first if r % 2)
    assert metrics["dynamic_sampling/unfilled_groups"] == 0 and metrics["dynamic_sampling/rounds"] == len(calls)
    assert metrics["generate_time"] == len(calls)  # times add up over the rounds
    # priorities: every drawn prompt's group std (0 for all-equal, 0.5 for 0/1), the rest untouched
    drawn = {r for call in calls for r in call}
    assert all(schedule.buffer.priority[i] == (0.5 if i % 2 else 0.0) for i in drawn)
    assert all(schedule.buffer.priority[i] == 1.0 for i in set(range(12)) - drawn)


def test_dynamic_sampling_is_bounded_and_keeps_the_batch_size():
    rows = [{"prompt": "x", "row": 2 * i} for i in range(10)]  # every group's rewards are equal
    schedule = BufferedSchedule(
        _config(max_resample_rounds=1), PromptBuffer(rows, 0, True), OneProcess(), group_reward_std
    )
    calls = []
    rollout, scores, metrics = schedule.collect(0, _stand_in_run(calls))
    assert len(calls) == 2 and len(rollout) == 8  # one extra round, then dropped groups fill the slots
    assert [int(c.split("/")[0]) for c in rollout.completions[::2]] == calls[0]
    assert metrics["dynamic_sampling/dropped_groups"] == 8 and metrics["dynamic_sampling/unfilled_groups"] == 4
    # without dynamic sampling: one round, the rollout as sampled
    plain = BufferedSchedule(
        _config(dynamic_sampling=False), PromptBuffer(rows, 0, True), OneProcess(), group_reward_std
    )
    calls = []
    rollout, _, metrics = plain.collect(0, _stand_in_run(calls))
    assert len(calls) == 1 and "dynamic_sampling/dropped_groups" not in metrics and metrics["buffer/prompts"] == 10


def test_concat_pads_prompts_left_and_responses_right():
    a = Rollout(
        torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long), torch.tensor([[7]]), torch.ones(1, 1), ["a"], [True]
    )
    b = Rollout(
        torch.tensor([[4, 5, 6]]),
        torch.ones(1, 3, dtype=torch.long),
        torch.tensor([[8, 9]]),
        torch.ones(1, 2),
        ["b"],
        [False],
    )
    both = concat_rollouts([a, b])
    assert both.prompt_ids.tolist() == [[0, 5, 6], [4, 5, 6]] and both.prompt_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert both.response_ids.tolist() == [[7, 0], [8, 9]] and both.response_lengths().tolist() == [1.0, 2.0]
    assert both.completions == ["a", "b"] and both.finished == [True, False]
