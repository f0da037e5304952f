"""The real-model recipes' shell helpers (examples/real/lib.sh): each step runs once and a rerun skips it,
a failed step is run again, and the report gathers every evaluation's table and fails with the goal's gate."""

import os
import subprocess
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(REPO, "examples", "real", "lib.sh")


def _recipe(tmp_path, body: str) -> str:
    script = tmp_path / "toy-recipe.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n. {LIB}\n{textwrap.dedent(body)}")
    script.chmod(0o755)
    return str(script)


def _run(script: str, tmp_path, **env) -> subprocess.CompletedProcess:
    model = tmp_path / "model.gguf"
    model.write_text("weights")
    env = {**os.environ, "MODEL": str(model), "ROOT": str(tmp_path / "run"), "SEED": "3", **env}
    return subprocess.run(["bash", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def _summary(path, passed: bool) -> None:
    path.mkdir(parents=True)
    verdict = "PASSED" if passed else "FAILED"
    table = "| model | math_accuracy |\n|---|---:|\n| base | 0.2 |\n"
    (path / "summary.md").write_text(f"# Evaluation: gate {verdict}\n\n{table}")


def test_a_finished_step_is_skipped_on_rerun_and_a_failed_one_is_run_again(tmp_path):
    counter = tmp_path / "count"
    script = _recipe(
        tmp_path,
        f"""
        step first bash -c 'echo x >> {counter}'
        step second bash -c 'test -e {tmp_path}/allow'
        """,
    )
    failed = _run(script, tmp_path)
    assert failed.returncode != 0 and counter.read_text() == "x\n"
    assert sorted(os.listdir(tmp_path / "run" / ".done")) == ["first"]
    (tmp_path / "allow").touch()
    rerun = _run(script, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert counter.read_text() == "x\n"  # not run twice
    assert "== first: done earlier" in rerun.stdout and "== second: bash" in rerun.stdout
    assert sorted(os.listdir(tmp_path / "run" / ".done")) == ["first", "second"]


@pytest.mark.parametrize("passed", [True, False])
def test_the_report_gathers_the_tables_and_the_times_and_fails_with_the_goals_gate(tmp_path, passed):
    _summary(tmp_path / "run" / "evaluate", passed)
    _summary(tmp_path / "run" / "transfer", True)
    script = _recipe(tmp_path, 'step train true\nreport "A toy recipe" "$ROOT/evaluate" "$ROOT/transfer"\n')
    result = _run(script, tmp_path)
    assert result.returncode == (0 if passed else 1), result.stderr
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.startswith("# A toy recipe (seed 3)")
    assert report.count("| base | 0.2 |") == 2 and "## transfer:" in report
    assert "| train | 0 |" in report


def test_a_missing_model_is_a_clear_error(tmp_path):
    script = _recipe(tmp_path, "step train true\n")
    result = _run(script, tmp_path, MODEL=str(tmp_path / "absent.gguf"))
    assert result.returncode == 2 and "absent.gguf not found (make real-model)" in result.stderr
