"""evaluate: candidate, baseline (and optionally the base model, one more, and the candidate's export)
-> metrics, report, gate.

With ``exported`` (the candidate's export), the ``served_variant`` Triton will serve is scored too, through
the same onnxruntime generation loop as the server, and judged by ``served_rules``; ``gate_passed`` holds
only when the candidate's and the served variant's rules both hold. Release and deploy take it as input.

``gpus`` > 1 runs the evaluation in that many processes in this pod (torchrun, through
:func:`trainer_lib.runner.dispatch.dispatch`), each generating for its share of the prompts (CPU processes
under ``kfp.local``).

``eval_data`` is a dataset directory (the demo's) with code_tasks_eval.jsonl and safety_eval.jsonl,
used for the sets that ``tasks_path`` / ``safety_path`` (the user's held-out data) do not give.
Models are evaluated in the order base, baseline, extra, candidate; ``results`` holds metrics.json
and per_problem/; ``metrics`` shows ``<label>_<metric>`` and ``gate_passed`` in the UI.
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
    """Evaluate the models given. Precedence, lowest first: config_yaml, parameters, overrides, artifacts."""
    from collections import namedtuple

    from components.common import source_of
    from trainer_lib.runner.dispatch import Where, dispatch
    from trainer_lib.runner.outcome import evaluation
    from trainer_lib.runner.stage_api import evaluation_layers, stage_config

    models = (base_model, baseline, extra_model, candidate)
    labels = (base_label, baseline_label, extra_label, candidate_label)
    settings = {"judge.kind": judge, "humaneval.limit": humaneval_limit, "humaneval.n": humaneval_n, "seed": seed}
    settings.update({"gate.rules": gate_rules, "served.variant": served_variant, "served.rules": served_rules})
    wiring = {
        "models": [f"{label}={source_of(model)}" for label, model in zip(labels, models) if model is not None],
        "candidate": candidate_label,
        "baseline": baseline_label,
        "data_dir": source_of(eval_data),
        "output_dir": results.path,
        "reward_model_path": None if reward_model is None else source_of(reward_model),
        "served.export_dir": exported.path if (getattr(exported, "metadata", None) or {}).get("exported") else None,
        "tasks.path": tasks_path or None,
        "safety.path": safety_path or None,
    }
    cfg = stage_config("evaluate", evaluation_layers(settings, overrides, wiring), config_yaml)
    dispatch("evaluate", cfg, Where(processes=gpus))
    outcome = evaluation(results.path, report.path, summary.path)
    for name, value in outcome.metrics.items():
        metrics.log_metric(name, value)
    results.metadata.update(candidate=candidate_label, baseline=baseline_label, gate_passed=outcome.gate_passed)
    return namedtuple("Outputs", ["gate_passed"])(outcome.gate_passed)
