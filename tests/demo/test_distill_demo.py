"""The distillation demo driver: its student (build_student) and its --student-shape option."""

import pytest

from trainer_lib.demo.distill_demo import STUDENT_SHAPE, arguments, build_student
from trainer_lib.demo.tiny_model import build_tiny_llama, train_tokenizer


def test_the_student_has_at_most_half_the_teachers_parameters_and_the_teachers_tokenizer(tmp_path):
    # a teacher of the demo's shape (2 layers of width 128) over a small tokenizer of its own
    words = [f"def f{i}(x):\n    return x + {i}" for i in range(200)]
    tokenizer = train_tokenizer(words, vocab_size=300)
    teacher = build_tiny_llama(tokenizer, num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2)
    teacher.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")

    shapes = build_student(str(tmp_path / "teacher"), str(tmp_path / "student"), seed=1)

    assert shapes["teacher_parameters"] == sum(p.numel() for p in teacher.parameters())
    assert shapes["student_parameters"] * 2 <= shapes["teacher_parameters"]
    assert shapes["student_tokenizer"] == shapes["teacher_tokenizer"]
    assert (tmp_path / "student" / "chat_template.jinja").exists()


def test_student_shape_option_gives_build_tiny_llamas_keywords():
    args = arguments(["run", "--out", "out", "--student-shape", "2,64,4,2,192"])
    assert args.student_shape == {
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "num_kv_heads": 2,
        "intermediate_size": 192,
    }
    assert arguments(["run", "--out", "out"]).student_shape == STUDENT_SHAPE
    with pytest.raises(SystemExit):
        arguments(["run", "--out", "out", "--student-shape", "2,64"])


def test_the_table_shows_greedy_and_sampled_pass_rates_and_both_leads():
    from trainer_lib.demo.distill_demo import table

    report = {
        "settings": {"samples": 8},
        "task_pass_rate": {"student": 0.4, "distill": 0.58, "sft_on_teacher": 0.55},
        "task_sampled_pass_rate": {"student": 0.29, "distill": 0.37, "sft_on_teacher": 0.30},
        "greedy_gain": 0.03,
        "gain": 0.07,
    }
    lines = table(report).splitlines()
    assert "8 sampled answers a task" in lines[0]
    assert lines[3] == "| distill | 0.580 | 0.370 |"
    assert lines[-1] == "| distill - sft_on_teacher | +0.030 | +0.070 |"
