"""Episodes: a scripted policy end to end through ToolEnvironment, the limits, the batch and the returns."""

from __future__ import annotations

import json

import pytest

from tests.agents.helpers import accuracy_checker
from trainer_lib.agents import (
    EpisodeBatch,
    Observation,
    StepResult,
    ToolEnvironment,
    calculator_tool,
    returns,
    run_episode,
)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class ScriptedPolicy:
    """Fixed replies, in order; remembers what it was shown each turn."""

    def __init__(self, *replies: str):
        self.replies = list(replies)
        self.seen: list[tuple[list[dict], list[dict]]] = []

    def __call__(self, messages, tools):
        self.seen.append((messages, tools))
        return {"role": "assistant", "content": self.replies[len(self.seen) - 1]}


def calculator_env() -> ToolEnvironment:
    return ToolEnvironment([calculator_tool()], checker=accuracy_checker)


ROW = {"prompt": "A box holds 12 rows of 7 eggs, and 16 more lie beside it. How many eggs?", "answer": "100"}


def test_a_scripted_episode_with_the_calculator_end_to_end():
    policy = ScriptedPolicy(
        "Rows first. " + call("calculator", expression="12 * 7"),
        call("calculator", expression="84 + 16") + call("calculator", expression="84 / 0"),
        "There are 100 eggs.",
    )
    result = run_episode(calculator_env(), ROW, policy, max_turns=5, gamma=0.9)

    assert [(m["role"], m.get("name"), m["content"]) for m in result.messages] == [
        ("user", None, ROW["prompt"]),
        ("assistant", None, policy.replies[0]),
        ("tool", "calculator", "84"),
        ("assistant", None, policy.replies[1]),
        ("tool", "calculator", "100"),
        ("tool", "calculator", "error: division by zero"),
        ("assistant", None, "There are 100 eggs."),
    ]
    # What the policy saw on its second turn: the question, its call and the result; and the tool's schema.
    second_messages, second_tools = policy.seen[1]
    assert second_messages[-1] == {"role": "tool", "name": "calculator", "content": "84"}
    assert [t["function"]["name"] for t in second_tools] == ["calculator"]
    assert result.rewards == [0.0, 0.0, 1.0]
    assert result.done_reason == "done"
    # G_2 = 1; G_1 = 0 + 0.9 * 1 = 0.9; G_0 = 0 + 0.9 * 0.9 = 0.81
    assert result.returns == pytest.approx([0.81, 0.9, 1.0])
    assert result.episode_return == pytest.approx(0.81)
    assert (result.tool_calls.valid, result.tool_calls.malformed, result.tool_calls.errors) == (3, 0, 0)
    assert result.turns == 3


def test_a_wrong_final_answer_scores_zero_and_bad_calls_are_counted():
    policy = ScriptedPolicy(call("calculator", expr="1"), "<tool_call>{bad</tool_call>", "It is 99.")
    result = run_episode(calculator_env(), ROW, policy, max_turns=5)
    assert result.rewards == [0.0, 0.0, 0.0]
    assert result.done_reason == "done"
    assert (result.tool_calls.valid, result.tool_calls.malformed) == (0, 2)


def test_returns_by_hand():
    # G_2 = 2; G_1 = -0.5 + 0.5 * 2 = 0.5; G_0 = 1 + 0.5 * 0.5 = 1.25
    assert returns([1.0, -0.5, 2.0], gamma=0.5) == [1.25, 0.5, 2.0]
    assert returns([1.0, -0.5, 2.0], gamma=1.0) == [2.5, 1.5, 2.0]
    assert returns([1.0, -0.5, 2.0], gamma=0.0) == [1.0, -0.5, 2.0]
    assert returns([], gamma=0.9) == []
    with pytest.raises(ValueError, match="gamma"):
        returns([1.0], gamma=1.5)


def test_max_turns_ends_an_episode_that_never_answers():
    always_calling = ScriptedPolicy(*[call("calculator", expression="1+1")] * 10)
    result = run_episode(calculator_env(), ROW, always_calling, max_turns=3)
    assert result.done_reason == "max_turns"
    assert result.turns == 3 and result.rewards == [0.0, 0.0, 0.0]
    assert result.messages[-1] == {"role": "tool", "name": "calculator", "content": "2"}


def test_a_reply_that_overruns_the_length_budget_ends_the_episode_unstepped():
    prompt_chars = len(ROW["prompt"])
    long_call = call("calculator", expression="1+" * 100 + "1")
    policy = ScriptedPolicy(long_call)
    result = run_episode(
        calculator_env(),
        ROW,
        policy,
        max_turns=5,
        max_total_tokens=prompt_chars + 50,
    )
    assert result.done_reason == "max_total_tokens"
    assert result.messages[-1]["role"] == "assistant"  # kept, but the tool never ran
    assert result.rewards == [0.0] and result.infos == [{}]


