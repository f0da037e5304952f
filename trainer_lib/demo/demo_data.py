"""``posttrain demo-data``: write the bundled, deterministic demo datasets (no downloads)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.demo.demo_spec import DemoSpec
from trainer_lib.demo.generator import generate_demo_data
from trainer_lib.errors import ConfigError


@dataclass
class DemoDataConfig(DemoSpec):
    """The generator's settings (:class:`DemoSpec`) and where the files go.

    A subclass rather than a ``spec`` field: the config system turns a nested dataclass into a dotted
    section, which would rename every key (``spec.n_code_train``)."""

    output_dir: str | None = opt(None, "Where the JSONL files go (local or URL).")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        if not self.output_dir:
            raise ConfigError("output_dir: required")
        super().validate()


CONFIG = DemoDataConfig


def run(cfg: DemoDataConfig) -> dict:
    """Write the datasets to ``cfg.output_dir`` (by way of a local folder when it is a URL); the manifest."""
    if not storage.is_remote(cfg.output_dir):
        return generate_demo_data(cfg.output_dir, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = generate_demo_data(tmp, cfg)
        storage.upload_dir(tmp, cfg.output_dir)
    return manifest
