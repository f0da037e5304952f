"""release: publish the evaluated candidate, only when the evaluation gate passed.

The gate is a parameter, not a ``dsl.If``, so the same step works inside a branch of the DAG
(kfp.local cannot resolve a condition on a task output nested in another condition).
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
):
    """Copy ``model`` to ``release_uri`` (or, when empty, into the ``released`` artifact)."""
    import os

    from components.common import mark_source, source_of
    from trainer_lib.stage_api import run_stage

    if not gate_passed:
        print("release: the evaluation gate failed; nothing is published")
        released.metadata.update({"released": False})
        return
    target = release_uri or released.path
    summary = run_stage(
        "release",
        {
            "model_path": source_of(model),
            "release_uri": target,
            "evaluation": os.path.join(results.path, "metrics.json"),
        },
    )
    if release_uri:
        mark_source(released, release_uri)
    released.metadata.update({"released": True, "release_uri": summary["release_uri"]})
