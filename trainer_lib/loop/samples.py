"""``samples.jsonl``: the text behind the numbers, written by the RL and DPO stages at their logging steps.

A curve says the reward rose; the samples say what the model wrote to get it. At each logging step
(``logging_steps``, and the last step) rank 0 appends up to :data:`ROWS_PER_LOG` rows of that step,
one JSON object per line, beside ``metrics.jsonl``. Two kinds:

``rollout`` (GRPO, RLOO, PPO): a prompt, one sampled completion and what the update made of it::

    {"step": 10, "kind": "rollout", "group": 0, "prompt": "...", "completion": "...", "reward": 0.5,
     "rewards": {"accuracy": 1.0, "format": 0.0}, "advantage": 0.87, "length": 41, "finished": true}

``reward`` is the weighted sum before normalization, ``rewards`` each source's raw score, ``advantage``
the mean over the completion's tokens (one number for GRPO; PPO's per-token GAE averaged), ``group``
the prompt's index in the step (a GRPO group shares it).

``pair`` (DPO and its losses): a preference pair and the policy's implicit rewards for it::

    {"step": 10, "kind": "pair", "prompt": "...", "chosen": "...", "rejected": "...",
     "chosen_reward": 0.31, "rejected_reward": -0.12, "margin": 0.43}

Text is model output and user data: readers must treat it as untrusted (the dashboard shows it as
text). The file stops growing at :data:`MAX_BYTES` (a last ``{"step", "kind": "capped"}`` row says so);
a resumed run drops the rows of the steps it replays, as ``metrics.jsonl`` does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from trainer_lib.loop.tracking import truncate_after

SAMPLES_FILE = "samples.jsonl"
#: rows written at one logging step (GRPO: the first groups' completions, whole groups first)
ROWS_PER_LOG = 16
#: the file's size cap (a 100k-step run at 16 rows of ~1 kB per 10 steps stays far below it)
MAX_BYTES = 32 * 1024 * 1024
#: characters kept of each text field (a runaway completion does not fill the file)
MAX_TEXT = 4000


class SampleLog:
    """Appends a step's rows to ``<log_dir>/samples.jsonl``; ``enabled=False`` (ranks but 0) does nothing."""

    def __init__(self, log_dir: str, initial_step: int, enabled: bool = True):
        self.path = os.path.join(log_dir, SAMPLES_FILE)
        self.enabled = enabled
        if enabled:
            os.makedirs(log_dir, exist_ok=True)
            truncate_after(self.path, initial_step)
        self.capped = enabled and os.path.exists(self.path) and os.path.getsize(self.path) >= MAX_BYTES

    def write(self, step: int, rows: Callable[[], list[dict]]) -> None:
        """``rows()`` (called only when something will be written: building them may decode text) at ``step``."""
        if not self.enabled or self.capped:
            return
        lines = [json.dumps({"step": step, **clipped(row)}) + "\n" for row in rows()[:ROWS_PER_LOG]]
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.writelines(lines)
            if fh.tell() >= MAX_BYTES:
                fh.write(json.dumps({"step": step, "kind": "capped", "max_bytes": MAX_BYTES}) + "\n")
                self.capped = True


def clipped(row: dict) -> dict:
    """``row`` with long strings cut to :data:`MAX_TEXT` characters and numbers as plain floats."""
    out = {}
    for key, value in row.items():
        if isinstance(value, str) and len(value) > MAX_TEXT:
            value = value[:MAX_TEXT] + " [...]"
        elif hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float):
            value = float(f"{value:.6g}")
        out[key] = value
    return out
