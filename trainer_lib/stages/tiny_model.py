"""``posttrain tiny-model``: train a BPE tokenizer on a corpus and save a tiny random Llama.

The embedded demo starts from this model; tests build the same thing in-process.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import ConfigError, StorageConfig, opt
from trainer_lib.errors import UserError


@dataclass
class TinyModelConfig:
    corpus: str | None = opt(None, "Text corpus: a .txt file (one document per line) or a JSONL file "
                                   "(every string value is used); local or a URL (s3://, gs://, az://, hf://, ...).")
    output_dir: str | None = opt(None, "Where the Hugging Face model directory goes (local or URL).")
    vocab_size: int = opt(1024, "BPE vocabulary size.")
    num_layers: int = opt(2, "Transformer layers.")
    hidden_size: int = opt(128, "Hidden size.")
    num_heads: int = opt(4, "Attention heads.")
    num_kv_heads: int = opt(2, "Key/value heads (grouped-query attention).")
    max_positions: int = opt(1024, "Maximum sequence length.")
    seed: int = opt(0, "Initialisation seed.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key in ("corpus", "output_dir"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: required")
        for key in ("vocab_size", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "max_positions"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: expected a positive integer, got {getattr(self, key)}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError("num_heads: must divide hidden_size, and num_kv_heads must divide num_heads")


CONFIG = TinyModelConfig


def read_corpus(path: str) -> list[str]:
    local = storage.localize(path)
    if not os.path.isfile(local):
        raise UserError(f"corpus: {path} is not a file")
    with open(local, encoding="utf-8") as fh:
        if not local.endswith((".jsonl", ".json")):
            return [line.rstrip("\n") for line in fh if line.strip()]
        texts = []
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                texts.extend(_strings(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n}: invalid JSON ({exc.msg})") from None
        return texts


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def run(cfg: TinyModelConfig) -> dict:
    from trainer_lib.models.tiny import make_tiny_model

    texts = read_corpus(cfg.corpus)
    if not texts:
        raise UserError(f"corpus: {cfg.corpus} contains no text")
    remote = storage.is_remote(cfg.output_dir)
    parent = tempfile.mkdtemp() if remote else os.path.dirname(os.path.abspath(cfg.output_dir))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(dir=parent, prefix=".tiny-")  # renamed into place when complete
    make_tiny_model(work, texts, vocab_size=cfg.vocab_size, num_layers=cfg.num_layers,
                    hidden_size=cfg.hidden_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                    max_positions=cfg.max_positions, seed=cfg.seed)
    if remote:
        storage.upload_dir(work, cfg.output_dir)
    else:
        target = os.path.abspath(cfg.output_dir)
        if os.path.isdir(target) and not os.listdir(target):
            os.rmdir(target)
        os.replace(work, target)
    return {"stage": "tiny-model", "output_dir": cfg.output_dir, "corpus_texts": len(texts),
            "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "vocab_size": cfg.vocab_size}
