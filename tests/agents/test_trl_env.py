"""A TRL-style environment class (TRL 1.16's ``environment_factory`` contract: ``reset(**row)`` returning text for
the last user message, public methods as tools, ``get_reward()``) played through TRLEnvironment: one instance per
episode, its methods offered and called as tools, its reward at the end; a bad factory is a one-line error."""

from __future__ import annotations

import json
import re

import pytest

from trainer_lib.agents import load_environment
from trainer_lib.errors import ConfigError

SPEC = "trainer_lib.agents.trl_env:TRLEnvironment"


class Counter:
    """A counter to bring to the row's target, TRL's way: state on the instance, tools as methods."""

    def reset(self, **row) -> str | None:
        self.count, self.target = 0, row["target"]
        return f" (start at 0, reach {self.target})"

    def increment(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: How much to add.
        """
        self.count += amount
        return f"count={self.count}"

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0

    def _private(self) -> None:  # not a tool
        pass


def call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>",
    }


@pytest.mark.parametrize("steps, reward", [((2, 3), 1.0), ((2,), 0.0)])
def test_a_trl_environment_plays_an_episode(steps, reward):
    env = load_environment(SPEC, {"factory": f"{__name__}:Counter", "timeout": 5.0})
    observation = env.reset({"prompt": "Count to five.", "target": 5})
    assert observation.messages == [{"role": "user", "content": "Count to five. (start at 0, reach 5)"}]
    assert [tool["function"]["name"] for tool in observation.tools] == ["increment"]
    assert observation.tools[0]["function"]["parameters"]["properties"]["amount"]["type"] == "integer"
    total = 0
    for amount in steps:
        total += amount
        result = env.step(call("increment", amount=amount))
        assert not result.done and result.reward == 0.0
        assert result.messages[0]["role"] == "tool" and result.messages[0]["content"] == f"count={total}"
    result = env.step({"role": "assistant", "content": "Done."})
    assert result.done and result.reward == reward
    again = env.reset({"prompt": "Count to one.", "target": 1})  # a fresh instance: the count starts over
    assert again.messages[0]["content"].endswith("reach 1)")
    assert env.step(call("increment", amount=1)).messages[0]["content"] == "count=1"


def test_a_broken_call_is_a_counted_error_not_a_crash():
    env = load_environment(SPEC, {"factory": f"{__name__}:Counter"})
    env.reset({"prompt": "Count.", "target": 1})
    result = env.step(call("increment", amount="lots"))
    assert not result.done and result.messages[0]["content"].startswith("error")
    assert sum(result.info["tool_errors"].values()) == 1


@pytest.mark.parametrize(
    "factory, message",
    [
        ("no_colon", "env.settings.factory: expected package.module:Class"),
        ("nowhere.module:Env", "env.settings.factory: cannot import module 'nowhere.module'"),
        ("json:dumps", "env.settings.factory: json:dumps has no reset() method"),
    ],
)
def test_a_bad_factory_is_one_line_naming_the_key(factory, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_environment(SPEC, {"factory": factory})
