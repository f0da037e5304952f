"""What made a released model: the lineage ``release.json`` and the model card record.

Every training stage leaves ``lineage.json`` next to its model (:mod:`trainer_lib.loop.stage_record`):
its effective config (secrets redacted), where the model and data it read came from, and the records of
the stages before it; so the last model of a chain carries the whole chain. The release adds
(:func:`collect`) the base model (hub id, revision and license when they can be known), the data sources
with their fingerprints (the same :func:`trainer_lib.storage.fingerprint` the pipeline's ``fingerprint``
step keys its cache with), posttrain's version and commit, the image, and the KFP run.

Where each fact comes from, and what cannot be known:

* commit: the image's build info (``/etc/posttrain/build.json``, written by images/Dockerfile from its
  build args), else the git working tree this package runs from (``git rev-parse HEAD``; ``dirty`` when
  tracked files differ from it); neither: null.
* image digest: it exists only once the image is pushed, so the image cannot hold it. A pod gets it
  from ``POSTTRAIN_IMAGE_DIGEST``, or from its image reference when that is pinned (``...@sha256:...``).
* KFP run: the run id and name the release task is given; a task cannot see its pipeline version id
  unless it is passed in (``lineage.pipeline_version``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

from trainer_lib import storage
from trainer_lib.loop.stage_record import LINEAGE_FILE, describe_input, read_lineage, redacted

#: Written at image build time (images/Dockerfile); POSTTRAIN_BUILD_INFO names another file.
BUILD_INFO = "/etc/posttrain/build.json"
#: The pipeline's given sources, in the order the ``fingerprint`` step combines them.
SOURCE_NAMES = ("base_model", "dataset", "preference_dataset", "prompt_dataset")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_CACHE = re.compile(r"(models|datasets)--([^/\\]+?)--([^/\\]+)[/\\]snapshots[/\\]([0-9a-f]{40})")


def combined_fingerprint(described: list[tuple[str, str]]) -> str:
    """One fingerprint of several ``(location, fingerprint)`` pairs, in order: the pipeline's
    ``fingerprint`` step's output, which keys ``bootstrap``'s cache (empty when none is given)."""
    parts = [f"{location}={print_}" for location, print_ in described]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest() if parts else ""


def stages_of(model_dir: str) -> list[dict]:
    """The chain of stage records behind a model: its ``lineage.json``, or (a model trained before
    stages wrote one) what its ``summary.json`` and ``ds_config.json`` say, without the config."""
    found = read_lineage(model_dir)
    if found is not None:
        return found.get("stages", [])
    record: dict = {"output": storage.redact(model_dir), "config": None, "note": f"no {LINEAGE_FILE} in the model"}
    for name, key in (("summary.json", "summary"), ("ds_config.json", "deepspeed")):
        path = storage.join(model_dir, name)
        if storage.exists(path):
            record[key] = redacted(json.loads(storage.read_text(path)))
    record["stage"] = (record.get("summary") or {}).get("stage")
    return [record]


# --------------------------------------------------------------------------- where posttrain came from


def package_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("posttrain")
    except metadata.PackageNotFoundError:
        return None


def working_tree() -> dict | None:
    """``{"commit", "dirty", "from"}`` of the git checkout this package runs from, or None (no git, no
    checkout). Read-only: no index refresh (GIT_OPTIONAL_LOCKS=0)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args) -> str:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, env=env, timeout=30)
        if done.returncode != 0:
            raise OSError(done.stderr.strip())
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty, "from": "git working tree"}


def build_info() -> dict:
    """posttrain's version, commit and build: from the image's build info, else the working tree."""
    info: dict = {"version": package_version(), "commit": None, "dirty": None}
    path = os.environ.get("POSTTRAIN_BUILD_INFO", BUILD_INFO)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            built = json.load(fh)
        commit = built.get("commit") or None
        dirty = {"true": True, "false": False}.get(str(built.get("dirty")).lower())
        info.update(commit=commit if commit != "unknown" else None, dirty=dirty, built_at=built.get("built_at"))
        info.update({"from": f"image build info ({path})", "image": built.get("image") or None})
        return info
    tree = working_tree()
    info.update(tree or {"from": "unknown: no image build info and no git checkout"})
    return info


def image_info(built: dict) -> dict:
    """The image this runs in: its reference and digest where they can be known (module docstring)."""
    reference = os.environ.get("POSTTRAIN_IMAGE") or built.get("image")
    digest = os.environ.get("POSTTRAIN_IMAGE_DIGEST") or None
    if not digest and reference and "@sha256:" in reference:
        digest = reference.split("@", 1)[1]
    out = {"reference": reference, "digest": digest}
    if not digest:
        out["note"] = (
            "the digest is known only after the image is pushed: set POSTTRAIN_IMAGE_DIGEST on the pod or "
            "pin images by digest"
            if built.get("from", "").startswith("image")
            else "not run from a posttrain image"
        )
    return out


