"""PEP 8 compliance of the generated code on the held-out code tasks.

Each completion's code is taken as the ``code_execution`` and ``code_style`` rewards take it (the first
fenced block, else the whole text) and counted by the ``code_style`` reward's own counter
(:func:`trainer_lib.rewards.functions.style_violations`: pycodestyle's default rules, 79 columns; it
only tokenizes the code, never runs it), so the number RL optimizes and the number reported here are
one measurement.

    style_compliance_rate   fraction of programs with no pycodestyle violation
    style_violations_mean   mean number of violations per program

HumanEval is left out: its plain completions are function bodies that continue the benchmark's own
prompt, so their style cannot be judged apart from the prompt's.
"""

from __future__ import annotations

from trainer_lib.rewards.functions import extract_code, style_violations


def style_metrics(completions: list[str]) -> tuple[dict[str, float], list[int]]:
    """(metrics, violations per completion) for generated texts; an empty list is a ValueError."""
    if not completions:
        raise ValueError("style_metrics: no completions to score")
    counts = [style_violations(extract_code(text)) for text in completions]
    metrics = {
        "style_compliance_rate": sum(count == 0 for count in counts) / len(counts),
        "style_violations_mean": sum(counts) / len(counts),
    }
    return metrics, counts
