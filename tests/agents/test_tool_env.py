"""ToolEnvironment: every way a tool call can fail is a message and a count, never an exception from step."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.agents.helpers import accuracy_checker
from trainer_lib.agents import ToolEnvironment, calculator_tool, tool_from_function
from trainer_lib.errors import DataError

RELEASE = threading.Event()  # lets the hanging tool's abandoned thread end when the module's tests are done


@pytest.fixture(scope="module", autouse=True)
def release_hung_threads():
    yield
    RELEASE.set()


def explode(reason: str) -> str:
    """Fail on purpose.

    Args:
        reason: Why.
    """
    raise RuntimeError(f"kaput: {reason}\nsecond line of the message")


def hang(seconds: float) -> str:
    """Never come back (in time).

    Args:
        seconds: How long to wait at most.
    """
    RELEASE.wait(seconds)
    return "too late"


def flood(size: int) -> str:
    """Return a lot of text.

    Args:
        size: How many characters.
    """
    return "x" * size


MEETING = threading.Barrier(2)  # two calls can meet only if they run at the same time


def meet(who: str) -> str:
    """Wait (at most 2 s) for a second caller, then say who came.

    Args:
        who: Who calls.
    """
    MEETING.wait(timeout=2)
    return f"{who} met"


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def environment(**limits) -> ToolEnvironment:
    tools = [calculator_tool(), *(tool_from_function(f) for f in (explode, hang, flood, meet))]
    return ToolEnvironment(tools, checker=accuracy_checker, **limits)


ROW = {"prompt": "What is 6 times 7?", "answer": "42"}


def test_reset_gives_the_question_and_the_tools():
    env = environment(system_prompt="Use the tools.")
    observation = env.reset(ROW)
    assert observation.messages == [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What is 6 times 7?"},
    ]
    assert [t["function"]["name"] for t in observation.tools] == ["calculator", "explode", "hang", "flood", "meet"]
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert env.reset({"prompt": conversation, "answer": "1"}).messages == conversation  # its own system turn kept
    assert env.reset({"question": "Q?", "answer": "1"}).messages[-1] == {"role": "user", "content": "Q?"}
    with pytest.raises(DataError, match="prompt"):
        env.reset({"answer": "1"})


def test_each_failure_is_an_error_message_and_a_count():
    env = environment(timeout=0.5, max_output_chars=4000)
    env.reset(ROW)
    text = "\n".join(
        [
            call("calculator", expr="6*7"),  # malformed: the argument is named expression
            "<tool_call>{not json}</tool_call>",  # malformed
            call("explode", reason="test"),  # raises
            call("hang", seconds=30),  # times out
            call("flood", size=1_000_000),  # a megabyte, cut
            call("calculator", expression="6*7"),  # fine
        ]
    )
    started = time.monotonic()
    result = env.step(assistant(text))
    elapsed = time.monotonic() - started
    assert elapsed < 5  # the hung call was abandoned after its 0.5 s
    assert not result.done and result.reward == 0.0
    assert result.info == {
        "tool_calls": 4,
        "tool_errors": {"malformed": 2, "raised": 1, "timeout": 1, "truncated": 1},
    }
    contents = [m["content"] for m in result.messages]
    assert [m["role"] for m in result.messages] == ["tool"] * 6
    assert [m["name"] for m in result.messages] == ["calculator", "error", "explode", "hang", "flood", "calculator"]
    assert contents[0] == "error: calculator: missing required argument expression"
    assert contents[1].startswith("error: not valid JSON")
    assert contents[2] == "error: explode raised RuntimeError: kaput: test"
    assert contents[3] == "error: hang did not finish within 0.5 s"
    assert contents[4].startswith("x" * 4000 + "\n[truncated: the output was 1,000,000 characters")
    assert len(contents[4]) < 4100
    assert contents[5] == "42"


def test_hung_calls_holding_every_worker_do_not_block_the_step():
    env = environment(timeout=0.3, max_concurrency=1)
    env.reset(ROW)
    started = time.monotonic()
    result = env.step(assistant(call("hang", seconds=30) + call("hang", seconds=30)))
    assert time.monotonic() - started < 3
    assert result.info["tool_errors"]["timeout"] == 2
    assert result.messages[0]["content"] == "error: hang did not finish within 0.3 s"
    assert "could not start" in result.messages[1]["content"]
    # The next step has fresh workers: the abandoned threads do not hold it up.
    assert env.step(assistant(call("calculator", expression="1+1"))).messages[0]["content"] == "2"


def test_calls_run_concurrently_up_to_max_concurrency():
    """Two calls that each wait for the other finish only when both run at once."""
    two_meet = assistant(call("meet", who="a") + call("meet", who="b"))
    env = environment(max_concurrency=2)
    env.reset(ROW)
    assert [m["content"] for m in env.step(two_meet).messages] == ["a met", "b met"]
    MEETING.reset()
    env = environment(max_concurrency=1)  # one at a time: the first waits alone until the barrier breaks
    env.reset(ROW)
    result = env.step(two_meet)
    assert [m["content"] for m in result.messages] == [
        "error: meet raised BrokenBarrierError",
        "error: meet raised BrokenBarrierError",
    ]
    assert result.info["tool_errors"]["raised"] == 2
    MEETING.reset()


def test_calls_beyond_max_calls_per_step_are_refused():
    env = environment(max_calls_per_step=2)
    env.reset(ROW)
    result = env.step(assistant("".join(call("calculator", expression=f"{n}+1") for n in range(3))))
    assert [m["content"] for m in result.messages] == ["1", "2", "error: more than 2 tool calls in one message"]
    assert result.info == {
        "tool_calls": 2,
        "tool_errors": {"malformed": 1, "raised": 0, "timeout": 0, "truncated": 0},
    }


def test_a_message_without_a_call_is_the_final_answer():
    env = environment()
    env.reset({"prompt": "How many?", "answer": "He sold 1,080 in all.\n#### 1,080"})
    result = env.step(assistant("First 1000, then 80 more: 1,080"))
    assert result.done and result.reward == 1.0 and result.messages == []
    assert result.info["tool_calls"] == 0
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(assistant("again"))


def test_the_final_answer_is_scored_by_the_checker():
    env = environment()
    env.reset(ROW)
    assert env.step(assistant("So the answer is 42.")).reward == 1.0
    env.reset(ROW)
    assert env.step(assistant("It is 43.")).reward == 0.0


def test_a_custom_checker_gives_the_reward():
    env = ToolEnvironment([calculator_tool()], checker=lambda answer, row: len(answer) / 10)
    env.reset(ROW)
    assert env.step(assistant("0123456789")).reward == 1.0
