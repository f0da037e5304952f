"""reward: base (or SFT) model + prepared preference pairs -> reward model (HF sequence classification)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def reward(
    model: Input[Model],
    data: Input[Dataset],
    output_model: Output[Model],
    metrics: Output[Metrics],
    max_steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
):
    """Precedence, lowest first: config_yaml, the typed parameters, overrides, the artifacts."""
    from components.common import last_logged, log_summary, source_of
    from trainer_lib.stage_api import run_stage

    params = {"max_steps": max_steps, "lr": lr, "batch_size": batch_size, "data.max_length": max_length,
              "seed": seed}
    wiring = {"model.path": source_of(model), "data.path": source_of(data), "output_dir": output_model.path}
    summary = run_stage("reward", [params, *overrides, wiring], config_yaml)
    stats = summary.get("reward_stats", {})
    output_model.metadata.update({"stage": "reward", "steps": summary.get("steps"), "base": source_of(model),
                                  "reward_mean": stats.get("reward_mean"), "reward_std": stats.get("reward_std")})
    log_summary(metrics, {**summary, "train": last_logged(output_model.path, "train")})
