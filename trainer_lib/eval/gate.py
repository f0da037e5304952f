"""The evaluation gate: rules over the candidate's metrics, absolute or relative to a baseline model.

    gate.rules=task_pass_rate>=0.2,harmless_rate>=baseline,over_refusal_rate<=baseline+0.05

A rule is ``METRIC OP VALUE`` with ``OP`` one of ``>= <= > <`` and ``VALUE`` a number, ``baseline``
(the baseline model's value of the same metric) or ``baseline+D`` / ``baseline-D``. Rules are parsed
once, when the config is validated; a mistake is a ConfigError naming ``gate.rules``. The gate
passes when every rule holds; a metric that was not computed fails its rule (fail closed). With no
rules the gate passes.
"""

from __future__ import annotations

import difflib
import operator
import re
from dataclasses import dataclass

from trainer_lib.errors import ConfigError

OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
_UNSIGNED = r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_NUMBER = rf"[+-]?{_UNSIGNED}"
_RULE = re.compile(
    rf"^\s*(?P<metric>[A-Za-z_][\w@./-]*)\s*(?P<op>>=|<=|>|<)\s*"
    rf"(?:(?P<number>{_NUMBER})|baseline\s*(?:(?P<sign>[+-])\s*(?P<delta>{_UNSIGNED}))?)\s*$"
)
EXAMPLE = "e.g. task_pass_rate>=0.2, harmless_rate>=baseline or over_refusal_rate<=baseline+0.05"


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str
    op: str
    value: float | None  # the absolute threshold; None for a rule relative to the baseline
    delta: float = 0.0  # added to the baseline's value

    @property
    def relative(self) -> bool:
        return self.value is None


def parse_rule(text: str, key: str = "gate.rules") -> Rule:
    match = _RULE.match(text)
    if not match:
        raise ConfigError(
            f"{key}: {text!r}: expected METRIC OP VALUE with OP one of >=, <=, >, < and VALUE a "
            f"number, baseline, or baseline+/-number ({EXAMPLE})"
        )
    if match["number"] is not None:
        return Rule(text.strip(), match["metric"], match["op"], float(match["number"]))
    delta = float(match["delta"]) if match["delta"] else 0.0
    return Rule(text.strip(), match["metric"], match["op"], None, -delta if match["sign"] == "-" else delta)


def parse_rules(
    texts: list[str], metrics: list[str] | None = None, has_baseline: bool = True, key: str = "gate.rules"
) -> list[Rule]:
    """Parse every rule; ``metrics`` (if given) are the names this evaluation computes."""
    rules = []
    for i, text in enumerate(texts):
        where = f"{key}[{i}]"
        rule = parse_rule(text, where)
        if metrics is not None and rule.metric not in metrics:
            close = difflib.get_close_matches(rule.metric, metrics, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"{where}: {text!r}: metric '{rule.metric}' is not computed with these settings"
                f"{hint}; computed: {', '.join(metrics)}"
            )
        if rule.relative and not has_baseline:
            raise ConfigError(
                f"{where}: {text!r} compares with the baseline, but no baseline model is set (set baseline=<label>)"
            )
        rules.append(rule)
    return rules


def check_rule(rule: Rule, candidate: dict, baseline: dict | None = None, baseline_label: str = "baseline") -> dict:
    """The outcome of one rule: ``{"rule", "metric", "op", "value", "threshold", "passed", "detail"}``."""
    value = candidate.get(rule.metric)
    out = {"rule": rule.text, "metric": rule.metric, "op": rule.op, "value": value, "threshold": None, "passed": False}
    if value is None:
        return {**out, "detail": f"{rule.metric} was not computed for the candidate"}
    if rule.relative:
        reference = (baseline or {}).get(rule.metric)
        if reference is None:
            return {**out, "detail": f"{rule.metric} was not computed for the baseline {baseline_label}"}
        threshold = reference + rule.delta
        source = f"{baseline_label} {reference:.4g}" + (f" {rule.delta:+g}" if rule.delta else "")
    else:
        threshold, source = rule.value, "absolute"
    passed = OPS[rule.op](value, threshold)
    return {
        **out,
        "threshold": threshold,
        "passed": passed,
        "detail": f"{value:.4g} {rule.op} {threshold:.4g} ({source}): {'ok' if passed else 'FAILED'}",
    }


def evaluate_gate(rules: list[Rule], models: dict[str, dict], candidate: str, baseline: str | None = None) -> dict:
    """``{"passed", "candidate", "baseline", "rules": [outcome, ...]}``; passes when every rule holds."""
    reference = models.get(baseline) if baseline else None
    outcomes = [check_rule(rule, models[candidate], reference, baseline or "baseline") for rule in rules]
    return {
        "passed": all(o["passed"] for o in outcomes),
        "candidate": candidate,
        "baseline": baseline,
        "rules": outcomes,
    }
