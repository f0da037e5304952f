"""``posttrain demo-data``: write the bundled, deterministic demo datasets (no downloads)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError


@dataclass
class DemoDataConfig:
    output_dir: str | None = opt(None, "Where the JSONL files go (local or URL).")
    seed: int = opt(0, "Generator seed; the same seed writes byte-identical files.")
    n_code_train: int = opt(3000, "Training code tasks.")
    n_code_eval: int = opt(150, "Held-out code tasks.")
    n_safety_train: int = opt(500, "Safety preference pairs (harmful and benign prompts), over every topic.")
    n_safety_sft: int = opt(100, "Safety rows in the SFT data, over sft_topics of the topics.")
    sft_refusals: float = opt(
        0.0,
        "Share of the SFT safety rows that are harmful prompts refused (default: "
        "none, SFT is helpful-only and DPO teaches the refusals).",
    )
    sft_topics: float = opt(1 / 3, "Share of the topics (harmful and benign) SFT's safety rows use.")
    n_safety_eval: int = opt(100, "Held-out safety prompts.")
    n_code_rl: int = opt(
        0,
        "Code tasks of their own for RL (code_tasks.jsonl), new to SFT and disjoint from the "
        "held-out ones; 0: the RL prompts are the SFT tasks.",
    )
    n_code_pairs: int = opt(
        0, "Code preference pairs in preferences.jsonl next to the safety pairs (0: one per SFT task)."
    )
    n_safety_rl: int = opt(
        0,
        "Labelled safety prompts (from the preference pairs) added to the RL prompts "
        "(rl_prompts.jsonl), for the refusal reward.",
    )
    teacher_mistakes: float = opt(
        0.0,
        "Share of the demonstrations (SFT rows, chosen code answers) of the "
        "families in trainer_lib.demo.generator.TEACHER_MISTAKES that carry the "
        "teacher's consistent mistake, which only the unit tests catch.",
    )
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        if not self.output_dir:
            raise ConfigError("output_dir: required")
        for key in ("n_code_train", "n_code_eval", "n_safety_train", "n_safety_eval", "n_safety_sft"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: expected a positive integer, got {getattr(self, key)}")
        for key in ("n_code_rl", "n_code_pairs", "n_safety_rl"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: expected >= 0, got {getattr(self, key)}")
        for key in ("sft_refusals", "sft_topics", "teacher_mistakes"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"{key}: expected a share between 0 and 1, got {getattr(self, key)}")


CONFIG = DemoDataConfig


def run(cfg: DemoDataConfig) -> dict:
    from trainer_lib.demo.generator import generate_demo_data

    kwargs = dict(
        seed=cfg.seed,
        n_code_train=cfg.n_code_train,
        n_code_eval=cfg.n_code_eval,
        n_safety_train=cfg.n_safety_train,
        n_safety_eval=cfg.n_safety_eval,
        n_code_rl=cfg.n_code_rl,
        n_code_pairs=cfg.n_code_pairs,
        n_safety_sft=cfg.n_safety_sft,
        sft_refusals=cfg.sft_refusals,
        sft_topics=cfg.sft_topics,
        n_safety_rl=cfg.n_safety_rl,
        teacher_mistakes=cfg.teacher_mistakes,
    )
    if storage.is_remote(cfg.output_dir):
        with tempfile.TemporaryDirectory() as tmp:
            manifest = generate_demo_data(tmp, **kwargs)
            storage.upload_dir(tmp, cfg.output_dir)
    else:
        os.makedirs(cfg.output_dir, exist_ok=True)
        manifest = generate_demo_data(cfg.output_dir, **kwargs)
    return manifest
