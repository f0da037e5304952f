"""export: a model that passed the gate -> ONNX FP32 with KV cache, INT8 copy, parity report.

Like ``release``, the gate is a parameter rather than a ``dsl.If`` so the step also works inside
a branch of the DAG under ``kfp.local``; with ``gate_passed`` false nothing is exported.
"""

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("export"), install_kfp_package=False)
def export(
    model: Input[Model],
    exported: Output[Artifact],
    metrics: Output[Metrics],
    gate_passed: bool = True,
    config_yaml: str = "",
    overrides: list = [],
):
    """Precedence, lowest first: config_yaml, overrides, the artifacts (``model_path``, ``output_dir``)."""
    from components.common import log_summary, source_of
    from trainer_lib.stage_api import run_stage

    if not gate_passed:
        print("export: the evaluation gate failed; nothing is exported")
        exported.metadata.update({"exported": False})
        return
    summary = run_stage(
        "export", [*overrides, {"model_path": source_of(model), "output_dir": exported.path}], config_yaml
    )
    exported.metadata.update({"exported": True, "base": source_of(model), "models": summary["models"]})
    log_summary(
        metrics,
        {
            key: summary[key]
            for key in (
                "fp32_max_abs_diff",
                "top1_agreement",
                "greedy_exact_match",
                "weight_bytes",
                "decode_ms_per_token",
            )
            if key in summary
        },
    )
