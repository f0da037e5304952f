"""The agent demo: its questions are disjoint and too big to guess, the teacher's habits are the documented ones,
the tools-off environment scores the first reply, and the runner goes end to end (tiny model, SFT, GRPO in the
calculator environment, both evaluations) on a shrunk setting, a rerun skipping what is done."""

import json
import random

import pytest

from trainer_lib.demo.agent import (
    OPERATORS,
    AnswerOnly,
    arguments,
    make_questions,
    table,
    teacher_conversation,
    write_data,
)


def test_questions_are_distinct_solved_and_kept_apart():
    first = make_questions(50, 3, seed=1)
    assert len({q["expression"] for q in first}) == 50
    for q in first:
        a, op, b = q["expression"].split()
        assert q["solution"] == str(OPERATORS[op](int(a), int(b)))
        assert q["expression"] in q["question"] and len(a) == 3
    second = make_questions(50, 3, seed=2, avoid={q["expression"] for q in first})
    assert not {q["expression"] for q in first} & {q["expression"] for q in second}


def test_the_teacher_guesses_or_calls_and_sometimes_misnames_the_argument():
    item = {"question": "What is 123 * 45?", "expression": "123 * 45", "solution": "5535"}
    rng = random.Random(0)
    guesses = [teacher_conversation(item, 1.0, 0.0, rng) for _ in range(20)]
    assert all(len(m) == 2 and m[1]["content"].startswith("I think it is ") for m in guesses)
    assert all(m[1]["content"] != "I think it is 5535." for m in guesses)  # a guess is always wrong
    calls = [teacher_conversation(item, 0.0, 1.0, rng) for _ in range(3)]
    assert all('"expr": "123 * 45"' in m[1]["content"] and m[3]["content"] == "123 * 45 = 5535." for m in calls)
    assert '"expression": ' in teacher_conversation(item, 0.0, 0.0, rng)[1]["content"]


def test_write_data_counts_the_habits(tmp_path):
    args = arguments(["--seed", "3", "--out", str(tmp_path), "--sft-rows", "40", "--rl-rows", "8"])
    args.heldout_rows = 6
    data = write_data(str(tmp_path), args)
    sft = [json.loads(line) for line in open(data["sft.jsonl"])]
    assert len(sft) == 40 and all(json.loads(r["tools"])[0]["function"]["name"] == "calculator" for r in sft)
    assert data["guesses"] == sum(len(r["messages"]) == 2 for r in sft) > 0
    heldout = [json.loads(line) for line in open(data["heldout.jsonl"])]
    assert len(heldout) == 6 and all(r["prompt"][0]["role"] == "user" and r["solution"] for r in heldout)


def test_the_template_shows_a_result_as_the_answer_shows_it():
    """The copies the tiny model must learn have the same marker before source and target: ``"`` before the
    expression in the question and in the call, ``= `` before the result in the tool turn and in the answer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from trainer_lib.demo.agent import TOOL_CHATML, calculator_conversation

    question = make_questions(1, 3, seed=0)[0]
    assert f'"{question["expression"]}"' in question["question"]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")))
    tokenizer.chat_template = TOOL_CHATML
    text = tokenizer.apply_chat_template(calculator_conversation("What is 12 + 3?", "12 + 3", "15"), tokenize=False)
    assert '{"expression": "12 + 3"}' in text
    assert "<|im_start|>tool\n= 15<|im_end|>\n<|im_start|>assistant\n12 + 3 = 15.<|im_end|>" in text


def test_answer_only_scores_the_first_reply():
    env = AnswerOnly(lambda answer, row: float(row["solution"] in answer))
    observation = env.reset({"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "solution": "5"})
    assert observation.tools == [] and observation.messages[0]["content"] == "What is 2 + 3?"
    result = env.step({"role": "assistant", "content": "It is 5."})
    assert (result.reward, result.done, result.messages) == (1.0, True, [])


def test_the_table_has_a_row_per_model():
    metrics = {"agent_success_rate": 0.5, "agent_valid_tool_call_rate": 0.75, "agent_mean_turns": 1.5}
    metrics |= {"calls_tried": 4, "calling_rate": 0.25}
    silent = {**metrics, "agent_valid_tool_call_rate": 0.0, "calls_tried": 0, "calling_rate": 0.0}
    text = table(
        {"models": {"sft": {"tools": silent, "no_tools": metrics}, "grpo": {"tools": metrics, "no_tools": silent}}}
    )
    assert text.splitlines()[2:] == [
        "| sft | 0.50 | 0.00 | none tried | 1.50 | 0.50 |",
        "| grpo | 0.50 | 0.25 | 0.75 | 1.50 | 0.50 |",
    ]


@pytest.mark.extended
def test_the_demo_runs_end_to_end_and_a_rerun_skips_what_is_done(tmp_path, capsys):
    from trainer_lib.demo.agent import main

    out = tmp_path / "seed-0"
    shrunk = ["--seed", "0", "--out", str(out), "--sft-rows", "16", "--rl-rows", "8", "--heldout-rows", "4"]
    shrunk += ["--sft-steps", "2", "--rl-steps", "1", "--prompts-per-step", "2", "--min-gain", "-1"]
    assert main(shrunk) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["models"]) == {"sft", "grpo", "grpo_no_tools"}
    assert set(report["models"]["grpo_no_tools"]) == {"tools", "no_tools"} and "gain_without_tools" in report
    assert (out / "grpo_no_tools" / "model.safetensors").is_file()
    assert "| grpo |" in (out / "report.md").read_text()
    first = report["seconds"]
    assert first["sft"] > 0 and first["total"] >= first["sft"] + first["grpo"]
    capsys.readouterr()
    assert main(shrunk) == 0
    assert capsys.readouterr().out.count("done before, skipped") == 3
    again = json.loads((out / "report.json").read_text())["seconds"]
    assert again == first  # the rerun did nothing, and reports the first run's times
