"""Reward functions: the built-ins and user functions named ``module:function`` in the config.

Every reward function has the signature TRL users already write::

    def reward(prompts: list, completions: list, **columns) -> list[float | None]

``prompts`` are the dataset's prompts as they are (a string, or a list of messages for
conversational data) and ``completions`` the generated texts (for conversational prompts a
one-message list ``[{"role": "assistant", "content": text}]``, as TRL passes them). Every
other dataset column arrives as a keyword list aligned with the completions, plus
``completion_ids`` (token ids) and, during training, ``trainer_state`` (a :class:`TrainerState`:
``global_step``, ``epoch``, ``max_steps``, as TRL passes transformers') to functions that take it
by name or take ``**kwargs``. ``None`` means "does not apply" and is left out of the sum.

Built-ins: ``code_execution`` (unit tests in the sandbox), ``code_style`` (pycodestyle),
``code_ast`` (syntax-tree checks without running the code: :mod:`trainer_lib.rewards.syntax_tree`),
``length_penalty``, ``refusal`` (a rule-based safety reward for prompts labelled harmful or
benign), and TRL's ``accuracy_reward`` (a math answer checked against the ``solution`` column:
:mod:`trainer_lib.rewards.math_answer`; ``reasoning_accuracy_reward`` reads only what follows ``</think>``)
and ``think_format_reward``. User functions:
``package.module:function`` (imported from ``sys.path`` and the working directory) or
``path/to/file.py:function``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import numbers
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from trainer_lib.data.formats import generated_text
from trainer_lib.errors import UserError

RewardFn = Callable[..., list]

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


@dataclass(frozen=True)
class TrainerState:
    """Where training is when completions are scored (the fields of transformers' ``TrainerState``
    that reward functions written for TRL read)."""

    global_step: int  # optimizer steps done before this one: 0 while scoring the first step's samples
    epoch: float  # passes over the training prompts so far, fractional
    max_steps: int  # steps the run trains for


def takes_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` accepts the keyword argument ``name`` (by that name or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension callable without a signature
        return False
    return any(
        p.kind is p.VAR_KEYWORD or (p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


def as_completions(prompts: list, texts: list[str]) -> list:
    """Generated texts as reward sources take them (one prompt per text): the text itself, or an
    assistant turn for chat prompts."""
    return [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts)]


def extract_code(text: str) -> str:
    """The first fenced code block of ``text`` if it has one, else the whole text."""
    match = _FENCE.search(text)
    return match.group(1) if match else text


# --------------------------------------------------------------------------- built-ins


class CodeExecution:
    """Fraction of a task's unit tests that the completion's code passes: ``tests`` is a column
    with a list of assert statements per row; rows without tests get ``None``.

    Each program runs in the sandbox shared with the evaluation stage (own process and uid, no
    network, read-only filesystem with an empty private working dir, scrubbed environment,
    time and memory limits). The worker pool starts on first use and lives until ``close()``.
    """

    def __init__(self, timeout: float = 3.0, max_workers: int = 4):
        self.timeout, self.max_workers = timeout, max_workers
        self._sandbox = None

    def __call__(self, prompts, completions, *, tests, **columns) -> list[float | None]:
        from trainer_lib.sandbox import Program, Sandbox, SandboxConfig

        programs, rows = [], []
        for i, (completion, row_tests) in enumerate(zip(completions, tests)):
            if row_tests:
                programs.append(Program(extract_code(generated_text(completion)), tuple(row_tests)))
                rows.append(i)
        rewards: list[float | None] = [None] * len(completions)
        if programs:
            if self._sandbox is None:
                self._sandbox = Sandbox(SandboxConfig(timeout=self.timeout), max_workers=self.max_workers)
            for i, result in zip(rows, self._sandbox.run_many(programs, timeout=self.timeout)):
                rewards[i] = result.pass_fraction
        return rewards

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


def style_violations(code: str, max_line_length: int = 79) -> int:
    """Number of PEP 8 violations pycodestyle finds in ``code`` (it only tokenizes, never runs it)."""
    import pycodestyle

    if not code.endswith("\n"):
        code += "\n"  # a missing final newline is the generator's framing, not the code's style
    guide = pycodestyle.StyleGuide(quiet=True, max_line_length=max_line_length)
    checker = pycodestyle.Checker(lines=code.splitlines(True), options=guide.options)
    return checker.check_all()


def code_style(prompts, completions, **columns) -> list[float]:
    """``1.0 - 0.1 * violations`` (pycodestyle, default rules), floored at 0."""
    return [max(0.0, 1.0 - 0.1 * style_violations(extract_code(generated_text(c)))) for c in completions]


def code_ast(
    prompts,
    completions,
    *,
    tests=None,
    entry_point=None,
    max_chars: int = 20_000,
    max_nodes: int = 5_000,
    max_depth: int = 100,
    **columns,
) -> list[float]:
    """The syntax-tree reward of each completion, in [0, 1]: a quarter each for parsing, defining the
    entry point, fitting its calls in ``tests`` and being clean (see :mod:`trainer_lib.rewards.syntax_tree`).

    ``tests``/``entry_point``: the row's columns (either may be absent). ``max_chars``: longer code
    scores 0 unparsed; ``max_nodes``/``max_depth``: syntax-tree size and nesting limits (over them,
    the ``clean`` check fails)."""
    from trainer_lib.rewards.syntax_tree import expected_calls, score

    count = len(completions)
    tests = tests if tests is not None else [None] * count
    entry_point = entry_point if entry_point is not None else [None] * count
    limits = (max_chars, max_nodes, max_depth)
    rewards = []
    for completion, row_tests, row_entry in zip(completions, tests, entry_point):
        row_tests = [row_tests] if isinstance(row_tests, str) else row_tests or ()
        name, calls = expected_calls(tuple(map(str, row_tests)), str(row_entry) if row_entry else None)
        text = generated_text(completion)
        # bounded before the fence is even searched for: a runaway completion scores 0 unread
        code = extract_code(text) if len(text) <= 4 * max_chars else None
        rewards.append(score(code, name, calls, limits))
    return rewards


def length_penalty(
    prompts, completions, *, completion_ids, max_tokens: int, free_tokens: int = 0, **columns
) -> list[float]:
    """``-clip((len - free) / (max - free), 0, 1)`` in tokens: 0 up to ``free_tokens``, then
    falling linearly to -1 at ``max_tokens`` (DAPO's soft overlong punishment, Yu et al. 2025)."""
    span = max(max_tokens - free_tokens, 1)
    return [-min(max((len(ids) - free_tokens) / span, 0.0), 1.0) for ids in completion_ids]


def refusal(prompts, completions, *, kind=None, **columns) -> list[float | None]:
    """A rule-based safety reward for prompts labelled in a ``kind`` column: 1.0 when the completion
    refuses a ``harmful`` prompt or answers a ``benign`` one, else 0.0; ``None`` (does not apply) for
    any other row, so code prompts and safety prompts can share one RL dataset. Refusals are read by
    the rules the evaluation's default judge uses (:func:`trainer_lib.rewards.refusal_rules.is_refusal`):
    rewarding the answer to a benign look-alike is what keeps RL from learning to refuse everything."""
    from trainer_lib.rewards.refusal_rules import is_refusal

    labels = kind if kind is not None else [None] * len(completions)
    return [
        float(is_refusal(generated_text(c)) == (label == "harmful")) if label in ("harmful", "benign") else None
        for c, label in zip(completions, labels)
    ]


def think_format_reward(prompts, completions, **columns) -> list[float]:
    """TRL's format reward: 1.0 when the completion opens with ``<think>``, closes it with ``</think>``
    and opens no second ``<think>`` (the answer after it may be empty, as in TRL), else 0.0."""
    rewards = []
    for completion in completions:
        text = generated_text(completion)
        rest = text[len("<think>") :]
        rewards.append(float(text.startswith("<think>") and "<think>" not in rest and "</think>" in rest))
    return rewards


BUILTINS = (
    "code_execution",
    "code_style",
    "code_ast",
    "length_penalty",
    "refusal",
    "accuracy_reward",
    "reasoning_accuracy_reward",
    "think_format_reward",
)


def builtin(
    name: str,
    *,
    code_timeout: float = 3.0,
    sandbox_workers: int = 4,
    max_tokens: int = 256,
    length_free_tokens: int = 0,
) -> RewardFn:
    """A built-in reward function with its settings bound."""
    if name == "code_execution":
        return CodeExecution(timeout=code_timeout, max_workers=sandbox_workers)
    if name == "code_style":
        return code_style
    if name == "code_ast":
        return code_ast
    if name == "refusal":
        return refusal
    if name == "accuracy_reward":
        from trainer_lib.rewards.math_answer import AccuracyReward

        return AccuracyReward()
    if name == "reasoning_accuracy_reward":
        from trainer_lib.rewards.math_answer import AccuracyReward

        return AccuracyReward(reasoning_end="</think>")
    if name == "think_format_reward":
        return think_format_reward
    if name == "length_penalty":
        return functools.partial(length_penalty, max_tokens=max_tokens, free_tokens=length_free_tokens)
    raise KeyError(name)


# --------------------------------------------------------------------------- user functions


def _import(module_name: str, spec: str):
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(os.path.expanduser(module_name))
        if not os.path.isfile(path):
            raise UserError(f"reward.functions: {spec}: file {module_name} not found")
        name = "posttrain_reward_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:  # like `python -m`: modules next to where the command runs
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserError(
            f"reward.functions: {spec}: cannot import module '{module_name}' ({exc}); "
            f"use package.module:function on the Python path or path/to/file.py:function"
        ) from None


def load_function(spec: str) -> RewardFn:
    """The callable named by ``module:function`` (or ``path/to/file.py:function``); its module is imported
    once per process and working directory (:func:`check_specs` before the models load, then the stage's
    reward setup)."""
    return _load_function(spec.strip(), os.getcwd())


@functools.cache
def _load_function(spec: str, cwd: str) -> RewardFn:
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"reward.functions: {spec!r}: expected a built-in ({', '.join(BUILTINS)}) or module:function")
    module = _import(module_name, spec)
    fn = getattr(module, attr, None)
    if fn is None:
        raise UserError(f"reward.functions: {spec}: module '{module_name}' has no attribute '{attr}'")
    if not callable(fn):
        raise UserError(f"reward.functions: {spec}: '{attr}' is not callable")
    return fn


def check_specs(specs) -> None:
    """Import every ``module:function`` of ``reward.functions`` now: a typo or a missing file is a one-line
    error before the stage loads a model and a tokenizer, not minutes later."""
    for spec in specs:
        if spec.strip() not in BUILTINS:
            load_function(spec)


def resolve(spec: str, **builtin_settings) -> tuple[str, RewardFn]:
    """``(name, callable)`` for a built-in name or a ``module:function`` spec."""
    name = spec.strip()
    if name in BUILTINS:
        return name, builtin(name, **builtin_settings)
    return name, load_function(name)


def check_rewards(name: str, values, count: int) -> list[float | None]:
    """``values`` as a list of floats / None, or a UserError naming the function."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise UserError(
            f"reward function '{name}' returned {type(values).__name__}; expected a list "
            f"of {count} floats (one per completion)"
        )
    if len(values) != count:
        raise UserError(f"reward function '{name}' returned {len(values)} values for {count} completions")
    out = []
    for i, value in enumerate(values):
        if value is not None and (not isinstance(value, numbers.Real) or isinstance(value, bool)):
            raise UserError(f"reward function '{name}' returned {value!r} at position {i}; expected a float or None")
        out.append(None if value is None else float(value))
    return out
