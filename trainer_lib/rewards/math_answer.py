"""TRL's ``accuracy_reward`` and ``reasoning_accuracy_reward``: is a completion's final answer the ``solution``?

The final answer of a completion is the content of its last ``\\boxed{...}`` (or ``\\fbox{...}``), else
the last number near its end (``42``, ``-3.5``, ``1,000``, ``3/4``). The solution column is read the same
way when it holds a worked solution (a ``\\boxed{}`` or GSM8K's ``#### 42``), else as it is (``\\frac{1}{3}``).
Both sides are compared by math-verify, which parses LaTeX and plain expressions to SymPy and checks
equivalence, so ``0.5``, ``1/2`` and ``\\frac{1}{2}`` are one answer.

Completions are model output and may be hostile, so the work per completion is bounded: only the last
``window`` characters are searched for a number, a boxed answer longer than ``max_answer_chars`` is no
answer, and an expression whose value would be huge (``9^{9^{9}}``, ``(10^{10})!``) scores 0 before SymPy
tries to evaluate it. In the main thread math-verify's own alarm-based timeouts apply as well.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

from trainer_lib.errors import UserError

BOXES = ("\\boxed", "\\fbox")
#: an integer, decimal, thousands-grouped number or a fraction of two integers
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?")
#: the largest exponent, factorial argument or nesting SymPy is asked to evaluate
MAX_EXPONENT = 1000
MAX_FACTORIAL = 1000


def answer_text(completion) -> str:
    """The generated text of a completion: a string, or the assistant turns of a message list."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role") == "assistant")


