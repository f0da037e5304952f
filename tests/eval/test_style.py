"""style_compliance_rate and style_violations_mean, counted by hand on four programs; the gate accepts them."""

import pytest

from trainer_lib.errors import ConfigError
from trainer_lib.eval.style import style_metrics
from trainer_lib.rewards.functions import code_style
from trainer_lib.stages.lifecycle.evaluate import EvaluateConfig, computed_metrics

PROGRAMS = [
    ("def add_one(x):\n    return x + 1\n", 0),  # clean
    ("def add_one(x):\n  return x + 1", 1),  # E111: indent of 2
    ("Here it is:\n```python\ndef same(a,b):\n    return a==b\n```\nDone.", 2),  # E231 after ',', E225 at ==
    ("def add_one(x):\n    return x + 1  \n", 1),  # W291: trailing whitespace
]


def test_style_metrics_by_hand():
    metrics, counts = style_metrics([text for text, _ in PROGRAMS])
    assert counts == [count for _, count in PROGRAMS]
    assert metrics == {"style_compliance_rate": 1 / 4, "style_violations_mean": (0 + 1 + 2 + 1) / 4}
    # the same counter as the code_style reward: 1 - 0.1 per violation
    assert code_style([None] * 4, [text for text, _ in PROGRAMS]) == pytest.approx([1.0, 0.9, 0.8, 0.9])


def test_style_metrics_needs_completions():
    with pytest.raises(ValueError, match="no completions"):
        style_metrics([])


def test_gate_rules_accept_the_style_metrics(tmp_path):
    cfg = EvaluateConfig(models=["sft=/m/sft", "grpo=/m/grpo"], baseline="sft", output_dir=str(tmp_path))
    cfg.tasks.path = "tasks.jsonl"
    cfg.humaneval.enabled = False
    cfg.gate.rules = ["style_compliance_rate>=baseline+0.3", "style_violations_mean<=baseline"]
    assert {"style_compliance_rate", "style_violations_mean"} <= set(computed_metrics(cfg))
    cfg.validate()
    cfg.tasks.path = None  # no code tasks: no style metrics, and a rule on them is a config error
    cfg.humaneval.enabled = True
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\]"):
        cfg.validate()


def test_report_orders_the_style_metrics_and_marks_the_fewest_violations_best():
    from trainer_lib.eval.report import NOT_RATES, metric_names, metrics_table

    models = {
        "sft": {"style_violations_mean": 1.3, "task_pass_rate": 0.27, "style_compliance_rate": 0.0},
        "grpo": {"style_violations_mean": 0.2, "task_pass_rate": 0.53, "style_compliance_rate": 0.9},
    }
    assert metric_names(models) == ["task_pass_rate", "style_compliance_rate", "style_violations_mean"]
    assert "style_violations_mean" in NOT_RATES  # a count, not a rate: kept out of the bar chart of rates
    html = metrics_table({"models": models, "candidate": "grpo", "baseline": "sft", "gate": {}})
    grpo_row = html.split("<b>grpo</b>")[1]
    assert grpo_row.count('class="num best"') == 3  # highest pass and compliance rates, fewest violations
