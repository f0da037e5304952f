"""deploy: an export -> the next version of a Triton model in a repository, loaded and smoke-tested.

``repository`` is the Triton model repository root (``s3://...`` or a path the server sees);
empty: the ``repository`` output artifact holds it. With ``triton_url`` empty the step only
publishes; a server started on the repository (or KServe with ``storageUri`` at its root) serves it.
The gate is a parameter rather than a ``dsl.If``, so the step also works inside a branch of the DAG
under ``kfp.local``: with ``gate_passed`` false (or an export that did not run) nothing is deployed.
``variant=fp16`` is served on the server's GPU.
"""

from kfp import dsl
from kfp.dsl import Artifact, Input, Output

from components.common import image_for


@dsl.component(base_image=image_for("deploy"), install_kfp_package=False)
def deploy(
    exported: Input[Artifact],
    repository: Output[Artifact],
    model_name: str = "posttrain",
    variant: str = "int8",
    repository_uri: str = "",
    triton_url: str = "",
    gate_passed: bool = True,
    overrides: list = [],
):
    """Skips (and says so) when the gate failed or the export did not run."""
    from components.common import mark_source
    from trainer_lib.runner.stage_api import run_stage

    if not gate_passed:
        print("deploy: the evaluation gate failed; nothing is deployed")
        repository.metadata.update({"deployed": False})
        return
    if not (exported.metadata or {}).get("exported", False):
        print("deploy: nothing was exported; nothing is deployed")
        repository.metadata.update({"deployed": False})
        return
    target = repository_uri or repository.path
    summary = run_stage(
        "deploy",
        [
            {"model_name": model_name, "variant": variant},
            *overrides,
            {"export.path": exported.path, "repository": target, "triton.url": triton_url},
        ],
    )
    if repository_uri:
        mark_source(repository, repository_uri)
    repository.metadata.update(
        {
            "deployed": True,
            **{
                k: summary[k]
                for k in ("model_name", "version", "variant", "instance_kind", "endpoint", "generate_url")
                if summary.get(k) is not None
            },
        }
    )
