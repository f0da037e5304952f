"""The TRL benchmark harness runs end to end on a tiny model and prints its figures and ratio line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRL_PYTHON = os.path.join(ROOT, ".venv-bench", "bin", "python")
RATIO = re.compile(r"^ratio throughput=([0-9.eE+-]+) memory=([0-9.eE+-]+)$")


def trl_missing() -> str | None:
    """Why TRL's side cannot run here, or None."""
    if not os.path.exists(TRL_PYTHON):
        return f"{TRL_PYTHON} not found (make bench creates it)"
    probe = subprocess.run([TRL_PYTHON, "-c", "import trl"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"trl is not importable in {TRL_PYTHON}"


def run_harness(tmp_path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.vs_trl",
            "--algo",
            "sft",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--size",
            "tiny",
            "--max-length",
            "64",
            "--json",
            str(out),
            "--trl-python",
            TRL_PYTHON,
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def check_side(result: dict) -> None:
    for key in ("tokens_per_s", "peak_memory_bytes", "mfu", "peak_flops", "parameters", "trained_tokens"):
        assert result[key] > 0, (key, result)
    assert result["timed_steps"] == 1
    assert result["final_loss"] == result["final_loss"]  # not NaN


@pytest.mark.slow
@pytest.mark.extended
def test_ours_side(tmp_path):
    stdout, report = run_harness(tmp_path, "--ours-only", "--profile")
    assert "round 1 ours" in stdout and "ratio" not in stdout
    check_side(report["results"]["ours"][0])
    profile = report["profiles"]["ours"]  # one extra run, profiled over its timed step
    assert "profile ours" in stdout and profile["groups"]["matmul"] > 0, profile
    assert abs(sum(profile["groups"].values()) - 1.0) < 1e-6


@pytest.mark.slow
def test_both_sides_and_ratio_line(tmp_path):
    reason = trl_missing()
    if reason:
        pytest.skip(reason)
    stdout, report = run_harness(tmp_path)
    last = stdout.strip().splitlines()[-1]
    match = RATIO.match(last)
    assert match, last
    throughput, memory = (float(x) for x in match.groups())
    assert throughput > 0 and memory > 0
    for side in ("ours", "trl"):
        check_side(report["results"][side][0])
    for figure in match.groups():  # 3 significant digits
        assert len(figure.replace(".", "").lstrip("0")) <= 3


def test_real_rows_come_from_the_public_formats(tmp_path):
    """--size smollm2's data: GSM8K conversations (SFT), their questions (GRPO), HH-RLHF pairs with the
    malformed dialogue skipped (DPO, reward), in the format both sides read."""
    import gzip

    from benchmarks.vs_trl import real_rows

    gsm8k = {"question": "What is 2 + 3?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"}
    (tmp_path / "gsm8k_train.jsonl").write_text(json.dumps(gsm8k) + "\n" + json.dumps(gsm8k) + "\n")
    good = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go away"}
    bad = {"chosen": "\n\nHuman: hi\n\nAssistant: a\n\nAssistant: b", "rejected": "\n\nHuman: hi\n\nAssistant: c"}
    with gzip.open(tmp_path / "hh_rlhf_harmless_base_test.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in (bad, good, good)) + "\n")
    sft = real_rows("sft", 1, str(tmp_path))
    assert sft == [
        {
            "messages": [
                {"role": "user", "content": "What is 2 + 3?"},
                {"role": "assistant", "content": gsm8k["answer"]},
            ]
        }
    ]
    assert real_rows("grpo", 5, str(tmp_path)) == [{"prompt": [{"role": "user", "content": "What is 2 + 3?"}]}] * 2
    pairs = real_rows("dpo", 2, str(tmp_path))
    assert len(pairs) == 2 and pairs[0]["prompt"] == [{"role": "user", "content": "hi"}]
    assert pairs[0]["chosen"] == [{"role": "assistant", "content": "hello"}]
    assert pairs[0]["rejected"] == [{"role": "assistant", "content": "go away"}]
