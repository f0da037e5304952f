"""``ToolEnvironment``: a task (a question with a checkable answer) that the model may solve with tools.

Each assistant message either calls tools or answers. Calls run concurrently, each bounded in time and in
output, and every way a call can fail becomes a tool message the model reads on its next turn, never an
exception out of ``step``: a malformed call, a tool that raises, one that outlives ``timeout``, one whose
output is cut at ``max_output_chars``. Each is counted in ``info["tool_errors"]``, so a run can log how
often its policy writes broken calls. A message without a call is the final answer: the episode ends and
``checker(answer, row)`` gives the reward. The checker is the caller's (the RL stage builds it from a reward
function, e.g. ``accuracy_reward``), so the answer is judged as the single-turn stages judge it.

A hung call is abandoned, not stopped: Python cannot kill a thread, so its thread runs on in the
background (its pool is dropped without waiting, and the next step gets a fresh one), and the interpreter
waits for it at exit. A tool that may hang should therefore do its work in another process: the ``python``
tool runs in the sandbox, which kills the program's process group at its own timeout.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from trainer_lib.agents.env import Observation, StepResult
from trainer_lib.agents.tool_calls import MalformedCall, ToolCall, parse_tool_calls, tool_message
from trainer_lib.agents.tools import Tool
from trainer_lib.errors import DataError

#: The failures of a step's calls, the keys of ``info["tool_errors"]``.
ERROR_KINDS = ("malformed", "raised", "timeout", "truncated")
POLL_SECONDS = 0.05  # how often the step looks at the clock while calls run


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    """One call's result: the ``text`` the model reads, the ``failure`` (``"raised"``, ``"timeout"``, or
    None when it ran), and whether the text was ``truncated`` to the output cap."""

    text: str
    failure: str | None = None
    truncated: bool = False


class ToolEnvironment:
    """An episode over ``tools`` and one row: the question (``prompt``, a string or chat messages, else
    ``question``) as the first user turn, after ``system_prompt`` when given.

    The tools reach the model through ``Observation.tools`` (the chat template renders them), not through
    the prompt text. Limits: each call gets ``timeout`` seconds from its start; at most ``max_concurrency``
    run at once; a message with more than ``max_calls_per_step`` calls has the excess refused (counted as
    malformed); a result longer than ``max_output_chars`` is cut, with a note saying so. Intermediate steps
    give reward 0; the final answer gives ``checker(answer_text, row)``.
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        checker: Callable[[str, dict], float],
        system_prompt: str | None = None,
        timeout: float = 10.0,
        max_output_chars: int = 4000,
        max_concurrency: int = 4,
        max_calls_per_step: int = 8,
    ):
        self.tools = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            raise ValueError(f"two tools share a name: {[tool.name for tool in tools]}")
        if timeout <= 0 or max_output_chars < 1 or max_concurrency < 1 or max_calls_per_step < 1:
            raise ValueError("timeout, max_output_chars, max_concurrency and max_calls_per_step must be positive")
        self.checker = checker
        self.system_prompt = system_prompt
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.max_concurrency = max_concurrency
        self.max_calls_per_step = max_calls_per_step
        self.row: dict | None = None

    @property
    def schemas(self) -> list[dict]:
        return [tool.schema for tool in self.tools.values()]

    def reset(self, row: dict) -> Observation:
        prompt = row.get("prompt", row.get("question"))
        if prompt is None:
            raise DataError("tool environment row", "prompt", "the question (a prompt or question column)")
        messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if self.system_prompt and (not messages or messages[0].get("role") != "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        self.row = row
        return Observation(messages=messages, tools=self.schemas)

    def step(self, assistant_message: dict) -> StepResult:
        if self.row is None:
            raise RuntimeError("ToolEnvironment.step before reset, or after the episode ended")
        parsed = parse_tool_calls(assistant_message, self.schemas)
        errors = dict.fromkeys(ERROR_KINDS, 0)
        if not parsed.has_calls:  # the final answer (a checker that raises is a bug in it, and is not caught)
            answer = assistant_message.get("content") or ""
            reward = float(self.checker(answer, self.row))
            self.row = None
            return StepResult(messages=[], reward=reward, done=True, info={"tool_calls": 0, "tool_errors": errors})
        messages: list[dict | None] = [None] * len(parsed.items)
        runnable: list[tuple[int, ToolCall]] = []
        for i, item in enumerate(parsed.items):
            if isinstance(item, ToolCall) and len(runnable) < self.max_calls_per_step:
                runnable.append((i, item))
                continue
            if isinstance(item, ToolCall):
                item = MalformedCall(
                    item.name, f"more than {self.max_calls_per_step} tool calls in one message", item.name
                )
            errors["malformed"] += 1
            messages[i] = tool_message(item.name or "error", self._capped(f"error: {item.error}")[0])
        for (i, call), outcome in zip(runnable, self.run_calls([c for _, c in runnable])):
            messages[i] = tool_message(call.name, outcome.text, call.id)
            if outcome.failure:
                errors[outcome.failure] += 1
            errors["truncated"] += outcome.truncated
        return StepResult(
            messages=messages, reward=0.0, done=False, info={"tool_calls": len(runnable), "tool_errors": errors}
        )

    def run_calls(self, calls: Sequence[ToolCall]) -> list[CallOutcome]:
        """Run ``calls`` within the limits: one outcome per call, in order.

        A call's clock starts when a worker takes it. One still waiting when hung calls have held every
        worker for ``timeout`` times the number of waves it would need is a timeout too, so a step always
        returns within about ``timeout * ceil(len(calls) / max_concurrency)`` seconds.
        """
        if not calls:
            return []
        # A pool per step: threads of abandoned calls go with it, and the next step has all its workers.
        pool = concurrent.futures.ThreadPoolExecutor(min(len(calls), self.max_concurrency), thread_name_prefix="tool")
        started: dict[int, float] = {}
        futures = [pool.submit(self._call, i, call, started) for i, call in enumerate(calls)]
        give_up = time.monotonic() + self.timeout * math.ceil(len(calls) / self.max_concurrency)
        outcomes: dict[int, CallOutcome] = {}
        try:
            while len(outcomes) < len(calls):
                now = time.monotonic()
                for i, future in enumerate(futures):
                    if i in outcomes:
                        continue
                    deadline = started[i] + self.timeout if i in started else give_up
                    if future.done():
                        outcomes[i] = future.result()
                    elif now >= deadline:
                        future.cancel()
                        what = "did not finish" if i in started else "could not start (hung calls held every worker)"
                        outcomes[i] = CallOutcome(f"error: {calls[i].name} {what} within {self.timeout:g} s", "timeout")
                pending = [f for i, f in enumerate(futures) if i not in outcomes]
                if pending:
                    concurrent.futures.wait(pending, POLL_SECONDS, concurrent.futures.FIRST_COMPLETED)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return [outcomes[i] for i in range(len(calls))]

    def _call(self, index: int, call: ToolCall, started: dict[int, float]) -> CallOutcome:
        started[index] = time.monotonic()
        try:
            text = self.tools[call.name](**call.arguments)
        except BaseException as exc:  # in a worker thread, even SystemExit is only what the tool did wrong
            first = (str(exc).strip().splitlines() or [""])[0]
            text, _ = self._capped(f"error: {call.name} raised {': '.join(filter(None, (type(exc).__name__, first)))}")
            return CallOutcome(text, "raised")
        text, truncated = self._capped(text)
        return CallOutcome(text, None, truncated)

    def _capped(self, text: str) -> tuple[str, bool]:
        if len(text) <= self.max_output_chars:
            return text, False
        note = f"\n[truncated: the output was {len(text):,} characters; the first {self.max_output_chars:,} are shown]"
        return text[: self.max_output_chars] + note, True
