"""Execution pass rate on held-out code tasks (the demo's ``code_tasks_eval.jsonl``, any rows with a
``prompt`` and a list of assert statements in ``tests``, or MBPP's own rows: ``text``, ``code``,
``test_list``, asked and tested as ``posttrain prepare`` turns them into training rows).

A completion's code is taken exactly as the ``code_execution`` reward takes it (the first fenced
block, else the whole text) and runs with the tests in the same sandbox, so the number the RL
stages optimize and the number reported here are the same measurement on different prompts.

    task_pass_rate            fraction of tasks whose every test passed
    task_test_pass_fraction   mean fraction of tests passed per task
"""

from __future__ import annotations

from trainer_lib.errors import DataError, UserError
from trainer_lib.rewards.classifier import prompt_text
from trainer_lib.rewards.functions import extract_code
from trainer_lib.sandbox import Program


def load_tasks(path: str, limit: int = 0) -> list[dict]:
    """Rows ``{"task_id", "prompt", "tests"}`` from any dataset source (local, a URL, hub)."""
    from trainer_lib.data.formats import is_conversational
    from trainer_lib.data.public_datasets import mbpp_row
    from trainer_lib.data.sources import iter_source

    rows = []
    for location, row in iter_source(path, key="tasks.path"):
        if "prompt" not in row and source_format(row, location) == "mbpp":
            row = mbpp_row(row, location)
        prompt, tests = row.get("prompt"), row.get("tests")
        if not (isinstance(prompt, str) and prompt.strip()) and not is_conversational(prompt):
            raise DataError(location, "prompt", "a non-empty string or a list of messages", prompt)
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise DataError(location, "tests", "a non-empty list of assert statements (strings)", tests)
        rows.append({"task_id": str(row.get("task_id", location)), "prompt": prompt, "tests": tests})
        if limit and len(rows) >= limit:
            break
    if not rows:
        raise UserError(f"tasks.path: {path}: no tasks")
    return rows


def source_format(row, location: str) -> str | None:
    """The row's format as training data detects it (:func:`trainer_lib.data.formats.detect_format`), None
    when it is none: such a row fails below on its missing ``prompt``."""
    from trainer_lib.data.formats import detect_format

    try:
        return detect_format(row, location)
    except DataError:
        return None


def task_program(completion: str, tests: list[str]) -> Program:
    """The untrusted code of a completion plus the task's trusted tests, one assert per test."""
    return Program(source=extract_code(completion), tests=tuple(tests))


def score_tasks(rows: list[dict], completions: list[str], sandbox, timeout: float = 3.0) -> tuple[dict, list[dict]]:
    """(metrics, per-task rows): run every completion against its tests in ``sandbox``."""
    if len(rows) != len(completions):
        raise ValueError(f"score_tasks: {len(rows)} tasks but {len(completions)} completions")
    results = sandbox.run_many([task_program(c, r["tests"]) for r, c in zip(rows, completions)], timeout=timeout)
    per_task = []
    for row, completion, result in zip(rows, completions, results):
        per_task.append(
            {
                "task_id": row["task_id"],
                "prompt": prompt_text(row["prompt"]),
                "completion": completion,
                "passed": result.passed,
                "tests_passed": result.tests_passed,
                "tests": len(row["tests"]),
                "status": result.status,
                "detail": result.detail,
            }
        )
    metrics = {
        "task_pass_rate": sum(r["passed"] for r in per_task) / len(per_task),
        "task_test_pass_fraction": sum(r["tests_passed"] / r["tests"] for r in per_task) / len(per_task),
    }
    return metrics, per_task
