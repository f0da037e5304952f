"""export: a trained model -> ONNX FP32 and FP16 with a KV cache, INT8 (INT4) copies, parity report.

It runs before the evaluation gate, which scores the variant to be served (components/evaluate.py);
deploy publishes it only when the gate passed.
"""

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("export"), install_kfp_package=False)
def export(
    model: Input[Model],
    exported: Output[Artifact],
    metrics: Output[Metrics],
    config_yaml: str = "",
    overrides: list = [],
):
    """Precedence, lowest first: config_yaml, overrides, the artifacts (``model_path``, ``output_dir``)."""
    from components.common import log_summary, source_of
    from trainer_lib.runner.stage_api import run_stage

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
