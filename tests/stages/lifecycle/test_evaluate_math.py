"""posttrain evaluate math.path=...: two tiny models trained briefly on different answers to the same
questions (one right, one wrong) answer GSM8K-form rows in a user turn; math_accuracy reaches
metrics.json, per_problem/, the report and the gate, and rescoring the per-problem rows with the
accuracy_reward checker gives the reported figure."""

import json

import pytest

from trainer_lib.cli import main

QUESTIONS = ("What is two plus two?", "What is three times three?")
RIGHT = ("2 + 2 = 4", "3 * 3 = 9")
WRONG = ("2 + 2 = 5", "3 * 3 = 6")
GSM8K_ROWS = [
    {"question": QUESTIONS[0], "answer": "Two and two make <<2+2=4>>4.\n#### 4"},
    {"question": QUESTIONS[1], "answer": "Three threes are <<3*3=9>>9.\n#### 9"},
]


def train_answers(model_dir: str, out_dir: str, answers: tuple[str, ...], steps: int = 60) -> str:
    """Fit ``model_dir`` to answer QUESTIONS with ``answers`` in a chat turn (full-batch AdamW) and save it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}, {"role": "assistant", "content": a}], tokenize=False
        )
        for q, a in zip(QUESTIONS, answers)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    for _ in range(steps):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def math_setup(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate-math")
    problems = root / "gsm8k.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_ROWS))
    return {
        "right": train_answers(tiny_model_dir, str(root / "right"), RIGHT),
        "wrong": train_answers(tiny_model_dir, str(root / "wrong"), WRONG),
        "problems": str(problems),
    }


def _evaluate(math_setup, out, candidate, baseline):
    args = [
        "evaluate",
        f"models=wrong={math_setup['wrong']},right={math_setup['right']}",
        f"candidate={candidate}",
        f"baseline={baseline}",
        f"math.path={math_setup['problems']}",
        "math.max_new_tokens=12",
        "humaneval.enabled=false",
        "gate.rules=math_accuracy>=baseline",
        f"output_dir={out}",
    ]
    assert main(args) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def right_over_wrong(math_setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("math-eval") / "out"
    return out, _evaluate(math_setup, out, "right", "wrong")


def test_math_accuracy_in_metrics_per_problem_and_report(right_over_wrong):
    out, result = right_over_wrong
    assert {label: m["math_accuracy"] for label, m in result["models"].items()} == {"wrong": 0.0, "right": 1.0}
    assert result["data"]["math"]["count"] == 2 and result["data"]["math"]["chat"] == "auto"
    assert result["user_turns"] == {"wrong": ["math"], "right": ["math"]}  # the tiny models have a chat template
    rows = [json.loads(line) for line in (out / "per_problem" / "right_math.jsonl").read_text().splitlines()]
    assert [(r["question"], r["reference"], r["extracted"], r["correct"]) for r in rows] == [
        (QUESTIONS[0], "4", "4", True),
        (QUESTIONS[1], "9", "9", True),
    ]
    page = (out / "report.html").read_text()
    assert "math_accuracy" in page and "Math problems" in page and "answer 4 (reference 4)" in page
    assert "Plain prompts asked as a user turn</b> (the model's chat template): wrong: math; right: math." in page
    assert "| math_accuracy |" in (out / "summary.md").read_text()


def test_rescoring_the_per_problem_rows_gives_the_reported_accuracy(right_over_wrong):
    from trainer_lib.rewards.math_answer import AccuracyReward

    out, result = right_over_wrong
    checker = AccuracyReward()
    for label in ("wrong", "right"):
        rows = [json.loads(line) for line in (out / "per_problem" / f"{label}_math.jsonl").read_text().splitlines()]
        rewards = checker(None, [r["completion"] for r in rows], solution=[r["reference"] for r in rows])
        assert rewards == [float(r["correct"]) for r in rows]
        assert sum(rewards) / len(rewards) == result["models"][label]["math_accuracy"]


def test_math_accuracy_gate_passes_the_right_model_and_fails_the_wrong_one(math_setup, right_over_wrong, tmp_path):
    _, passed = right_over_wrong
    assert passed["gate"]["passed"] and passed["gate"]["rules"][0]["rule"] == "math_accuracy>=baseline"

    out = tmp_path / "wrong-over-right"
    failed = _evaluate(math_setup, out, "wrong", "right")
    assert failed["gate"]["passed"] is False
    (rule,) = failed["gate"]["rules"]
    assert rule["rule"] == "math_accuracy>=baseline" and not rule["passed"]
    assert rule["detail"] == "0 >= 1 (right 1): FAILED"  # the baseline named by its label
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# Evaluation: gate FAILED") and "| `math_accuracy>=baseline` | **FAIL** |" in summary