# --------------------------------------------------------------------------- the base model


def hub_id_of(location: str) -> str | None:
    """The hub id a location names, without asking the hub: a Hugging Face cache snapshot path
    (``.../models--org--name/snapshots/<sha>``) or an ``org/name`` that is no local path; else None."""
    found = _HUB_CACHE.search(location.replace("\\", "/"))
    if found:
        return f"{found[2]}/{found[3]}"
    if storage.is_remote(location) or os.path.exists(os.path.expanduser(location)) or not _HUB_ID.match(location):
        return None
    return location


def hub_identity(location: str) -> tuple[str | None, str | None]:
    """``(hub id, revision)`` of a model location: a cache snapshot path gives both; a hub id its current
    revision when the hub can be asked (not offline); anything else ``(None, None)``."""
    found = _HUB_CACHE.search(location.replace("\\", "/"))
    if found:
        return f"{found[2]}/{found[3]}", found[4]
    hub_id = hub_id_of(location)
    return hub_id, hub_revision(hub_id) if hub_id else None


def hub_revision(repo_id: str) -> str | None:
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.constants import is_offline_mode

        if is_offline_mode():
            return None
        return HfApi().model_info(repo_id, timeout=10).sha
    except Exception:  # no hub, no network, no access: unknown
        return None


def card_license(location: str, hub_id: str | None) -> str | None:
    """The ``license`` of a model's own card: its README.md (local or URL), else, for a hub id, the hub's."""
    header = None
    readme = storage.join(location, "README.md")
    try:
        if storage.exists(readme):
            header = storage.read_text(readme)
        elif hub_id == location:  # given as a hub id (a cache snapshot without its card: not asked)
            from huggingface_hub import ModelCard
            from huggingface_hub.constants import is_offline_mode

            header = None if is_offline_mode() else ModelCard.load(hub_id).content
    except Exception:  # a card that cannot be read: no license known
        return None
    if not header or not header.startswith("---"):
        return None
    import yaml

    try:
        data = yaml.safe_load(header.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return None
    return str(data["license"]) if isinstance(data, dict) and data.get("license") else None


def describe_model(location: str, fingerprint: str | None = None) -> dict:
    """The base model: location, fingerprint (``fingerprint`` when a stage recorded it already), hub id
    and revision, license (None where unknown)."""
    hub_id, revision = hub_identity(location)
    found = {"location": storage.redact(location), "fingerprint": fingerprint or storage.fingerprint(location)}
    return {**found, "hub_id": hub_id, "revision": revision, "license": card_license(location, hub_id)}


# --------------------------------------------------------------------------- the release's record


def collect(model_path: str, sources: dict[str, str], run: dict) -> dict:
    """The lineage of the model at ``model_path``. ``sources`` names the run's given locations
    (``base_model``, ``dataset``...; empty: taken from the first stage's inputs); ``run`` the KFP run
    (``run_id``, ``run_name``, ``pipeline_version``; empty values are left out)."""
    rank = {name: at for at, name in enumerate(SOURCE_NAMES)}
    ordered = sorted((name for name in sources if sources[name]), key=lambda name: rank.get(name, len(rank)))
    sources = {name: sources[name] for name in ordered}  # (sorted is stable: other names keep their order)
    stages = stages_of(model_path)
    first = _first_input(stages, "model.path")  # (its model may not be on this machine: keep its fingerprint)
    base = sources.get("base_model") or (first or {}).get("location")
    base_print = None if "base_model" in sources else (first or {}).get("fingerprint")
    given = {name: describe_input(loc) for name, loc in sources.items() if name != "base_model"}
    data = given or {
        f"{record.get('stage')}:{key}": item
        for record in stages
        for key, items in (record.get("inputs") or {}).items()
        if key.startswith("data.")
        for item in items
    }
    built = build_info()
    lineage = {
        "posttrain": built,
        "image": image_info(built),
        "kfp": {k: v for k, v in run.items() if v} or None,
        "base_model": describe_model(base, base_print) if base else None,
        "data": data,
        "stages": stages,
    }
    if sources:
        located = [(loc, item["fingerprint"]) for loc, item in zip(sources.values(), _in_order(sources, lineage))]
    else:  # outside a pipeline the first stage's model and every stage's data stand for the sources
        inputs = [lineage["base_model"]] if base else []
        located = [(item["location"], item["fingerprint"]) for item in [*inputs, *data.values()]]
    if located:
        lineage["sources_fingerprint"] = combined_fingerprint(located)
    return lineage


def _in_order(sources: dict, lineage: dict) -> list[dict]:
    base = lineage["base_model"]
    return [base if name == "base_model" else lineage["data"][name] for name in sources]


def _first_input(stages: list[dict], key: str) -> dict | None:
    for record in stages:
        for item in (record.get("inputs") or {}).get(key, []):
            return item
    return None