def test_the_budget_counts_what_the_environment_adds_too():
    one_call = call("calculator", expression="2**1000")  # a 302-digit answer
    budget = len(ROW["prompt"]) + len(one_call) + 100
    policy = ScriptedPolicy(one_call, "never asked")
    result = run_episode(
        calculator_env(),
        ROW,
        policy,
        max_turns=5,
        max_total_tokens=budget,
    )
    assert result.done_reason == "max_total_tokens"
    assert result.turns == 1 and len(policy.seen) == 1
    assert result.messages[-1]["content"] == str(2**1000)


def test_the_budget_counts_tokens_with_the_callable_given():
    def words(text: str) -> int:  # a stand-in for a tokenizer's count
        return len(text.split())

    policy = ScriptedPolicy("one two three four five six", "The answer is 100")
    result = run_episode(
        calculator_env(),
        ROW,
        policy,
        max_turns=5,
        max_total_tokens=20,
        count_tokens=words,
    )
    assert len(ROW["prompt"].split()) == 17
    assert result.done_reason == "max_total_tokens" and result.turns == 1
    # A prompt that is already over the budget leaves no turn at all.
    empty = run_episode(
        calculator_env(),
        ROW,
        policy,
        max_total_tokens=10,
        count_tokens=words,
    )
    assert empty.done_reason == "max_total_tokens" and empty.turns == 0 and empty.episode_return == 0.0


class CountdownEnv:
    """Done after ``row["steps"]`` turns; each turn's reward is the turn number."""

    def reset(self, row):
        self.steps, self.turn = row["steps"], 0
        return Observation(messages=[{"role": "user", "content": f"count to {self.steps}"}])

    def step(self, assistant_message):
        self.turn += 1
        done = self.turn == self.steps
        return StepResult([{"role": "user", "content": "next"}] * (not done), float(self.turn), done)


@pytest.mark.parametrize("step_workers", [1, 3])
def test_a_batch_advances_many_episodes_a_turn_at_a_time(step_workers):
    rows = [{"steps": 1}, {"steps": 3}, {"steps": 2}]
    envs = [CountdownEnv() for _ in rows]
    batch = EpisodeBatch(envs, rows, max_turns=5, max_total_tokens=1000, step_workers=step_workers)
    waiting = []
    while not batch.finished:
        turns = batch.pending()
        waiting.append([t.index for t in turns])
        assert all(t.messages[-1]["role"] == "user" and t.remaining < 1000 for t in turns)
        batch.advance([{"content": f"turn for {t.index}"} for t in turns])
    assert waiting == [[0, 1, 2], [1, 2], [1]]
    results = batch.results(gamma=1.0)
    assert [r.rewards for r in results] == [[1.0], [1.0, 2.0, 3.0], [1.0, 2.0]]
    assert [r.returns[0] for r in results] == [1.0, 6.0, 3.0]
    assert all(r.done_reason == "done" for r in results)
    assert results[1].messages[1] == {"role": "assistant", "content": "turn for 1"}


def test_a_batch_checks_its_replies():
    batch = EpisodeBatch([CountdownEnv(), CountdownEnv()], [{"steps": 2}, {"steps": 2}])
    batch.pending()
    with pytest.raises(ValueError, match="1 replies for 2 pending"):
        batch.advance([{"content": "only one"}])
    with pytest.raises(ValueError, match="one environment per episode"):
        EpisodeBatch([CountdownEnv()], [{"steps": 1}, {"steps": 1}])


@pytest.mark.parametrize("step_workers", [1, 2])
def test_an_engine_that_counts_the_budget_itself_ends_episodes_with_it(step_workers):
    """A rollout engine counting the trajectory's tokens says which replies ran into its budget (kept, not
    stepped) and ends an episode left without room between turns."""
    rows = [{"steps": 3}, {"steps": 3}, {"steps": 3}]
    batch = EpisodeBatch([CountdownEnv() for _ in rows], rows, max_turns=5, step_workers=step_workers)
    batch.pending()
    batch.advance([{"content": "a"}, {"content": "b"}, {"content": "cut sho"}], overran=[False, False, True])
    batch.episodes[1].end("max_total_tokens")
    assert [t.index for t in batch.pending()] == [0]
    with pytest.raises(ValueError, match="2 overran flags for 1 replies"):
        batch.advance([{"content": "c"}], overran=[False, True])
    batch.episodes[0].end("max_turns")
    results = batch.results()
    assert [r.done_reason for r in results] == ["max_turns", "max_total_tokens", "max_total_tokens"]
    assert [r.rewards for r in results] == [[1.0], [1.0], [0.0]]
    assert results[2].messages[-1] == {"role": "assistant", "content": "cut sho"} and results[2].infos == [{}]
    with pytest.raises(RuntimeError, match="has ended"):
        batch.episodes[0].end("done")
    with pytest.raises(ValueError, match="reason must be one of"):
        EpisodeBatch([CountdownEnv()], [{"steps": 1}]).episodes[0].end("tired")
