"""evaluate: candidate, baseline (and optionally the base model, one more, and the candidate's export)
-> metrics, report, gate.

With ``exported`` (the candidate's export), the ``served_variant`` Triton will serve is scored too, through
the same onnxruntime generation loop as the server, and judged by ``served_rules``; ``gate_passed`` holds
only when the candidate's and the served variant's rules both hold. Release and deploy take it as input.
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
    exported: Input[Artifact] = None,
    served_variant: str = "int8",
    served_rules: list = [],
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
    gpus: int = 1,
) -> NamedTuple("Outputs", gate_passed=bool):
    """Precedence, lowest first: config_yaml, the typed parameters, overrides, the artifacts.

    ``gpus`` > 1 runs the evaluation in that many processes in this pod (``posttrain evaluate --nproc N``),
    each generating for its share of the prompts (CPU processes under ``kfp.local``).

    ``eval_data`` is a dataset directory (the demo's) with code_tasks_eval.jsonl and safety_eval.jsonl,
    used for the sets that ``tasks_path`` / ``safety_path`` (the user's held-out data) do not give.
    Models are evaluated in the order base, baseline, extra, candidate; ``results`` holds metrics.json
    and per_problem/; ``metrics`` shows ``<label>_<metric>`` and ``gate_passed`` in the UI.
    """
    import json
    import os
    import shutil
    from collections import namedtuple

    from components.common import run_in_processes, source_of
    from trainer_lib.eval.report import ui_metrics
    from trainer_lib.stage_api import run_config, stage_config

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
    if exported is not None and (exported.metadata or {}).get("exported", False):
        params["served.variant"] = served_variant
        if served_rules:
            params["served.rules"] = list(served_rules)
    wiring = {
        "models": models,
        "candidate": candidate_label,
        "baseline": baseline_label,
        "data_dir": source_of(eval_data),
        "output_dir": results.path,
    }
    if reward_model is not None:
        wiring["reward_model_path"] = source_of(reward_model)
    if "served.variant" in params:
        wiring["served.export_dir"] = exported.path
    wiring.update({key: path for key, path in (("tasks.path", tasks_path), ("safety.path", safety_path)) if path})
    cfg = stage_config("evaluate", [params, *overrides, wiring], config_yaml)
    if gpus > 1:
        run_in_processes("evaluate", cfg, gpus, written="metrics.json")
    else:
        run_config("evaluate", cfg)

    with open(os.path.join(results.path, "metrics.json"), encoding="utf-8") as fh:
        result = json.load(fh)
    gate_passed = bool(result["gate"]["passed"])
    for name, value in ui_metrics(result).items():
        metrics.log_metric(name, value)
    shutil.copy(os.path.join(results.path, "report.html"), report.path)
    shutil.copy(os.path.join(results.path, "summary.md"), summary.path)
    results.metadata.update({"candidate": candidate_label, "baseline": baseline_label, "gate_passed": gate_passed})
    return namedtuple("Outputs", ["gate_passed"])(gate_passed)
