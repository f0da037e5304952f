"""benchmarks/style_claim.py (``make demo-style``): its arguments and the teacher's style habit (the
end-to-end run is a make target, not a test)."""

import json
import os

import pytest

from benchmarks.style_claim import add_style_habit, arguments, two_space
from trainer_lib.rewards.functions import style_violations


def test_arguments_defaults_and_range():
    args = arguments(["--seed", "1", "--reuse"])
    assert (args.seed, args.sloppy, args.min_gain, args.max_drop, args.reuse) == (1, 0.7, 0.30, 0.02, True)
    with pytest.raises(SystemExit):
        arguments(["--sloppy", "1.5"])


def test_two_space_breaks_only_the_indentation():
    clean = "def f(n):\n    total = 0\n    for i in range(n):\n        total += i\n    return total"
    sloppy = two_space(clean)
    assert sloppy == "def f(n):\n  total = 0\n  for i in range(n):\n    total += i\n  return total"
    assert (style_violations(clean), style_violations(sloppy)) == (0, 3)  # E111 on the three 2-space lines


def test_add_style_habit_rewrites_code_answers_only(tmp_path):
    answers = ["def f(x):\n    return x", "Sure: kill it with kill -9.", "def g(x):\n    return 1"]
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": answer}]}
        for i, answer in enumerate(answers)
    ]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "corpus.txt").write_text("q0\n")
    assert add_style_habit(str(tmp_path), 1.0, seed=0) == 2
    answers = [json.loads(line)["messages"][1]["content"] for line in open(tmp_path / "sft.jsonl")]
    assert answers == ["def f(x):\n  return x", "Sure: kill it with kill -9.", "def g(x):\n  return 1"]
    assert (tmp_path / "corpus.txt").read_text().startswith("q0\ndef f(x):\n  return x\n")
    assert not os.path.exists(tmp_path / "sft.jsonl.tmp")
