"""Retrain only when something changed: compare a run's inputs with those of the latest release.

A pipeline run with ``skip_if_unchanged`` stops early, green, when all of these equal the latest release's
at ``release_uri``:

* the content fingerprint of its given sources (base model, datasets): the ``fingerprint`` step's output,
  :func:`trainer_lib.release.lineage.combined_fingerprint`, which the release records in ``release.json`` as
  ``lineage.sources_fingerprint`` (a changed data row, object or base revision changes it);
* the run's parameters that decide what is trained and judged (:func:`training_parameters`: every
  pipeline parameter but those that only say where the results go or who is told).

``release.json`` does not hold the pipeline's parameters, so every release of a pipeline run leaves
``inputs.json`` beside it (:func:`record`): the run id, its sources fingerprint and those parameters. A
release without it (published by hand, or before 2026-12-02) counts as changed: the run trains.
"""

from __future__ import annotations

import hashlib
import json

from trainer_lib import storage

INPUTS_FILE = "inputs.json"
#: Pipeline parameters that do not change the model or its judgement: where things go, who is told, which
#: accelerator type runs it, and this option itself.
NOT_COMPARED = frozenset(
    {
        "skip_if_unchanged",
        "notify_webhook",
        "release_uri",
        "model_name",
        "model_repository",
        "triton_url",
        "accelerator_type",
    }
)


def _canonical(value):
    """One spelling of a parameter value, whichever backend handed it over (kfp.local passes the values of
    a dict parameter as text: ``'1.0'`` for 1, ``'["a"]'`` for a list)."""
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("[", "{"):
            try:
                return _canonical(json.loads(text))
            except ValueError:
                return value
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        try:
            return float(text) if text else value
        except ValueError:
            return value
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    return value


def training_parameters(parameters: dict) -> dict:
    """The parameters that are compared, canonically spelled, sorted by name."""
    return {name: _canonical(parameters[name]) for name in sorted(parameters) if name not in NOT_COMPARED}


def parameters_fingerprint(parameters: dict) -> str:
    text = json.dumps(training_parameters(parameters), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def record(release_uri: str, run_id: str, sources_fingerprint: str, parameters: dict) -> str:
    """Write ``inputs.json`` beside the release this run published; returns its location."""
    from trainer_lib.loop.stage_record import redacted

    path = storage.join(release_uri, INPUTS_FILE)
    compared = training_parameters(parameters)
    body = {
        "run_id": run_id,
        "sources_fingerprint": sources_fingerprint,
        "parameters_fingerprint": parameters_fingerprint(parameters),
        "parameters": redacted(compared),
    }
    storage.write_text(path, json.dumps(body, indent=2, sort_keys=True))
    return path


def _read(path: str) -> dict | None:
    try:
        found = json.loads(storage.read_text(path))
    except (ValueError, OSError, RuntimeError):  # missing, unreadable, the store failing
        return None
    return found if isinstance(found, dict) else None


def changes(release_uri: str, sources_fingerprint: str, parameters: dict) -> list[str]:
    """What differs between this run's inputs and the latest release's at ``release_uri``: an empty list
    when nothing did (the run may stop), else one line per reason (the run trains)."""
    if not release_uri:
        return ["no release_uri: no earlier release to compare with"]
    released = _read(storage.join(release_uri, "release.json"))
    if released is None:
        return [f"no release at {storage.redact(release_uri)} yet"]
    inputs = _read(storage.join(release_uri, INPUTS_FILE))
    lineage = released.get("lineage") or {}
    run = (lineage.get("kfp") or {}).get("run_id")
    if inputs is None or (run and inputs.get("run_id") != run):
        return [f"the release at {storage.redact(release_uri)} has no {INPUTS_FILE} of the run that made it"]
    found = []
    if (lineage.get("sources_fingerprint") or "") != (sources_fingerprint or ""):
        found.append("the base model or data changed (sources fingerprint)")
    if inputs.get("parameters_fingerprint") != parameters_fingerprint(parameters):
        before, now = inputs.get("parameters") or {}, training_parameters(parameters)
        keys = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        found.append(f"parameters changed: {', '.join(keys) or 'config text'}")
    return found
