"""Register a release in MLflow's model registry: one model version per release.

The version points at the published model (``source``), carries the model card as its description and
the gate decision and lineage as tags (``posttrain.*``: commit, base model and revision, each data
source's fingerprint, the KFP run). A retried release of the same evaluation finds its version again
by the tag ``posttrain.release_id`` instead of adding a second one.

MLflow's own HTTP client retries an unreachable server for minutes; unless the environment says
otherwise, a registration here gives up after a few tries (the release stage then reports it).
"""

from __future__ import annotations

import contextlib
import os

#: MLflow's limit on a model version's description (its SQL column) and on a tag value.
MAX_DESCRIPTION = 5000
MAX_TAG = 5000
#: How hard MLflow's HTTP client tries an unreachable tracking server, unless the environment sets it.
QUICK_FAILURE = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


@contextlib.contextmanager
def quick_failure():
    """MLflow's HTTP retry settings of :data:`QUICK_FAILURE` for the duration, where not set already."""
    added = {k: v for k, v in QUICK_FAILURE.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def release_tags(lineage: dict, gate: dict, release_id: str) -> dict[str, str]:
    """The version's tags: the gate's decision and rules, and the lineage's key facts."""
    built, base = lineage.get("posttrain") or {}, lineage.get("base_model") or {}
    tags = {
        "posttrain.release_id": release_id,
        "posttrain.gate": "passed" if gate.get("passed") else "failed",
        "posttrain.gate_rules": "; ".join(r.get("rule", "") for r in gate.get("rules", [])),
        "posttrain.version": built.get("version"),
        "posttrain.commit": built.get("commit"),
        "posttrain.dirty": built.get("dirty"),
        "posttrain.base_model": base.get("hub_id") or base.get("location"),
        "posttrain.base_revision": base.get("revision"),
        "posttrain.base_fingerprint": base.get("fingerprint"),
        "posttrain.sources_fingerprint": lineage.get("sources_fingerprint"),
        "posttrain.image_digest": (lineage.get("image") or {}).get("digest"),
        "posttrain.stages": ",".join(s.get("stage") or "?" for s in lineage.get("stages", [])),
    }
    for name, item in (lineage.get("data") or {}).items():
        tags[f"posttrain.data.{name}"] = item["fingerprint"]
    for key, value in (lineage.get("kfp") or {}).items():
        tags[f"posttrain.kfp.{key}"] = value
    return {k: str(v)[:MAX_TAG] for k, v in tags.items() if v not in (None, "")}


def register(uri: str, name: str, source: str, description: str, tags: dict[str, str]) -> dict:
    """Make (or find again, by ``posttrain.release_id``) the version of registered model ``name`` for
    this release in the registry at ``uri``; ``{"model_name", "version", "source", "found_again"}``.
    Raises what MLflow raises when the store cannot be reached or refuses."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    with quick_failure():
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        try:
            client.create_registered_model(name, description="Released by posttrain: one version per release.")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        release_id = tags["posttrain.release_id"]
        existing = client.search_model_versions(f"name = '{name}' and tag.`posttrain.release_id` = '{release_id}'")
        if existing:
            version = existing[0]
        else:
            version = client.create_model_version(
                name, source=source, tags=tags, description=description[:MAX_DESCRIPTION]
            )
    return {"model_name": name, "version": int(version.version), "source": source, "found_again": bool(existing)}
