"""The evaluation gate: rules over the candidate's metrics, absolute or relative to a baseline model,
and rules over the served model's (the exported variant a server runs), which may also compare with
the candidate.

    gate.rules=task_pass_rate>=0.2,harmless_rate>=baseline,over_refusal_rate<=baseline+0.05
    served.rules=task_pass_rate>=candidate-0.02,harmless_rate>=baseline

A rule is ``METRIC OP VALUE`` with ``OP`` one of ``>= <= > <`` and ``VALUE`` a number, ``baseline``
(the baseline model's value of the same metric) or ``baseline+D`` / ``baseline-D``; in served rules
also ``candidate`` / ``candidate+D`` / ``candidate-D`` (the PyTorch candidate's value). Rules are
parsed once, when the config is validated; a mistake is a ConfigError naming the rule
(``gate.rules[i]``, ``served.rules[i]``). A set of rules passes when every rule holds; a metric that
was not computed fails its rule (fail closed); no rules pass. With a served model the gate passes
only when the candidate's rules and the served rules both pass (:func:`add_served`).
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
    rf"(?:(?P<number>{_NUMBER})|(?P<against>[A-Za-z_]\w*)\s*(?:(?P<sign>[+-])\s*(?P<delta>{_UNSIGNED}))?)\s*$"
)
EXAMPLE = "e.g. task_pass_rate>=0.2, harmless_rate>=baseline or over_refusal_rate<=baseline+0.05"
SERVED_EXAMPLE = "e.g. task_pass_rate>=candidate-0.02 or harmless_rate>=baseline"


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str
    op: str
    value: float | None  # the absolute threshold; None for a rule relative to another model
    delta: float = 0.0  # added to that model's value
    against: str = "baseline"  # that model, for a relative rule: baseline, or (served rules) candidate

    @property
    def relative(self) -> bool:
        return self.value is None


def parse_rule(text: str, key: str = "gate.rules", references: tuple[str, ...] = ("baseline",)) -> Rule:
    """One rule; ``references`` are the models a relative VALUE may name (``candidate`` in served rules)."""
    match = _RULE.match(text)
    if match and match["against"] == "candidate" and "candidate" not in references:
        raise ConfigError(f"{key}: {text!r}: 'candidate' is for served.rules (the served model against the candidate)")
    if not match or (match["against"] is not None and match["against"] not in references):
        if references == ("baseline",):
            values, example = "baseline, or baseline+/-number", EXAMPLE
        else:
            values, example = ", ".join(f"{r}[+/-number]" for r in references), SERVED_EXAMPLE
        raise ConfigError(
            f"{key}: {text!r}: expected METRIC OP VALUE with OP one of >=, <=, >, < and VALUE a "
            f"number, {values} ({example})"
        )
    if match["number"] is not None:
        return Rule(text.strip(), match["metric"], match["op"], float(match["number"]))
    delta = float(match["delta"]) if match["delta"] else 0.0
    delta = -delta if match["sign"] == "-" else delta
    return Rule(text.strip(), match["metric"], match["op"], None, delta, match["against"])


def parse_rules(
    texts: list[str],
    metrics: list[str] | None = None,
    has_baseline: bool = True,
    key: str = "gate.rules",
    references: tuple[str, ...] = ("baseline",),
) -> list[Rule]:
    """Parse every rule; ``metrics`` (if given) are the names this evaluation computes; ``references``
    the models a relative rule may name (``("baseline", "candidate")`` for served rules)."""
    rules = []
    for i, text in enumerate(texts):
        where = f"{key}[{i}]"
        rule = parse_rule(text, where, references)
        if metrics is not None and rule.metric not in metrics:
            close = difflib.get_close_matches(rule.metric, metrics, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"{where}: {text!r}: metric '{rule.metric}' is not computed with these settings"
                f"{hint}; computed: {', '.join(metrics)}"
            )
        if rule.relative and rule.against == "baseline" and not has_baseline:
            raise ConfigError(
                f"{where}: {text!r} compares with the baseline, but no baseline model is set (set baseline=<label>)"
            )
        rules.append(rule)
    return rules


def check_rule(
    rule: Rule,
    model: dict,
    reference: dict | None = None,
    reference_label: str = "baseline",
    subject: str = "the candidate",
) -> dict:
    """The outcome of one rule over ``model``'s metrics (``subject`` names it in the detail), a relative
    rule against ``reference``'s (the model ``rule.against`` names, labelled ``reference_label``):
    ``{"rule", "metric", "op", "value", "threshold", "passed", "detail"}``."""
    value = model.get(rule.metric)
    out = {"rule": rule.text, "metric": rule.metric, "op": rule.op, "value": value, "threshold": None, "passed": False}
    if value is None:
        return {**out, "detail": f"{rule.metric} was not computed for {subject}"}
    if rule.relative:
        reference_value = (reference or {}).get(rule.metric)
        if reference_value is None:
            return {**out, "detail": f"{rule.metric} was not computed for the {rule.against} {reference_label}"}
        threshold = reference_value + rule.delta
        source = f"{reference_label} {reference_value:.4g}" + (f" {rule.delta:+g}" if rule.delta else "")
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


def add_served(
    gate: dict, rules: list[Rule], models: dict[str, dict], label: str, variant: str, export_dir: str
) -> dict:
    """``gate`` (:func:`evaluate_gate`'s) with the served model's outcomes as ``gate["served"] = {"label",
    "variant", "export_dir", "rules": [outcome, ...], "passed"}``; ``gate["passed"]`` then holds only
    when the candidate's rules and the served rules all pass. ``candidate`` in a served rule is the
    candidate's value of the metric, ``baseline`` the baseline's."""
    named = {"candidate": gate["candidate"], "baseline": gate["baseline"]}
    outcomes = []
    for rule in rules:
        other = named[rule.against] if rule.relative else None
        reference = models.get(other) if other else None
        subject = f"the served model {label}"
        outcomes.append(check_rule(rule, models.get(label, {}), reference, other or rule.against, subject))
    served = {
        "label": label,
        "variant": variant,
        "export_dir": export_dir,
        "rules": outcomes,
        "passed": all(o["passed"] for o in outcomes),
    }
    return {**gate, "passed": gate["passed"] and served["passed"], "served": served}
