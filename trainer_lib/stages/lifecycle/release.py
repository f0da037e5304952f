"""``posttrain release``: publish a model that passed the evaluation gate.

Copies the model directory to ``release_uri`` (local or URL) and writes ``release.json``
(gate result, source, time) last, so a consumer that waits for ``release.json`` never sees a
half-copied model. A model whose gate failed is never published: the stage says so and exits
with an error, so a pipeline or script cannot mistake it for a release.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, UserError


@dataclass
class ReleaseConfig:
    model_path: str | None = opt(None, "The evaluated model directory (local or URL).")
    release_uri: str | None = opt(None, "Where to publish it (local dir or URL).")
    evaluation: str | None = opt(None, "The evaluate stage's metrics.json (its gate decides).")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key in ("model_path", "release_uri", "evaluation"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: required")


CONFIG = ReleaseConfig


def run(cfg: ReleaseConfig) -> dict:
    try:
        result = json.loads(storage.read_text(cfg.evaluation))
        gate = result["gate"]
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise UserError(f"evaluation: {cfg.evaluation} is not an evaluate metrics.json ({exc})") from None
    if not gate.get("passed"):
        failed = [r["rule"] for r in gate.get("rules", []) if not r.get("passed")]
        raise UserError(
            f"evaluation: the gate failed ({', '.join(failed) or 'no rule passed'}); {cfg.model_path} is not released"
        )
    marker = storage.join(cfg.release_uri, "release.json")
    if storage.exists(marker):
        storage.delete(marker)  # a re-release: invalidate the old marker before copying over it
    storage.copy(cfg.model_path, cfg.release_uri)
    record = {
        "source": cfg.model_path,
        "candidate": result.get("candidate"),
        "baseline": result.get("baseline"),
        "gate": gate,
        "metrics": result.get("models", {}).get(result.get("candidate"), {}),
        "released_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    storage.write_text(marker, json.dumps(record, indent=2))
    return {"stage": "release", "released": True, "release_uri": cfg.release_uri}
