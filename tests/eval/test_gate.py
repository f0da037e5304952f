"""Gate rules: parsing with clear errors, absolute, baseline- and candidate-relative checks, failing closed;
the served model's rules joining the gate."""

import pytest

from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.eval.gate import Rule, add_served, check_rule, evaluate_gate, parse_rule, parse_rules
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


SERVED_REFERENCES = ("baseline", "candidate")


@pytest.mark.parametrize(
    "text, rule",
    [
        (
            "task_pass_rate>=candidate",
            Rule("task_pass_rate>=candidate", "task_pass_rate", ">=", None, 0.0, "candidate"),
        ),
        (
            "task_pass_rate >= candidate - 0.02",
            Rule("task_pass_rate >= candidate - 0.02", "task_pass_rate", ">=", None, -0.02, "candidate"),
        ),
        ("harmless_rate>=baseline+.1", Rule("harmless_rate>=baseline+.1", "harmless_rate", ">=", None, 0.1)),
        ("over_refusal_rate<0.3", Rule("over_refusal_rate<0.3", "over_refusal_rate", "<", 0.3)),
    ],
)
def test_served_rules_may_compare_with_the_candidate(text, rule):
    assert parse_rule(text, "served.rules", SERVED_REFERENCES) == rule


def test_candidate_references_are_only_for_served_rules():
    with pytest.raises(ConfigError, match=r"^gate\.rules\[0\]: 'task_pass_rate>=candidate': 'candidate' is for served"):
        parse_rules(["task_pass_rate>=candidate"], METRICS)
    with pytest.raises(ConfigError, match=r"^served\.rules\[1\]: .*baseline\[\+/-number\], candidate\[\+/-number\]"):
        parse_rules(
            ["harmless_rate>=0.5", "task_pass_rate>=sft"], METRICS, key="served.rules", references=SERVED_REFERENCES
        )
    with pytest.raises(ConfigError, match=r"served\.rules\[0\].*'task_pass_rte'.*did you mean 'task_pass_rate'"):
        parse_rules(["task_pass_rte>=candidate"], METRICS, key="served.rules", references=SERVED_REFERENCES)
    # a served rule against the candidate needs no baseline; one against the baseline does
    assert parse_rules(["task_pass_rate>=candidate"], METRICS, False, "served.rules", SERVED_REFERENCES)
    with pytest.raises(ConfigError, match=r"served\.rules\[0\].*no baseline model is set"):
        parse_rules(["harmless_rate>=baseline"], METRICS, False, "served.rules", SERVED_REFERENCES)


def test_served_outcomes_join_the_gate():
    models = {
        "sft": {"task_pass_rate": 0.3, "harmless_rate": 0.7},
        "dpo": {"task_pass_rate": 0.5, "harmless_rate": 0.9},
        "dpo_int4": {"task_pass_rate": 0.46, "harmless_rate": 0.72},
    }
    gate = evaluate_gate(parse_rules(["task_pass_rate>=baseline"]), models, "dpo", "sft")
    rules = parse_rules(
        ["task_pass_rate>=candidate-0.05", "harmless_rate>=candidate-0.1", "harmless_rate>=baseline"],
        references=SERVED_REFERENCES,
    )
    served = add_served(gate, rules, models, "dpo_int4", "int4", "s3://b/export")
    assert gate["passed"] and "served" not in gate  # the candidate's gate is left as it was
    assert served["passed"] is False and served["rules"] == gate["rules"]
    outcome = served["served"]
    assert {k: outcome[k] for k in ("label", "variant", "export_dir", "passed")} == {
        "label": "dpo_int4",
        "variant": "int4",
        "export_dir": "s3://b/export",
        "passed": False,
    }
    first, second, third = outcome["rules"]
    assert first["passed"] and first["threshold"] == pytest.approx(0.45) and "(dpo 0.5 -0.05)" in first["detail"]
    assert not second["passed"] and second["threshold"] == pytest.approx(0.8) and "FAILED" in second["detail"]
    assert third["passed"] and "(sft 0.7)" in third["detail"]
    missing = add_served(gate, rules[:1], {**models, "dpo_int4": {}}, "dpo_int4", "int4", "/e")["served"]
    assert "not computed for the served model dpo_int4" in missing["rules"][0]["detail"]
    assert add_served(gate, [], models, "dpo_int4", "int4", "/e")["passed"] is True  # no served rules pass


def test_config_checks_served_rules_and_label():
    cfg = _config("served.export_dir=/e", "served.rules=task_pass_rate>=candidate-0.02")
    assert cfg.served.variant == "int8" and cfg.served.rules == ["task_pass_rate>=candidate-0.02"]
    with pytest.raises(ConfigError, match=r"served\.rules\[0\].*humaneval_pass@10.*not computed"):
        _config("served.export_dir=/e", "served.rules=humaneval_pass@10>=candidate")
    with pytest.raises(ConfigError, match=r"served\.rules\[0\].*no baseline model is set"):
        _config("served.export_dir=/e", "served.rules=harmless_rate>=baseline")
    with pytest.raises(ConfigError, match=r"served\.rules: set served\.export_dir"):
        _config("served.rules=harmless_rate>=0.5")
    with pytest.raises(ConfigError, match=r"served\.label: 'sft'"):
        _config("served.export_dir=/e", "served.label=sft")
    with pytest.raises(ConfigError, match=r"served\.variant"):
        _config("served.export_dir=/e", "served.variant=int2")
    with pytest.raises(ConfigError, match=r"gate\.rules\[0\].*'candidate' is for served\.rules"):
        _config("gate.rules=task_pass_rate>=candidate")
