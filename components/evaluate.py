"""evaluate: candidate, baseline (and optionally the base model and one more) -> metrics, report, gate.

The pipeline deploys only under ``dsl.If(evaluate_task.outputs["gate_passed"] == True)``.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("evaluate"), install_kfp_package=False)
def evaluate(
    candidate: Input[Model],
    baseline: Input[Model],
    eval_data: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[HTML],
    summary: Output[Markdown],
    results: Output[Artifact],
    base_model: Input[Model] = None,
    extra_model: Input[Model] = None,
    reward_model: Input[Model] = None,
    candidate_label: str = "candidate",
    baseline_label: str = "baseline",
    base_label: str = "base",
    extra_label: str = "extra",
    gate_rules: list = [],
    judge: str = "refusal_rules",
    humaneval_limit: int = 0,
    humaneval_n: int = 1,
    seed: int = 0,
    tasks_path: str = "",
    safety_path: str = "",
    config_yaml: str = "",
    overrides: list = [],
) -> NamedTuple("Outputs", gate_passed=bool):
    """Precedence, lowest first: config_yaml, the typed parameters, overrides, the artifacts.

    ``eval_data`` is a dataset directory (the demo's) with code_tasks_eval.jsonl and safety_eval.jsonl,
    used for the sets that ``tasks_path`` / ``safety_path`` (the user's held-out data) do not give.
    Models are evaluated in the order base, baseline, extra, candidate; ``results`` holds metrics.json
    and per_problem/; ``metrics`` shows ``<label>_<metric>`` and ``gate_passed`` in the UI.
    """
    import json
    import os
    import shutil
    from collections import namedtuple

    from components.common import source_of
    from trainer_lib.eval.report import ui_metrics
    from trainer_lib.stage_api import run_stage

    given = [
        (base_label, base_model),
        (baseline_label, baseline),
        (extra_label, extra_model),
        (candidate_label, candidate),
    ]
    models = [f"{label}={source_of(artifact)}" for label, artifact in given if artifact is not None]
    params = {"judge.kind": judge, "humaneval.limit": humaneval_limit, "humaneval.n": humaneval_n, "seed": seed}
    if gate_rules:
        params["gate.rules"] = list(gate_rules)
    wiring = {
        "models": models,
        "candidate": candidate_label,
        "baseline": baseline_label,
        "data_dir": source_of(eval_data),
        "output_dir": results.path,
    }
    if reward_model is not None:
        wiring["reward_model_path"] = source_of(reward_model)
    wiring.update({key: path for key, path in (("tasks.path", tasks_path), ("safety.path", safety_path)) if path})
    outcome = run_stage("evaluate", [params, *overrides, wiring], config_yaml)

    with open(os.path.join(results.path, "metrics.json"), encoding="utf-8") as fh:
        result = json.load(fh)
    for name, value in ui_metrics(result).items():
        metrics.log_metric(name, value)
    shutil.copy(os.path.join(results.path, "report.html"), report.path)
    shutil.copy(os.path.join(results.path, "summary.md"), summary.path)
    results.metadata.update(
        {"candidate": candidate_label, "baseline": baseline_label, "gate_passed": outcome["gate_passed"]}
    )
    return namedtuple("Outputs", ["gate_passed"])(outcome["gate_passed"])
