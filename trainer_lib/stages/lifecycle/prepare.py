"""``posttrain prepare``: validate, normalize, filter and split a dataset.

    posttrain prepare data.path=raw.jsonl output_dir=prepared/ [model.path=MODEL data.max_length=N]

Writes a ``datasets.DatasetDict`` (splits ``train`` and ``eval``) with ``save_to_disk`` at
``output_dir`` plus ``output_dir/stats.json``. Nothing is half-written: the result is built
in a temp dir next to the target and renamed into place at the end (for a URL as output it
is built locally, uploaded, and ``stats.json`` is uploaded last, marking it complete).

With a tokenizer (``model.path``), rows over ``data.max_length`` tokens are kept and counted
(``stats.json``'s ``truncated``; the training stage truncates them) or, with
``data.over_length=drop``, dropped here (``dropped.too_long``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

from trainer_lib.config import DataConfig, ModelConfig, StorageConfig, opt
from trainer_lib.data import chat_templates
from trainer_lib.errors import ConfigError, UserError


@dataclass
class PrepareConfig:
    data: DataConfig = opt(DataConfig, "Dataset to prepare (data.path) and how to split it.")
    model: ModelConfig = opt(ModelConfig, "Optional: its tokenizer measures rows against data.max_length.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")
    output_dir: str | None = opt(None, "Where the prepared DatasetDict and stats.json go (local or URL).")
    seed: int = opt(0, "Seed of the train/eval split.")
    drop_duplicates: bool = opt(True, "Drop exact duplicate rows (same format fields).")
    drop_empty: bool = opt(True, "Drop rows with an empty or whitespace-only text field.")
    max_rows: int = opt(0, "Read at most this many rows from each source (0: all); data.max_rows says the same.")

    def validate(self) -> None:
        if not self.data.given():
            raise ConfigError(
                "data.path: required, expected a dataset path (or data.dataset: names in dataset_info.json)"
            )
        if self.output_dir in (None, ""):
            raise ConfigError("output_dir: required, expected a local path or URL (s3://, gs://...)")
        self.data.validate()
        chat_templates.check(self.model.chat_template)
        if self.data.max_length <= 0:
            raise ConfigError(f"data.max_length: expected a positive number, got {self.data.max_length}")
        if self.max_rows < 0:
            raise ConfigError(f"max_rows: expected >= 0, got {self.max_rows}")
        if self.max_rows and self.data.max_rows and self.max_rows != self.data.max_rows:
            raise ConfigError(f"max_rows: {self.max_rows}, but data.max_rows is {self.data.max_rows}; set one of them")


CONFIG = PrepareConfig


def _check_target(path: str) -> None:
    """Refuse to replace a non-empty directory that is not a previous prepare output."""
    from trainer_lib.data.sources import STATS_FILE

    if os.path.isfile(path):
        raise UserError(f"output_dir: {path} is a file")
    if os.path.isdir(path) and os.listdir(path) and not os.path.isfile(os.path.join(path, STATS_FILE)):
        raise UserError(f"output_dir: {path} exists and is not a prepared dataset; refusing to overwrite it")


def _write(dd, stats: dict, directory: str) -> None:
    from trainer_lib.data.dataset import save_dataset_dict
    from trainer_lib.data.sources import STATS_FILE

    save_dataset_dict(dd, directory)
    with open(os.path.join(directory, STATS_FILE), "w", encoding="utf-8") as fh:
        json.dump(stats, fh, indent=2, sort_keys=False)
        fh.write("\n")


def _write_local(dd, stats: dict, output_dir: str) -> None:
    target = os.path.abspath(os.path.expanduser(output_dir))
    _check_target(target)
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
    old = None
    try:
        _write(dd, stats, tmp)
        if os.path.exists(target):
            old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
            os.rename(target, os.path.join(old, name))
        os.rename(tmp, target)
    except BaseException:
        if old is not None and not os.path.exists(target):
            os.rename(os.path.join(old, name), target)  # put the previous output back
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _write_remote(dd, stats: dict, output_dir: str) -> None:
    from trainer_lib import storage
    from trainer_lib.data.dataset import save_dataset_dict
    from trainer_lib.data.sources import STATS_FILE

    tmp = tempfile.mkdtemp(prefix=".prepare-")
    try:
        save_dataset_dict(dd, tmp)
        # stats.json marks a complete prepared dir: remove a previous one first, write it last
        storage.delete(storage.join(output_dir, STATS_FILE))
        storage.upload_dir(tmp, output_dir)
        storage.write_text(storage.join(output_dir, STATS_FILE), json.dumps(stats, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(cfg: PrepareConfig) -> dict:
    from trainer_lib import storage
    from trainer_lib.data.dataset import build_dataset
    from trainer_lib.models.load import load_tokenizer

    if not storage.is_remote(cfg.output_dir):
        _check_target(os.path.abspath(os.path.expanduser(cfg.output_dir)))  # fail before the work
    storage.require_bucket(cfg.output_dir)
    tokenizer = load_tokenizer(cfg.model) if (cfg.model.path or cfg.model.tokenizer_path) else None
    dd, stats = build_dataset(
        cfg.data,
        cfg.seed,
        tokenizer=tokenizer,
        drop_empty=cfg.drop_empty,
        drop_duplicates=cfg.drop_duplicates,
        max_rows=cfg.max_rows,
    )
    if tokenizer is not None:
        stats["tokenizer"] = cfg.model.tokenizer_path or cfg.model.path
    if storage.is_remote(cfg.output_dir):
        _write_remote(dd, stats, cfg.output_dir)
    else:
        _write_local(dd, stats, cfg.output_dir)
    return stats
