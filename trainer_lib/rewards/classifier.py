"""A Hugging Face sequence classifier as a scorer: one label's probability (or logit) per text.

Any ``AutoModelForSequenceClassification`` works (a sentiment, toxicity or safety model with
several labels, or a one-output model). ``label`` picks the output by name (``id2label``, case
not minding) or by index; a one-output model needs none. The score is

    probability   softmax over the labels, P(label | text)          (single-label models)
                  sigmoid(logit_label)                              (multi_label_classification,
                                                                     or one output)
    logit         the raw logit of the label

It scores the completion text, or the pair (prompt text, completion) with ``with_prompt``, as the
classifier's tokenizer encodes a sentence pair. The evaluation stage's classifier judge and the RL
stages' ``reward.classifier_path`` source both use it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from trainer_lib.data.formats import generated_text
from trainer_lib.errors import UserError

SCORES = ("probability", "logit")


def prompt_text(prompt) -> str:
    """The text of a prompt: a string, or the last user message of a conversation."""
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        return users[-1] if users else (prompt[-1].get("content", "") if prompt else "")
    return str(prompt)


class ClassifierScorer:
    """``scorer(prompts, completions, **columns) -> list[float]``: the chosen label's score per completion."""

    def __init__(
        self,
        path: str,
        label: str = "",
        score: str = "probability",
        with_prompt: bool = False,
        batch_size: int = 16,
        max_length: int = 512,
        device="cpu",
        trust_remote_code: bool = False,
        keys: tuple[str, str] = ("reward.classifier_path", "reward.classifier_label"),
        default_label: Callable[[dict[int, str]], int | None] | None = None,
    ):
        """``keys`` name the settings of the path and the label in errors; ``default_label(labels)``
        picks a label when none is given (None: the label is required)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from trainer_lib.models.load import resolve_model_path

        if score not in SCORES:
            raise ValueError(f"score: expected one of {list(SCORES)}, got {score!r}")
        path_key, self.label_key = keys
        local = resolve_model_path(path, path_key)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(local, trust_remote_code=trust_remote_code)
            self.model = AutoModelForSequenceClassification.from_pretrained(local, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise UserError(f"{path_key}: could not load a sequence classifier from {path}: {exc}") from None
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.requires_grad_(False)
        self.model.to(device).eval()
        self.path, self.score, self.with_prompt = path, score, with_prompt
        self.batch_size, self.max_length, self.device = batch_size, max_length, device
        self.labels = {int(i): str(n) for i, n in self.model.config.id2label.items()}
        self.index = self._label_index(label, default_label)
        self.label = self.labels.get(self.index, "score")
        multi = getattr(self.model.config, "problem_type", None) == "multi_label_classification"
        self.sigmoid = multi or self.model.config.num_labels == 1
        self.input_names = set(inspect.signature(self.model.forward).parameters)  # BERT takes token_type_ids

    def _label_index(self, wanted: str, default_label) -> int:
        if self.model.config.num_labels == 1:
            return 0
        if wanted:
            if wanted.isdigit() and int(wanted) in self.labels:
                return int(wanted)
            for i, name in self.labels.items():
                if name.lower() == wanted.lower():
                    return i
            raise UserError(
                f"{self.label_key}: {wanted!r} is not a label of {self.path} "
                f"(labels: {', '.join(f'{i}={n}' for i, n in sorted(self.labels.items()))})"
            )
        guessed = default_label(self.labels) if default_label else None
        if guessed is None:
            raise UserError(
                f"{self.label_key}: required for {self.path}, which has {len(self.labels)} labels "
                f"({', '.join(f'{i}={n}' for i, n in sorted(self.labels.items()))}): name one or give "
                f"its index"
            )
        return guessed

    def describe(self) -> str:
        what = "P" if self.score == "probability" else "logit"
        return f"{what}({self.label}) of {self.path}" + (" on (prompt, response)" if self.with_prompt else "")

    def scores(self, prompts: list, texts: list[str]) -> list[float]:
        """The label's score for each text (with its prompt when ``with_prompt``)."""
        import torch

        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            pairs = (
                ([prompt_text(p) for p in prompts[start : start + self.batch_size]], chunk)
                if self.with_prompt
                else (chunk,)
            )
            batch = self.tokenizer(
                *pairs, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            inputs = {k: v.to(self.device) for k, v in batch.items() if k in self.input_names}
            with torch.no_grad():
                logits = self.model(**inputs).logits.float()
            if self.score == "probability":
                logits = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, dim=-1)
            out.extend(logits[:, self.index].tolist())
        return out

    def __call__(self, prompts: list, completions: list, **columns) -> list[float]:
        return self.scores(prompts, [generated_text(c) for c in completions])
