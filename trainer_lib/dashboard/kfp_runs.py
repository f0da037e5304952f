"""The runs of a Kubeflow Pipelines instance (``posttrain dashboard --kfp-host URL``).

The KFP API gives each run's name, state and pipeline root; the files are where KFP v2's launcher puts a
task's outputs: ``<pipeline root>/<pipeline name>/<run id>/<task>/<output>`` in the object store. So each
KFP run becomes one more root of the dashboard, read through the storage layer like any ``s3://`` prefix,
and its tasks and stage outputs show as a local pipeline root's do. A run that set no pipeline root takes
``--kfp-pipeline-root`` (KFP's default ``minio://mlpipeline/v2/artifacts`` is read as the ``s3://`` bucket
of the configured endpoint, ``AWS_ENDPOINT_URL`` pointing at MinIO).

The client is kfp's own (``kfp.Client``), with ``$KFP_TOKEN`` as the bearer token where one is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"


@dataclass(frozen=True)
class KfpRun:
    run_id: str
    name: str  # the run's display name
    state: str  # RUNNING, SUCCEEDED, FAILED, ...
    created_at: str
    location: str  # where its tasks' outputs are


def as_storage_url(root: str) -> str:
    """``minio://bucket/path`` (KFP's MinIO scheme) as ``s3://bucket/path``; other URLs as they are."""
    return "s3://" + root[len("minio://") :] if root.startswith("minio://") else root


def list_kfp_runs(host: str, namespace: str | None = None, pipeline_root: str = DEFAULT_PIPELINE_ROOT, limit: int = 50):
    """The newest ``limit`` runs of the KFP instance at ``host`` (of ``namespace`` in a multi-user one)."""
    import kfp

    client = kfp.Client(host=host, namespace=namespace or "kubeflow", existing_token=os.environ.get("KFP_TOKEN"))
    response = client.list_runs(page_size=limit, sort_by="created_at desc", namespace=namespace)
    runs = []
    for run in response.runs or []:
        spec = run.pipeline_spec or {}
        pipeline = ((spec.get("pipelineInfo") or {}).get("name")) or run.display_name
        given = getattr(run.runtime_config, "pipeline_root", None) if run.runtime_config else None
        root = as_storage_url((given or pipeline_root).rstrip("/"))
        runs.append(
            KfpRun(
                run_id=run.run_id,
                name=run.display_name or run.run_id,
                state=str(run.state or ""),
                created_at=str(run.created_at or ""),
                location=f"{root}/{pipeline}/{run.run_id}",
            )
        )
    return runs
