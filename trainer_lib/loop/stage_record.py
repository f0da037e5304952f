"""What a training stage leaves beside its model for a release's lineage: ``lineage.json``.

Every training stage writes it with its model (:func:`stage_record`, from the cadence's ``save_model``):
its effective config (secrets redacted), where the model and data it read came from with their content
fingerprints, and the records of the stages before it, read from its input models' own ``lineage.json``;
so the last model of a chain carries the whole chain. The release reads the chain back and adds what only
it knows (:mod:`trainer_lib.release.lineage`).
"""

from __future__ import annotations

import json
import re
import time

from trainer_lib import storage

LINEAGE_FILE = "lineage.json"


#: Config keys naming a model or data a training stage reads (flat, dotted).
INPUT_KEYS = (
    "model.path",
    "data.path",
    "data.eval_path",
    "data.feedback_path",
    "reward.model_path",
    "reward.classifier_path",
    "reward.clip_path",
    "critic.path",
)


#: Keys of the inputs whose own ``lineage.json`` continues the chain (models, not data).
MODEL_KEYS = ("model.path", "reward.model_path", "critic.path")


_SECRET_KEY = re.compile(r"(?i)^((hf|hub|api|auth|access|bearer|session)_)?(token|secret|password|api_key|secret_key)$")


def redacted(value, key: str = ""):
    """``value`` with every string passed through :func:`trainer_lib.storage.redact` (credentials of this
    process, token-shaped text, URL passwords) and the value of any secret-named key blanked."""
    if isinstance(value, dict):
        return {k: redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v, key) for v in value]
    if isinstance(value, str) and value and _SECRET_KEY.match(key.rsplit(".", 1)[-1]):
        return "***"
    return storage.redact(value) if isinstance(value, str) else value


def describe_input(location: str) -> dict:
    """``{"location", "fingerprint"}`` of one model or data location (its content fingerprint)."""
    return {"location": storage.redact(location), "fingerprint": storage.fingerprint(location)}


def read_lineage(model_dir: str) -> dict | None:
    """The ``lineage.json`` a training stage left in ``model_dir`` (local or URL), or None."""
    path = storage.join(model_dir, LINEAGE_FILE)
    try:
        return json.loads(storage.read_text(path))
    except (FileNotFoundError, ValueError, OSError):
        return None


def stage_record(cfg, stage: str, deepspeed: dict | None = None) -> dict:
    """What training stage ``stage`` writes to its output as ``lineage.json`` (rank 0, with the model):
    ``{"stages": [...]}``, the records of the stages that made its input models, then its own: its name,
    output, effective config (flat keys, secrets redacted), the DeepSpeed config its engine got, and
    each input's location and fingerprint."""
    from trainer_lib.config import flat_dict

    config = redacted(flat_dict(cfg))
    inputs = {}
    for key in INPUT_KEYS:
        given = getattr_path(cfg, key, None)
        for location in given if isinstance(given, list) else [given] if given else []:
            inputs.setdefault(key, []).append(describe_input(str(location)))
    chain: list[dict] = []
    for key in MODEL_KEYS:
        location = getattr_path(cfg, key, None)
        upstream = read_lineage(location) if isinstance(location, str) and storage.exists(location) else None
        for record in (upstream or {}).get("stages", []):
            if not any(_same(record, seen) for seen in chain):
                chain.append(record)
    own = {
        "stage": stage,
        "output": config.get("output_dir"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "inputs": inputs,
        "config": config,
    }
    if deepspeed is not None:
        own["deepspeed"] = redacted(deepspeed)
    return {"stages": [*chain, own]}


def getattr_path(cfg, dotted: str, default):
    """``cfg.a.b`` for ``"a.b"`` (the unredacted value: locations are fingerprinted as given)."""
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return default
    return value


def _same(a: dict, b: dict) -> bool:
    return (a.get("stage"), a.get("output"), a.get("created")) == (b.get("stage"), b.get("output"), b.get("created"))
