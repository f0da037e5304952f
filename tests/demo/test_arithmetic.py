"""Tests for the arithmetic word problems of the real-model recipe (trainer_lib.demo.arithmetic)."""

import json
import os
import random
import re

import pytest

from trainer_lib.demo import arithmetic
from trainer_lib.eval.math_problems import load_math_problems, score_math


def _numbers(question: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", question)]


@pytest.mark.parametrize("family", sorted(arithmetic.FAMILIES))
def test_every_family_states_a_problem_whose_answer_follows_from_its_numbers(family):
    rng = random.Random(1)
    expected = {
        "add": lambda a, b: a + b,
        "take": lambda a, b: a - b,
        "times": lambda a, b: a * b,
        "share": lambda total, groups: total // groups,
        "two_steps": lambda a, b, c: a + b - c,
    }[family]
    for _ in range(200):
        row = arithmetic.problem(rng, family)
        numbers = _numbers(row["question"])
        answer = int(row["solution"])
        assert answer == expected(*numbers) and answer > 0, row
        if family == "share":
            assert numbers[0] % numbers[1] == 0, row
        assert row["prompt"] == [{"role": "user", "content": f"{row['question']}\n{arithmetic.INSTRUCTION}"}]


def test_held_out_questions_never_appear_in_training_and_the_draw_is_seeded():
    train, held = arithmetic.problems(seed=3, train=2000, held_out=300)
    assert len(train) == 2000 and len(held) == 300
    assert not {r["question"] for r in train} & {r["question"] for r in held}
    assert len({r["question"] for r in held}) == 300
    assert [r["family"] for r in held[:5]] == list(arithmetic.FAMILIES)
    again_train, again_held = arithmetic.problems(seed=3, train=2000, held_out=300)
    assert (again_train, again_held) == (train, held)
    assert arithmetic.problems(seed=4, train=10, held_out=10)[1] != held[:10]


def test_the_written_files_are_what_evaluate_reads_and_accuracy_reward_checks(tmp_path):
    assert arithmetic.main([str(tmp_path), "--train", "20", "--held-out", "10", "--seed", "0"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "held_out.jsonl").read_text().splitlines()]
    problems = load_math_problems(str(tmp_path / "held_out.jsonl"))
    assert [p["reference"] for p in problems] == [r["solution"] for r in rows]
    right = [f"So the answer is\n{r['solution']}" for r in rows]
    wrong = [f"{int(r['solution']) + 1}" for r in rows]
    assert score_math(problems, right)[0]["math_accuracy"] == 1.0
    assert score_math(problems, wrong)[0]["math_accuracy"] == 0.0
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 20
    assert sorted(os.listdir(tmp_path)) == ["held_out.jsonl", "train.jsonl"]  # no temporary file left


def test_bad_counts_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        arithmetic.main([str(tmp_path), "--held-out", "0"])
    assert exit_info.value.code == 2
    assert "--held-out" in capsys.readouterr().err
