"""release: publish the evaluated candidate, only when the evaluation gate passed, with its lineage, model
card and (given a tracking URI) a version in MLflow's model registry.

The gate is a parameter, not a ``dsl.If``, so the same step works inside a branch of the DAG
(kfp.local cannot resolve a condition on a task output nested in another condition). The run's given
sources (``base_model``, ``dataset``...) are the pipeline's parameters of those names: the release
fingerprints them as the ``fingerprint`` step does. ``run_id`` and ``run_name`` take KFP's placeholders.
"""

from kfp import dsl
from kfp.dsl import Artifact, Input, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("release"), install_kfp_package=False)
def release(
    model: Input[Model],
    results: Input[Artifact],
    released: Output[Model],
    gate_passed: bool,
    release_uri: str = "",
    model_name: str = "posttrain",
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    prompt_dataset: str = "",
    run_id: str = "",
    run_name: str = "",
    registry_uri: str = "",
    overrides: list = [],
):
    """Copy ``model`` to ``release_uri`` (or, when empty, into the ``released`` artifact); ``registry_uri``
    (else ``$MLFLOW_TRACKING_URI``): register it there; ``overrides``: 'key=value' for 'posttrain release'."""
    import os

    from components.common import mark_source, source_of
    from trainer_lib.runner.stage_api import run_stage

    if not gate_passed:
        print("release: the evaluation gate failed; nothing is published")
        released.metadata.update({"released": False})
        return
    given = {"base_model": base_model, "dataset": dataset}
    given.update(preference_dataset=preference_dataset, prompt_dataset=prompt_dataset)
    wiring = {
        "model_path": source_of(model),
        "release_uri": release_uri or released.path,
        "evaluation": os.path.join(results.path, "metrics.json"),
        "model_name": model_name,
        "lineage.sources": [f"{name}={location}" for name, location in given.items() if location],
        "lineage.kfp_run_id": run_id,
        "lineage.kfp_run_name": run_name,
    }
    if registry_uri:
        wiring["registry.mlflow_uri"] = registry_uri
    if not release_uri:  # registered as where other pods find the artifact (KFP's minio:// is S3)
        wiring["registry.source_uri"] = (released.uri or released.path).replace("minio://", "s3://", 1)
    summary = run_stage("release", [*overrides, wiring])
    if release_uri:
        mark_source(released, release_uri)
    released.metadata.update(
        {
            "released": True,
            "release_uri": summary["release_uri"],
            "commit": summary.get("commit") or "",
            **({"registered_version": summary["registered_version"]} if "registered_version" in summary else {}),
        }
    )
