"""The environment an agent acts in: ``reset(row)`` opens an episode, ``step(assistant_message)`` answers a turn.

The interface is chat-shaped rather than Gymnasium's string-in, string-out, because what a policy reads is a
conversation: the environment hands back whole messages (tool results, a user's next turn), and the rollout
engine renders them with the model's chat template, tools included. One environment object runs one episode
at a time (it may keep state between ``reset`` and the last ``step``); a batch of episodes uses one object
per episode, so heavy state (a search index, a sandbox) belongs in objects they share.

``load_environment("package.module:Class", settings)`` builds one from the ``env.class`` key and the
``env.settings`` of a config. :class:`GymTextEnvironment` adapts a Gymnasium-style text environment
(``reset(seed=, options=) -> (obs, info)``, ``step(action) -> (obs, reward, terminated, truncated, info)``)
without depending on gymnasium: observations become user turns and the assistant's text is the action.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from typing import Any, Protocol, runtime_checkable

from trainer_lib.errors import ConfigError

#: The config key that names an environment class; every loading error starts with it.
ENV_CLASS_KEY = "env.class"


@dataclasses.dataclass(frozen=True)
class Observation:
    """What an episode starts from: the first chat messages and the tools the model may call.

    ``tools`` are JSON schemas in the OpenAI / Hugging Face "function" format, the form
    ``tokenizer.apply_chat_template(messages, tools=...)`` renders; an environment without tools gives ``[]``.
    """

    messages: list[dict]
    tools: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one assistant turn led to.

    ``messages`` are appended to the conversation (tool results, a user's next turn; empty when there is
    nothing to say); ``reward`` is this step's reward; ``done`` ends the episode; ``info`` holds diagnostics
    (``ToolEnvironment`` counts its tool calls and failures there).
    """

    messages: list[dict]
    reward: float
    done: bool
    info: dict = dataclasses.field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """An episode at a time: ``reset`` with a dataset row, then ``step`` once per assistant message."""

    def reset(self, row: dict) -> Observation: ...

    def step(self, assistant_message: dict) -> StepResult: ...


def import_callable(spec: str, key: str = ENV_CLASS_KEY):
    """The class or function named ``package.module:Name`` (modules next to where the command runs importable,
    as with ``python -m``); a bad spec, a missing module or name, or a non-callable is a one-line
    :class:`ConfigError` that starts with ``key``."""
    module_name, sep, attr = str(spec).strip().rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{key}: expected package.module:Class, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}: cannot import module '{module_name}' ({_one_line(exc)})") from None
    found = getattr(module, attr, None)
    if found is None or not callable(found):
        what = "has no attribute" if found is None else "has a non-callable"
        raise ConfigError(f"{key}: module '{module_name}' {what} '{attr}'")
    return found


def load_environment(
    spec: str, settings: dict | None = None, key: str = ENV_CLASS_KEY, settings_key: str | None = None
) -> Environment:
    """Import ``module:Class`` and build it with ``settings`` as keyword arguments (a config's ``env.settings``,
    named ``settings_key`` in errors; by default the keys beside ``key``, ``env.*``).

    Any class or factory function that returns an object with ``reset`` and ``step`` will do. Modules next
    to where the command runs are importable, as with ``python -m``. A bad spec, a missing module or class,
    a setting the class does not take, or a constructor that rejects a value is a one-line
    :class:`ConfigError` that starts with ``key`` (``env.class``), so the user knows which line to fix.
    """
    settings = dict(settings or {})
    factory = import_callable(spec, key)
    _check_settings(factory, settings, spec, key, settings_key or key.rpartition(".")[0] or "env")
    try:
        env = factory(**settings)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{key}: {spec} rejected its settings: {_one_line(exc)}") from None
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise ConfigError(f"{key}: {spec} built a {type(env).__name__}, which has no reset() and step()")
    return env


def _check_settings(factory, settings: dict, spec: str, key: str, prefix: str) -> None:
    """Name the first setting the constructor does not take (as ``prefix.name``), and the ones it does."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return
    try:
        signature.bind(**settings)
    except TypeError as exc:
        params = signature.parameters
        takes = [name for name, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        unknown = [name for name in settings if name not in params]
        missing = [n for n, p in params.items() if p.default is p.empty and n not in settings and n in takes]
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            problem = f"{prefix}.{unknown[0]} is not a setting of {spec}"
        elif missing:
            problem = f"{spec} needs {prefix}.{missing[0]}"
        else:
            problem = f"{spec}: {_one_line(exc)}"
        raise ConfigError(f"{key}: {problem} (it takes: {', '.join(takes) or 'nothing'})") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class GymTextEnvironment:
    """A Gymnasium-style text environment as a chat environment.

    ``env`` is the object itself, or ``"module:Class"`` built with ``env_kwargs`` (so
    ``env.class=trainer_lib.agents.env:GymTextEnvironment env.settings.env=mygames:Guess`` loads one from a
    config).
    ``reset(row)`` calls ``env.reset(seed=row[seed_key], options=row[options_key])`` (None when the row has
    no such column) and gives the observation as the first user turn, after ``instructions`` as a system
    turn when given. ``step`` passes the assistant's content as the action; the observation that comes back
    is the next user turn, the reward is passed through, and ``terminated or truncated`` ends the episode
    (both are kept in ``info``). Gymnasium itself is not needed: any object with these two methods works.
    """

    def __init__(
        self,
        env: Any,
        instructions: str | None = None,
        env_kwargs: dict | None = None,
        seed_key: str = "seed",
        options_key: str = "options",
    ):
        if isinstance(env, str):
            env = load_environment(env, env_kwargs, key="env.env")
        elif env_kwargs:
            raise ValueError("env_kwargs is for an env given as module:Class, not an object")
        self.env = env
        self.instructions = instructions
        self.seed_key = seed_key
        self.options_key = options_key

    def reset(self, row: dict) -> Observation:
        observation, _info = self.env.reset(seed=row.get(self.seed_key), options=row.get(self.options_key))
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages.append({"role": "user", "content": str(observation)})
        return Observation(messages=messages, tools=[])

    def step(self, assistant_message: dict) -> StepResult:
        action = assistant_message.get("content") or ""
        observation, reward, terminated, truncated, info = self.env.step(action)
        text = "" if observation is None else str(observation)
        info = dict(info or {}, terminated=bool(terminated), truncated=bool(truncated))
        return StepResult(
            messages=[{"role": "user", "content": text}] if text else [],
            reward=float(reward),
            done=bool(terminated or truncated),
            info=info,
        )
