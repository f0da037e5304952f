"""tune: a hyperparameter search before a training task, run in this pod; its best config goes to that task.

``search`` is a ``posttrain tune`` search file as YAML or JSON text (the pipeline's ``<stage>_search``
parameter). Its trials are built on the config the training task after it would build from the same
inputs (this component takes the train component's: ``stage``, the artifacts, the typed parameters,
``params``, ``config_yaml``, ``overrides``), with the search file's ``overrides`` laid over it for the trials
only. What the search does and refuses: :mod:`trainer_lib.runner.tune.pipeline_search`.

Each trial is a ``posttrain <stage>`` process of its own in this pod, ``parallel`` at once (the search
file's key), on the pod's accelerators: the pod is sized as a training step (``gpus_per_step``), and a
trial takes the first GPU it sees, so ``parallel`` says how many trials share it. The trials and their
models live in a scratch folder that goes with the pod: a retried task searches again. A search too large
for one pod goes to Katib instead (``posttrain tune --target katib``, docs/tuning.md).

Outputs: ``best_config``, the training task's config with the best trial's values and seed (what
``posttrain <stage> --config`` takes; the train component's ``tuned`` input); ``results``, the search's
results.json (every trial: state, value, values, seed, reason; the best one; the parameter importances);
``report``, its report.html (the trials over time, the importances, the table); ``metrics``, the best
value (``best.<metric>``), the best values (``best.<key>``) and the trials by state.
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("tune"), install_kfp_package=False)
def tune(
    stage: str,
    search: str,
    model: Input[Model],
    data: Input[Dataset],
    best_config: Output[Artifact],
    results: Output[Artifact],
    report: Output[HTML],
    metrics: Output[Metrics],
    max_steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    params: dict = {},
    config_yaml: str = "",
    overrides: list = [],
):
    """Search ``stage``'s keys as ``search`` says, on the config the train component would build from the
    same inputs; write the best config, the results and the report, and log the best value."""
    import os
    import shutil
    import tempfile
    from collections import Counter

    from components.common import log_summary, source_of, stage_params
    from trainer_lib.runner.stage_api import training_layers
    from trainer_lib.runner.tune.pipeline_search import pipeline_search, run_pipeline_search

    paths = {"model.path": source_of(model), "data.path": source_of(data)}
    typed = dict(max_steps=max_steps, lr=lr, batch_size=batch_size, max_length=max_length, seed=seed)
    given = dict(params=stage_params(stage, data, params), overrides=overrides, reward_functions=[], reward_weights=[])
    layers = training_layers({**typed, **given}, paths)
    with tempfile.TemporaryDirectory(prefix="posttrain-tune-") as scratch:
        found = pipeline_search(stage, search, layers, config_yaml, scratch)
        outcome = run_pipeline_search(found, layers, config_yaml, best_config.path)
        shutil.copyfile(os.path.join(scratch, "results.json"), results.path)
        shutil.copyfile(os.path.join(scratch, "report.html"), report.path)
    best = outcome["best"]
    states = Counter(row["state"] for row in outcome["trials"])
    log_summary(metrics, {f"best.{outcome['metric']}": best["value"], "best": best["params"], "trials": states})
    best_config.metadata.update(
        {"stage": stage, "trial": best["trial"], "metric": outcome["metric"], "value": best["value"]}
    )
