"""What the demo dataset holds: :class:`DemoSpec`, the settings of the demo generator
(:func:`~trainer_lib.demo.generator.generate_demo_data`).

The ``posttrain demo-data`` stage's config is this spec plus where the files go
(:class:`~trainer_lib.demo.demo_data.DemoDataConfig`), so its keys are these fields' names.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_lib.config import check_non_negative, opt
from trainer_lib.errors import ConfigError


@dataclass
class DemoSpec:
    """The sizes and shares of the demo dataset; the same spec writes byte-identical files."""

    seed: int = opt(0, "Generator seed; the same seed and settings write byte-identical files.")
    n_code_train: int = opt(3000, "Training code tasks: SFT demonstrations and code preference pairs.")
    n_code_eval: int = opt(150, "Held-out code tasks: combinations of a family and constants never trained on.")
    n_code_rl: int = opt(0, "RL code tasks of their own (code_tasks.jsonl), unseen in SFT and eval; 0: the SFT tasks.")
    n_code_pairs: int = opt(0, "Code preference pairs (preferences.jsonl, with the safety pairs); 0: one per SFT task.")
    teacher_mistakes: float = opt(0.0, "Share of six families' demonstrations with a mistake only the tests catch.")
    n_safety_train: int = opt(500, "Safety preference pairs (harmful and benign prompts), over every topic.")
    n_safety_eval: int = opt(100, "Held-out safety prompts: phrasings of a topic that no training row uses.")
    n_safety_sft: int = opt(100, "Safety rows in the SFT data, over sft_topics of the topics.")
    sft_refusals: float = opt(0.0, "Share of SFT safety rows that refuse a harmful prompt; 0: SFT is helpful-only.")
    sft_topics: float = opt(1 / 3, "Share of the topics (harmful and benign) SFT's safety rows use.")
    n_safety_rl: int = opt(0, "Labelled safety prompts from the pairs added to rl_prompts.jsonl (refusal reward).")

    def validate(self) -> None:
        """A ConfigError naming the first setting out of its range."""
        for key in ("n_code_train", "n_code_eval", "n_safety_train", "n_safety_eval", "n_safety_sft"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: expected a positive integer, got {getattr(self, key)}")
        check_non_negative(self, "n_code_rl", "n_code_pairs", "n_safety_rl")
        for key in ("sft_refusals", "sft_topics", "teacher_mistakes"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"{key}: expected a share between 0 and 1, got {getattr(self, key)}")
