"""prepare: raw dataset (+ the model's tokenizer, to measure token lengths) -> train/eval splits."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("prepare"), install_kfp_package=False)
def prepare(
    data: Input[Dataset],
    model: Input[Model],
    prepared: Output[Dataset],
    metrics: Output[Metrics],
    max_length: int = 512,
    eval_fraction: float = 0.05,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
):
    """Precedence, lowest first: config_yaml, the typed parameters, overrides, the artifacts."""
    from components.common import log_summary, source_of
    from trainer_lib.runner.stage_api import run_stage

    params = {"data.max_length": max_length, "data.eval_fraction": eval_fraction, "seed": seed}
    wiring = {"data.path": source_of(data), "model.path": source_of(model), "output_dir": prepared.path}
    stats = run_stage("prepare", [params, *overrides, wiring], config_yaml)
    prepared.metadata.update({"format": stats.get("format"), "rows": stats.get("rows")})
    log_summary(metrics, stats)
