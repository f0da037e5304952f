"""``posttrain release``: publish a model that passed the evaluation gate, with its lineage and model card.

    posttrain release model_path=M evaluation=EVAL/metrics.json release_uri=OUT \\
        [lineage.sources=base_model=Qwen/Qwen2.5-0.5B,dataset=s3://b/chat] [registry.mlflow_uri=sqlite:///r.db]

Copies the model directory to ``release_uri`` (local or URL), writes its model card ``README.md``
(:mod:`trainer_lib.release.model_card`) and then ``release.json``: the gate's decision, rules and figures,
the candidate's metrics, and the lineage (:mod:`trainer_lib.release.lineage`: base model and revision,
data sources and fingerprints, every stage's effective config, posttrain's version and commit, the
image, the KFP run). ``release.json`` is written last, so a consumer that waits for it never sees a
half-copied model. A model whose gate failed is never published: the stage says so and exits with an
error, so a pipeline or script cannot mistake it for a release.

With a tracking URI (``registry.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``) the release becomes a version
of ``model_name`` in MLflow's model registry (:mod:`trainer_lib.release.model_registry`). It registers after
the files are published, and ``release.json`` records the version or the error. A registration that fails
then fails the stage (``registry.required``, the default): a team that gave a registry deploys from it, and a
release the registry never heard of must not pass as a green run; the published files stay, and a retry
registers them. ``registry.required=false`` only warns.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, UserError

CARD_FILE = "README.md"
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")


@dataclass
class LineageConfig:
    sources: list[str] = opt(
        [],
        "name=location of the run's given sources (base_model, dataset, preference_dataset, prompt_dataset): "
        "fingerprinted into the lineage; empty: the first stage's inputs stand for them.",
    )
    kfp_run_id: str = opt("", "The KFP run this release belongs to (the release task's placeholder).")
    kfp_run_name: str = opt("", "The KFP run's name.")
    pipeline_version: str = opt("", "The pipeline (version) that ran, where the caller knows it.")


@dataclass
class RegistryConfig:
    mlflow_uri: str = opt("", "MLflow tracking/registry URI to register the release in; default $MLFLOW_TRACKING_URI.")
    source_uri: str = opt("", "What the registered version points at; default release_uri.")
    required: bool = opt(True, "A failed registration fails the stage (after publishing); false: a warning.")


@dataclass
class ReleaseConfig:
    model_path: str | None = opt(None, "The evaluated model directory (local or URL).")
    release_uri: str | None = opt(None, "Where to publish it (local dir or URL).")
    evaluation: str | None = opt(None, "The evaluate stage's metrics.json (its gate decides).")
    model_name: str = opt("posttrain", "The model's name: the model card's title and the registered model's name.")
    lineage: LineageConfig = opt(LineageConfig, "Where the run's sources and KFP run are named.")
    registry: RegistryConfig = opt(RegistryConfig, "MLflow model registry.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key in ("model_path", "release_uri", "evaluation"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: required")
        if not _NAME.match(self.model_name):
            raise ConfigError(f"model_name: {self.model_name!r}: expected letters, digits, _ . - (a registry name)")
        self.sources()

    def sources(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.lineage.sources:
            name, sep, location = (part.strip() for part in item.partition("="))
            if not sep or not _NAME.match(name) or name in out:
                raise ConfigError(f"lineage.sources: {item!r}: expected name=location, each name once")
            out[name] = location
        return out

    def tracking_uri(self) -> str:
        return self.registry.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI", "")


CONFIG = ReleaseConfig


def read_evaluation(path: str) -> dict:
    """The evaluate stage's metrics.json, with its gate."""
    try:
        result = json.loads(storage.read_text(path))
        result["gate"]["passed"]
    except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"evaluation: {path} is not an evaluate metrics.json ({exc})") from None
    return result


def run(cfg: ReleaseConfig) -> dict:
    from trainer_lib.release import lineage as lineages
    from trainer_lib.release.model_card import render

    result = read_evaluation(cfg.evaluation)
    gate = result["gate"]
    if not gate.get("passed"):
        failed = [r["rule"] for r in gate.get("rules", []) if not r.get("passed")]
        raise UserError(
            f"evaluation: the gate failed ({', '.join(failed) or 'no rule passed'}); {cfg.model_path} is not released"
        )
    run_info = {"run_id": cfg.lineage.kfp_run_id, "run_name": cfg.lineage.kfp_run_name}
    lineage = lineages.collect(
        cfg.model_path, cfg.sources(), {**run_info, "pipeline_version": cfg.lineage.pipeline_version}
    )
    released_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    card = render(lineage, result, gate, cfg.model_name, released_at)

    marker = storage.join(cfg.release_uri, "release.json")
    if storage.exists(marker):
        storage.delete(marker)  # a re-release: invalidate the old marker before copying over it
    storage.copy(cfg.model_path, cfg.release_uri)
    storage.write_text(storage.join(cfg.release_uri, CARD_FILE), card)
    registry, failure = register_release(cfg, lineage, result, card)
    record = {
        "source": storage.redact(cfg.model_path),
        "candidate": result.get("candidate"),
        "baseline": result.get("baseline"),
        "gate": gate,
        "metrics": result.get("models", {}).get(result.get("candidate"), {}),
        "released_at": released_at,
        "model_card": CARD_FILE,
        "lineage": lineage,
        "registry": registry,
    }
    storage.write_text(marker, json.dumps(record, indent=2))
    if failure and cfg.registry.required:
        raise UserError(
            f"release: published to {storage.redact(cfg.release_uri)} (release.json written), but {failure}; "
            f"retry the release to register it, or set registry.required=false"
        )
    if failure:
        print(f"release: warning: {failure} (registry.required=false: the release stands)", file=sys.stderr)
    summary = {"stage": "release", "released": True, "release_uri": cfg.release_uri}
    if registry and "version" in registry:
        summary["registered_version"] = registry["version"]
    return {**summary, "commit": lineage["posttrain"].get("commit")}


def register_release(cfg: ReleaseConfig, lineage: dict, result: dict, card: str) -> tuple[dict | None, str]:
    """Register the published release when a tracking URI is configured: ``(record, "")``, or
    ``(record with the error, the error)`` when the registry could not be written; ``(None, "")``
    without a tracking URI."""
    from trainer_lib.release.model_registry import register, release_tags

    uri = cfg.tracking_uri()
    if not uri:
        return None, ""
    source = storage.redact(cfg.registry.source_uri or cfg.release_uri)
    identity = [source, result.get("created"), (result.get("paths") or {}).get(result.get("candidate"))]
    release_id = hashlib.sha256(json.dumps(identity, default=str).encode()).hexdigest()[:16]
    shown = {"uri": storage.redact(uri), "model_name": cfg.model_name}
    try:
        tags = release_tags(lineage, result["gate"], release_id)
        found = register(uri, cfg.model_name, source, card, tags)
    except Exception as exc:  # unreachable, refused, misconfigured: reported, the files stay published
        reason = storage.redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        failure = f"registering {cfg.model_name} in MLflow at {shown['uri']} failed ({type(exc).__name__}: {reason})"
        return {**shown, "error": failure}, failure
    print(f"release: registered {cfg.model_name} version {found['version']} at {shown['uri']}")
    return {**shown, **found}, ""
