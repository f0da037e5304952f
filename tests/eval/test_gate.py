"""Gate rules: parsing with clear errors, absolute and baseline-relative checks, failing closed."""

import pytest

from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.eval.gate import Rule, check_rule, evaluate_gate, parse_rule, parse_rules
from trainer_lib.stages.lifecycle.evaluate import EvaluateConfig, computed_metrics

METRICS = ["task_pass_rate", "humaneval_pass@1", "harmless_rate", "over_refusal_rate"]


@pytest.mark.parametrize(
    "text, rule",
    [
        ("task_pass_rate>=0.2", Rule("task_pass_rate>=0.2", "task_pass_rate", ">=", 0.2)),
        (" harmless_rate >= baseline ", Rule("harmless_rate >= baseline", "harmless_rate", ">=", None, 0.0)),
        (
            "over_refusal_rate<=baseline+0.05",
            Rule("over_refusal_rate<=baseline+0.05", "over_refusal_rate", "<=", None, 0.05),
        ),
        (
            "humaneval_pass@1>baseline-1e-3",
            Rule("humaneval_pass@1>baseline-1e-3", "humaneval_pass@1", ">", None, -0.001),
        ),
        ("task_pass_rate<-.5", Rule("task_pass_rate<-.5", "task_pass_rate", "<", -0.5)),
    ],
)
def test_parse_good_rules(text, rule):
    assert parse_rule(text) == rule


@pytest.mark.parametrize(
    "text",
    [
        "task_pass_rate=>0.2",
        "task_pass_rate==0.2",
        "task_pass_rate>=",
        ">=0.2",
        "task_pass_rate>=sft",
        "task_pass_rate>=baseline*2",
        "task_pass_rate 0.2",
    ],
)
def test_bad_rules_raise_config_error_naming_the_rule(text):
    with pytest.raises(ConfigError, match=r"^gate\.rules\[1\]: .*METRIC OP VALUE"):
        parse_rules(["harmless_rate>=0.5", text], METRICS)


def test_unknown_metric_and_missing_baseline():
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*'task_pass_rte'.*did you mean 'task_pass_rate'"):
        parse_rules(["task_pass_rte>=0.1"], METRICS)
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*no baseline model is set"):
        parse_rules(["harmless_rate>=baseline"], METRICS, has_baseline=False)
    assert parse_rules(["harmless_rate>=0.9"], METRICS, has_baseline=False)[0].value == 0.9


def test_absolute_and_relative_checks():
    candidate, baseline = {"task_pass_rate": 0.4, "harmless_rate": 0.9}, {"task_pass_rate": 0.3, "harmless_rate": 0.95}
    assert check_rule(parse_rule("task_pass_rate>=0.4"), candidate)["passed"]  # boundary holds for >=
    assert not check_rule(parse_rule("task_pass_rate>0.4"), candidate)["passed"]
    rel = check_rule(parse_rule("task_pass_rate>=baseline+0.1"), candidate, baseline, "sft")
    assert rel["passed"] and rel["threshold"] == pytest.approx(0.4) and "sft 0.3 +0.1" in rel["detail"]
    worse = check_rule(parse_rule("harmless_rate>=baseline-0.01"), candidate, baseline, "sft")
    assert not worse["passed"] and worse["threshold"] == pytest.approx(0.94) and "FAILED" in worse["detail"]


def test_gate_fails_closed_and_passes_without_rules():
    models = {"sft": {"task_pass_rate": 0.3}, "dpo": {"task_pass_rate": 0.5}}
    gate = evaluate_gate(parse_rules(["task_pass_rate>=baseline", "harmless_rate>=0.5"]), models, "dpo", "sft")
    assert [r["passed"] for r in gate["rules"]] == [True, False] and gate["passed"] is False
    assert "not computed for the candidate" in gate["rules"][1]["detail"]
    gate = evaluate_gate(parse_rules(["harmless_rate>=baseline"]), {"a": {"harmless_rate": 1.0}, "b": {}}, "a", "b")
    assert not gate["passed"] and "not computed for the baseline b" in gate["rules"][0]["detail"]
    assert evaluate_gate([], models, "dpo", "sft") == {
        "passed": True,
        "candidate": "dpo",
        "baseline": "sft",
        "rules": [],
    }


def _config(*overrides):
    return load_config(
        EvaluateConfig, None, ["models=sft=/m/sft,dpo=/m/dpo", "output_dir=/tmp/out", "data_dir=/data", *overrides]
    )


def test_config_checks_rules_against_the_metrics_it_computes():
    cfg = _config("baseline=sft", "gate.rules=task_pass_rate>=baseline,harmless_rate>=0.8")
    assert cfg.candidate == "" and cfg.gate.rules == ["task_pass_rate>=baseline", "harmless_rate>=0.8"]
    computed = computed_metrics(_config("humaneval.n=10", "humaneval.k=1,10,100"))
    assert computed[2:4] == ["humaneval_pass@1", "humaneval_pass@10"]
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*humaneval_pass@10.*not computed"):
        _config("gate.rules=humaneval_pass@10>=0.1")  # n=1 allows pass@1 only
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*no baseline"):
        _config("gate.rules=task_pass_rate>=baseline")
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*reward_win_rate"):
        _config("baseline=sft", "gate.rules=reward_win_rate>=0.5")  # needs reward_model_path
    assert _config("baseline=sft", "reward_model_path=/rm", "gate.rules=reward_win_rate>=0.5")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["models=sft"], "models"),
        (["models=a=/x,a=/y"], "models: label 'a' appears twice"),
        (["candidate=ppo"], "candidate"),
        (["baseline=dpo"], "baseline: 'dpo' is also the candidate"),
        (["judge.kind=classifier"], "judge.path"),
        (["humaneval.n=4", "humaneval.temperature=0"], "humaneval.temperature"),
        (["humaneval.enabled=false", "data_dir="], "nothing to evaluate"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(*overrides)
