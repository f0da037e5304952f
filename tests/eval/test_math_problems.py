"""The math set: GSM8K rows and solution rows read into problems, answers checked by accuracy_reward's checker."""

import json

import pytest

from trainer_lib.errors import ConfigError, DataError
from trainer_lib.eval.math_problems import load_math_problems, score_math, with_template

GSM8K = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
    "in April and May.\n#### 72",
}


def _write(tmp_path, rows, name="math.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_and_solution_rows(tmp_path):
    rows = [
        GSM8K,
        {"prompt": "What is 1/2 + 1/4?", "solution": r"Add them: \boxed{\frac{3}{4}}"},
        {"problem": "What is 2^10?", "solution": "1024", "id": "pow"},
        {"prompt": [{"role": "user", "content": "What is 6 * 7?"}], "solution": "42"},
    ]
    problems = load_math_problems(_write(tmp_path, rows))
    assert [p["reference"] for p in problems] == ["72", r"\frac{3}{4}", "1024", "42"]
    assert problems[0]["prompt"] == GSM8K["question"] and problems[2]["id"] == "pow"
    assert problems[3]["prompt"][0]["content"] == "What is 6 * 7?"
    assert len(load_math_problems(_write(tmp_path, rows), limit=2)) == 2


@pytest.mark.parametrize(
    "row, field",
    [
        ({"answer": "#### 3"}, "question"),
        ({"question": "What is 1 + 2?"}, "solution"),
        ({"question": "Why?", "answer": "x" * 500}, "solution"),  # a long worked solution without a marked answer
    ],
)
def test_a_row_without_a_question_or_a_readable_answer_is_named(tmp_path, row, field):
    with pytest.raises(DataError, match=rf"math\.jsonl:1: field '{field}'"):
        load_math_problems(_write(tmp_path, [row]))


def test_score_math_checks_each_answer_as_the_reward_does():
    from trainer_lib.rewards.math_answer import AccuracyReward

    rows = [
        {"id": "a", "prompt": GSM8K["question"], "reference": "72"},
        {"id": "b", "prompt": "Half of one?", "reference": r"\frac{1}{2}"},
        {"id": "c", "prompt": "Two and two?", "reference": "4"},
    ]
    completions = ["48 + 24 = 72 clips.", "It is 0.5", "I do not know."]
    metrics, per_problem = score_math(rows, completions)
    assert metrics == {"math_accuracy": 2 / 3, "math_format_rate": 1 / 3}  # "48 + 24 = 72" holds three numbers
    assert [(r["extracted"], r["correct"]) for r in per_problem] == [("72", True), ("0.5", True), (None, False)]
    assert per_problem[0]["question"] == GSM8K["question"] and per_problem[1]["reference"] == r"\frac{1}{2}"
    rewards = AccuracyReward()(None, completions, solution=[r["reference"] for r in rows])
    assert rewards == [1.0, 1.0, 0.0]


def test_the_format_rate_counts_a_single_number_on_the_last_line_right_or_wrong():
    rows = [{"id": str(i), "prompt": "Two and two?", "reference": "4"} for i in range(6)]
    completions = ["2 + 2 = 4\n4", "The answer is 5.\n\n", "**4**", "2 + 2 = 4", "4 apples\nso I think", ""]
    metrics, per_problem = score_math(rows, completions)
    assert [r["format_ok"] for r in per_problem] == [True, True, True, False, False, False]
    assert [r["correct"] for r in per_problem] == [True, False, True, True, True, False]  # the checker is lenient
    assert metrics == {"math_accuracy": 4 / 6, "math_format_rate": 3 / 6}


def test_template_and_config_checks():
    from trainer_lib.config import load_config
    from trainer_lib.stages.lifecycle.evaluate import EvaluateConfig, computed_metrics

    assert with_template("What is 2 + 2?", "Q: {question}\nA:") == "Q: What is 2 + 2?\nA:"
    messages = [{"role": "user", "content": "hi"}]
    assert with_template(messages, "Q: {question}") is messages
    base = ["models=m=/m", "output_dir=/o", "humaneval.enabled=false", "math.path=/p.jsonl"]
    cfg = load_config(EvaluateConfig, overrides=[*base, "gate.rules=math_accuracy>=0.5"])
    assert computed_metrics(cfg) == ["math_accuracy", "math_format_rate"]
    with pytest.raises(ConfigError, match=r"math\.template"):
        load_config(EvaluateConfig, overrides=[*base, "math.template=Solve it."])
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*math_accuracy"):
        load_config(EvaluateConfig, overrides=["models=m=/m", "output_dir=/o", "gate.rules=math_accuracy>=0.5"])