def last_boxed(text: str, max_answer_chars: int = 200, tries: int = 4) -> str | None:
    """The content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` of ``text``, or None.

    Braces are matched for at most ``max_answer_chars`` characters, and at most ``tries`` boxes are
    looked at from the end, so a text full of unclosed boxes costs one backwards scan."""
    end = len(text)
    for _ in range(tries):
        start = max(text.rfind(box, 0, end) for box in BOXES)
        if start < 0:
            return None
        end = start
        brace = start + len("\\boxed" if text.startswith("\\boxed", start) else "\\fbox")
        while brace < len(text) and text[brace] == " ":
            brace += 1
        if brace >= len(text) or text[brace] != "{":
            continue
        depth = 0
        for i in range(brace, min(len(text), brace + max_answer_chars + 2)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[brace + 1 : i].strip()
    return None


def last_number(text: str, window: int = 2000) -> str | None:
    """The last number in the final ``window`` characters of ``text`` (thousands commas dropped), or None."""
    numbers = NUMBER.findall(text[-window:])
    return re.sub(r"(?<=\d),(?=\d{3})", "", numbers[-1]) if numbers else None


def final_answer(text: str, max_answer_chars: int = 200, window: int = 2000) -> str | None:
    """A completion's final answer: its last boxed answer, else its last number; None without either."""
    boxed = last_boxed(text, max_answer_chars)
    return boxed if boxed is not None else last_number(text, window)


def gold_answer(solution: str, max_answer_chars: int = 200) -> str | None:
    """The answer a ``solution`` cell gives: its last boxed answer, what follows GSM8K's ``####``,
    or the cell itself when it is short; None for a blank or long cell without a marked answer."""
    solution = str(solution).strip()
    boxed = last_boxed(solution, max_answer_chars)
    if boxed is not None:
        return boxed
    if "####" in solution:
        solution = solution.rsplit("####", 1)[1].strip()
    return solution if solution and len(solution) <= max_answer_chars else None


def too_costly(parsed: list) -> bool:
    """Whether any parsed expression holds a power, factorial or tower too large to evaluate."""
    import sympy

    for expr in parsed:
        if not isinstance(expr, sympy.Basic):
            continue
        for node in sympy.preorder_traversal(expr):
            if isinstance(node, sympy.Pow):
                exponent = node.exp
                if exponent.is_Number and abs(exponent) > MAX_EXPONENT:
                    return True
                if not exponent.is_Number and exponent.has(sympy.Pow, sympy.factorial):
                    return True  # a tower: 9^{9^{9}}
            elif isinstance(node, (sympy.factorial, sympy.factorial2, sympy.gamma)):
                argument = node.args[0]
                if not (argument.is_Integer and abs(argument) <= MAX_FACTORIAL):
                    return True
    return False


class MathVerifier:
    """``same(gold, answer)``: math-verify's parse and verify, with the bounds above; parsed solutions
    are kept (a dataset repeats each one ``rollout.n`` times)."""

    def __init__(self, timeout_seconds: int = 5, cache_size: int = 4096):
        self.timeout_seconds, self.cache_size = timeout_seconds, cache_size
        self._gold: dict[str, list] = {}

    def _timeout(self) -> int | None:
        # math-verify's timeouts use signal.alarm, which only the main thread may set
        return self.timeout_seconds if threading.current_thread() is threading.main_thread() else None

    def parse(self, text: str) -> list:
        from math_verify import parse

        return parse(text, parsing_timeout=self._timeout())

    def gold(self, answer: str) -> list:
        if answer not in self._gold:
            if len(self._gold) >= self.cache_size:
                self._gold.clear()
            parsed = self.parse(answer)
            self._gold[answer] = [] if too_costly(parsed) else parsed
        return self._gold[answer]

    def same(self, gold: list, answer: str) -> bool:
        from math_verify import verify

        parsed = self.parse(answer)
        if not parsed or too_costly(parsed):
            return False
        return bool(verify(gold, parsed, timeout_seconds=self._timeout()))


@dataclass(frozen=True)
class Check:
    """One completion checked against one solution."""

    reference: str | None  # the solution's answer; None when it gives none math-verify can read
    answer: str | None  # the completion's final answer; None without one
    correct: bool | None  # None: the row has no answer to check against (the reward does not apply)


class AccuracyReward:
    """1.0 when the completion's final answer equals the row's ``solution``, else 0.0; ``None`` (does not
    apply) for a row without a solution, or one math-verify cannot read, as TRL does.

    With ``reasoning_end`` (TRL's ``reasoning_accuracy_reward``: ``"</think>"``) only the text after its
    last occurrence is read, and a completion without it scores 0.0 (its reasoning never finished)."""

    def __init__(
        self,
        max_answer_chars: int = 200,
        window: int = 2000,
        timeout_seconds: int = 5,
        reasoning_end: str | None = None,
    ):
        self.max_answer_chars, self.window, self.reasoning_end = max_answer_chars, window, reasoning_end
        self.verifier = MathVerifier(timeout_seconds)
        for name in ("math_verify.parser", "math_verify.grader"):  # a timeout is scored as wrong, not logged
            logging.getLogger(name).setLevel(logging.ERROR)

    def reference(self, solution) -> str | None:
        """The answer a ``solution`` cell gives (:func:`gold_answer`) when math-verify can read it, else None."""
        reference = None if solution is None else gold_answer(solution, self.max_answer_chars)
        return reference if reference and self.verifier.gold(reference) else None

    def check(self, completion, solution) -> Check:
        """One completion against one solution: the reference, the completion's final answer, and whether
        they are the same (None when the solution gives no answer math-verify can read)."""
        text = answer_text(completion)
        if self.reasoning_end is not None:
            if self.reasoning_end not in text:
                return Check(None, None, False)  # its reasoning never finished
            text = text.rsplit(self.reasoning_end, 1)[1]
        reference = self.reference(solution)
        if reference is None:
            return Check(None, None, None)
        answer = final_answer(text, self.max_answer_chars, self.window)
        correct = answer is not None and self.verifier.same(self.verifier.gold(reference), answer)
        return Check(reference, answer, correct)

    def __call__(self, prompts, completions, *, solution=None, **columns) -> list[float | None]:
        if solution is None:
            raise UserError(
                "reward function 'accuracy_reward': the dataset has no 'solution' column (the answer each "
                "prompt's completions are checked against)"
            )
        checks = [self.check(completion, row_solution) for completion, row_solution in zip(completions, solution)]
        return [None if c.correct is None else float(c.correct) for c in checks]
