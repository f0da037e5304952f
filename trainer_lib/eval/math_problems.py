"""Math problems with a checkable final answer (GSM8K, MATH): the share a model answers right.

    math_accuracy     fraction of problems whose final answer equals the reference answer
    math_format_rate  fraction of answers whose last non-empty line holds exactly one number (what
                      "give the final answer as a number on the last line" asks), right or wrong

A row is GSM8K's (``question``, and ``answer``: the worked solution ending in ``#### 72``) or carries
a ``solution`` (a bare answer, a worked solution with ``\\boxed{}`` or ``####``) with a ``prompt``,
``question`` or ``problem``. Each answer is checked by the RL stages' ``accuracy_reward``
(:class:`trainer_lib.rewards.math_answer.AccuracyReward`): the completion's last ``\\boxed{}``, else
its last number, compared with the reference by math-verify. So ``math_accuracy`` is the mean
reward a GRPO run with that reward would get on these problems, greedy.
"""

from __future__ import annotations

from trainer_lib.errors import DataError, UserError
from trainer_lib.rewards.classifier import prompt_text

#: Columns a problem's text may come from, in this order.
QUESTION_COLUMNS = ("prompt", "question", "problem")
#: Columns its solution may come from: ``solution``, else GSM8K's ``answer``.
SOLUTION_COLUMNS = ("solution", "answer")


def read_row(row: dict, location: str) -> tuple[object, object]:
    """(question, solution) of one row, or a DataError naming what is missing."""
    from trainer_lib.data.formats import is_conversational

    question = next((row[c] for c in QUESTION_COLUMNS if row.get(c) is not None), None)
    if not (isinstance(question, str) and question.strip()) and not is_conversational(question):
        raise DataError(location, "question", "a non-empty string or a list of messages (or prompt, problem)", question)
    solution = next((row[c] for c in SOLUTION_COLUMNS if row.get(c) is not None), None)
    if solution is None:
        raise DataError(location, "solution", "a solution (or GSM8K's answer ending in '#### N')")
    return question, solution


def load_math_problems(path: str, limit: int = 0, checker=None) -> list[dict]:
    """Rows ``{"id", "prompt", "reference"}`` from any dataset source (local, a URL, hub); ``reference`` is
    the answer the solution gives, which ``checker`` (an :class:`AccuracyReward`) must be able to read."""
    from trainer_lib.data.sources import iter_source
    from trainer_lib.rewards.math_answer import AccuracyReward

    checker = checker or AccuracyReward()
    rows = []
    for location, row in iter_source(path, key="math.path"):
        question, solution = read_row(row, location)
        reference = checker.reference(str(solution))
        if reference is None:
            raise DataError(
                location, "solution", "an answer math-verify reads: a short answer, \\boxed{...} or '#### N'", solution
            )
        rows.append({"id": str(row.get("id", location)), "prompt": question, "reference": reference})
        if limit and len(rows) >= limit:
            break
    if not rows:
        raise UserError(f"math.path: {path}: no problems")
    return rows


def with_template(question, template: str):
    """A plain question put into ``template`` at ``{question}``; a list of messages as it is."""
    return template.replace("{question}", question) if isinstance(question, str) else question


def number_on_last_line(completion: str) -> bool:
    """Whether the last non-empty line of ``completion`` holds exactly one number ("42", "The answer is 42.",
    "**42**"): the answer format the instruction asks for, which the lenient checker does not need."""
    from trainer_lib.rewards.math_answer import NUMBER

    lines = [line for line in completion.splitlines() if line.strip()]
    return bool(lines) and len(NUMBER.findall(lines[-1])) == 1


def score_math(rows: list[dict], completions: list[str], checker=None) -> tuple[dict, list[dict]]:
    """(metrics, per-problem rows): every completion checked against its row's reference by ``checker``
    (default: the ``accuracy_reward`` checker)."""
    from trainer_lib.rewards.math_answer import AccuracyReward

    if len(rows) != len(completions):
        raise ValueError(f"score_math: {len(rows)} problems but {len(completions)} completions")
    checker = checker or AccuracyReward()
    per_problem = []
    for row, completion in zip(rows, completions):
        check = checker.check(completion, row["reference"])
        per_problem.append(
            {
                "id": row["id"],
                "question": prompt_text(row["prompt"]),
                "reference": row["reference"],
                "completion": completion,
                "extracted": check.answer,
                "correct": bool(check.correct),
                "format_ok": number_on_last_line(completion),
            }
        )
    count = len(per_problem)
    metrics = {
        "math_accuracy": sum(r["correct"] for r in per_problem) / count,
        "math_format_rate": sum(r["format_ok"] for r in per_problem) / count,
    }
    return metrics, per_problem
