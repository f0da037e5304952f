"""TRL's environment classes as posttrain environments: ``env.class=trainer_lib.agents.trl_env:TRLEnvironment
env.settings.factory=package.module:MyEnv``.

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` (experimental there) takes a class whose instance is one
episode's state: ``reset(**row)`` starts it and returns None or text to append to the row's last user
message; its other public methods, with type hints and Google-style docstrings, are the tools the model may
call; an optional ``get_reward()`` scores the finished rollout. This adapter builds one instance per episode
and plays it through :class:`~trainer_lib.agents.tool_env.ToolEnvironment`: the methods become tools
(schemas by ``transformers.utils.get_json_schema``, as TRL builds them), calls run with ToolEnvironment's
timeout, concurrency and output limits and count their failures, and the answer without a tool call ends the
episode with ``get_reward()`` as its reward (0.0 without one; ``reward.functions`` may score the answer
beside it). TRL itself is not needed: the class is plain Python.
"""

from __future__ import annotations

import inspect

from trainer_lib.agents.env import Observation, StepResult, import_callable
from trainer_lib.agents.tool_env import ToolEnvironment
from trainer_lib.agents.tools import tool_from_function
from trainer_lib.errors import ConfigError

#: methods of a TRL environment that are not tools
NOT_TOOLS = ("reset", "get_reward")


class TRLEnvironment:
    """A TRL-style environment class (``factory``: ``package.module:Class``, built with no arguments, as TRL's
    factory is called) played as a posttrain environment; the other settings are ToolEnvironment's limits."""

    def __init__(self, factory: str, system_prompt: str | None = None, **limits):
        self.factory, self.system_prompt, self.limits = _load_class(factory), system_prompt, limits
        self.episode: ToolEnvironment | None = None

    def reset(self, row: dict) -> Observation:
        instance = self.factory()
        opening = instance.reset(**row)
        methods = [
            getattr(instance, name)
            for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in NOT_TOOLS
        ]
        reward = getattr(instance, "get_reward", None)
        self.episode = ToolEnvironment(
            [tool_from_function(method) for method in methods],
            lambda answer, row: float(reward()) if callable(reward) else 0.0,
            self.system_prompt,
            **self.limits,
        )
        observation = self.episode.reset(row)
        if opening:
            last = max(i for i, m in enumerate(observation.messages) if m.get("role") == "user")
            observation.messages[last] = {
                **observation.messages[last],
                "content": observation.messages[last]["content"] + str(opening),
            }
        return observation

    def step(self, assistant_message: dict) -> StepResult:
        if self.episode is None:
            raise RuntimeError("TRLEnvironment.step before reset")
        return self.episode.step(assistant_message)


def _load_class(spec: str):
    """The class named ``package.module:Class``, with a ``reset`` method (TRL's ``environment_factory`` contract)."""
    cls = import_callable(spec, "env.settings.factory")
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"env.settings.factory: {spec} has no reset() method (TRL's environment_factory contract)")
    return cls
