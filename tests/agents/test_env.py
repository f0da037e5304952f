"""The environment interface: loading ``env.class=module:Class`` and the Gymnasium-style text adapter."""

from __future__ import annotations

import random
import re
import textwrap

import pytest

from trainer_lib.agents import GymTextEnvironment, load_environment, run_episode
from trainer_lib.errors import ConfigError


class GuessTheNumber:
    """A text game written the way a Gymnasium environment is: ``reset(seed=, options=) -> (obs, info)``,
    ``step(action) -> (obs, reward, terminated, truncated, info)``."""

    def __init__(self, low: int = 1, high: int = 100, max_guesses: int = 10):
        self.low, self.high, self.max_guesses = low, high, max_guesses

    def reset(self, seed=None, options=None):
        rng = random.Random(seed)
        self.target = (options or {}).get("target", rng.randint(self.low, self.high))
        self.guesses = 0
        return f"Guess my number between {self.low} and {self.high}.", {}

    def step(self, action: str):
        self.guesses += 1
        found = re.search(r"-?\d+", action)
        out_of_guesses = self.guesses >= self.max_guesses
        if found is None:
            return "Answer with a number.", -0.1, False, out_of_guesses, {}
        guess = int(found.group())
        if guess == self.target:
            return "Correct!", 1.0, True, False, {"guesses": self.guesses}
        return ("higher" if guess < self.target else "lower"), 0.0, False, out_of_guesses, {}


def bisecting_player(messages, tools):
    """Reads the game's hints from the conversation and bisects [1, 100]."""
    low, high = 1, 100
    guesses = [int(m["content"]) for m in messages if m["role"] == "assistant"]
    hints = [m["content"] for m in messages if m["role"] == "user"][1:]
    for guess, hint in zip(guesses, hints):
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return {"role": "assistant", "content": str((low + high) // 2)}


def test_a_gymnasium_style_text_game_plays_as_a_chat():
    env = GymTextEnvironment(GuessTheNumber(), instructions="Play the game.")
    result = run_episode(env, {"options": {"target": 37}}, bisecting_player, max_turns=10)
    # 50 (lower), 25 (higher), 37: correct on the third turn.
    assert [m["content"] for m in result.messages] == [
        "Play the game.",
        "Guess my number between 1 and 100.",
        "50",
        "lower",
        "25",
        "higher",
        "37",
        "Correct!",
    ]
    assert [m["role"] for m in result.messages] == ["system", "user"] + ["assistant", "user"] * 3
    assert result.rewards == [0.0, 0.0, 1.0]
    assert result.done_reason == "done"
    assert result.infos[-1] == {"guesses": 3, "terminated": True, "truncated": False}
    assert result.tools == []


def test_a_truncated_game_ends_the_episode_and_says_so():
    env = GymTextEnvironment(GuessTheNumber(max_guesses=2))
    result = run_episode(env, {"options": {"target": 37}}, bisecting_player, max_turns=10)
    assert result.turns == 2
    assert result.done_reason == "done"
    assert result.infos[-1]["truncated"] is True and result.infos[-1]["terminated"] is False


def test_the_seed_column_reaches_reset():
    game = GuessTheNumber()
    GymTextEnvironment(game).reset({"seed": 7})
    assert game.target == random.Random(7).randint(1, 100)


@pytest.fixture
def env_module(tmp_path, monkeypatch):
    """A user's module on the Python path, as ``env.class=my_games:Guess`` would name it."""
    (tmp_path / "my_agent_games.py").write_text(
        textwrap.dedent(
            """
            class Guess:
                def __init__(self, low=1, high=100):
                    if low >= high:
                        raise ValueError(f"low must be below high, got {low} >= {high}")
                    self.low, self.high = low, high
                def reset(self, seed=None, options=None):
                    return f"between {self.low} and {self.high}", {}
                def step(self, action):
                    return "", 1.0, True, False, {}

            class NoMethods:
                pass

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_agent_games"


def test_load_environment_builds_the_class_with_its_settings(env_module):
    game = load_environment(f"{env_module}:Guess", {"low": 5, "high": 9})
    assert (game.low, game.high) == (5, 9)


def test_load_environment_builds_the_gym_adapter_around_a_named_class(env_module):
    env = load_environment(
        "trainer_lib.agents.env:GymTextEnvironment", {"env": f"{env_module}:Guess", "env_kwargs": {"high": 7}}
    )
    assert env.reset({}).messages == [{"role": "user", "content": "between 1 and 7"}]
    assert env.step({"role": "assistant", "content": "3"}).done


@pytest.mark.parametrize(
    "spec, settings, says",
    [
        ("my_agent_games", {}, "expected package.module:Class"),
        ("my_agent_games:", {}, "expected package.module:Class"),
        (":Guess", {}, "expected package.module:Class"),
        ("no_such_module_for_agents:Guess", {}, "cannot import module 'no_such_module_for_agents'"),
        ("my_agent_games:Missing", {}, "has no attribute 'Missing'"),
        ("my_agent_games:NOT_CALLABLE", {}, "non-callable 'NOT_CALLABLE'"),
        ("my_agent_games:NoMethods", {}, "no reset() and step()"),
        ("my_agent_games:Guess", {"lowest": 1}, "env.lowest is not a setting of my_agent_games:Guess"),
        ("my_agent_games:Guess", {"low": 9, "high": 2}, "rejected its settings: low must be below high"),
    ],
)
def test_load_environment_names_env_class_in_a_one_line_error(env_module, spec, settings, says):
    with pytest.raises(ConfigError) as caught:
        load_environment(spec, settings)
    message = str(caught.value)
    assert message.startswith("env.class: ")
    assert says in message
    assert "\n" not in message


def test_a_required_setting_left_out_is_named(env_module, tmp_path):
    (tmp_path / "my_agent_needs.py").write_text("class Needs:\n    def __init__(self, corpus):\n        pass\n")
    with pytest.raises(ConfigError, match=r"^env.class: my_agent_needs:Needs needs env.corpus \(it takes: corpus\)$"):
        load_environment("my_agent_needs:Needs", {})
