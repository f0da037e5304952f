"""The LLM judge's keys, one section shared by the RL stages (``reward.judge.*``) and ``evaluate``
(``judge.llm.*``); :func:`trainer_lib.rewards.llm_judge.build_judge` turns it into a judge.

The judge is either an OpenAI-compatible endpoint (``url`` and ``model``; its key read from a Secret
file or an environment variable, never written in the config) or a local causal LM (``path``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_lib.config.sections import opt
from trainer_lib.errors import ConfigError


@dataclass
class LLMJudgeConfig:
    url: str = opt("", "OpenAI-compatible API base of the judge (https://host/v1); empty: off (or set path).")
    model: str = opt("", "url: the model the endpoint serves (the requests' model field); also the cache key.")
    api_key_env: str = opt(
        "POSTTRAIN_JUDGE_API_KEY", "url: environment variable holding the endpoint's key (unset: no key sent)."
    )
    api_key_file: str = opt("", "url: file holding the key (a mounted Kubernetes Secret); wins over api_key_env.")
    path: str | None = opt(None, "A local causal LM as the judge (HF id, dir or URL) instead of url; greedy.")
    rubric: str = opt(
        "",
        "The judge prompt, with {prompt}, {completion}, {min_score} and {max_score}; its last line must ask for "
        "'Score: N'. Empty: the built-in rubric (docs/training.md).",
    )
    min_score: int = opt(1, "Lowest score the rubric asks for; a verdict outside the range fails to parse.")
    max_score: int = opt(10, "Highest score; the reward is (score - min_score) / (max_score - min_score).")
    default: float | None = opt(
        0.0, "Reward of a completion whose verdict failed to parse or never came; empty: left out of the sum."
    )
    cache_path: str = opt("", "SQLite file caching verdicts across steps and runs (local path); empty: memory only.")
    timeout_s: float = opt(30.0, "url: seconds one request may take.")
    tries: int = opt(3, "url: tries per request (timeouts, 408, 429 and 5xx are retried, backing off).")
    concurrency: int = opt(4, "url: requests in flight at once.")
    max_new_tokens: int = opt(256, "Most tokens of a verdict (the endpoint's max_tokens; a local judge's limit).")
    batch_size: int = opt(8, "path: prompts per generate call of the local judge.")

    @property
    def enabled(self) -> bool:
        return bool(self.url or self.path)

    def check(self, prefix: str, required: bool = False) -> None:
        """Raise a ConfigError naming ``prefix.<key>`` for a judge that cannot work."""
        if self.url and self.path:
            raise ConfigError(f"{prefix}.url, {prefix}.path: set one (an endpoint or a local model), not both")
        if required and not self.enabled:
            raise ConfigError(f"{prefix}.url or {prefix}.path: required (an OpenAI-compatible API or a causal LM)")
        if self.url and not self.model:
            raise ConfigError(f"{prefix}.model: required with {prefix}.url (the model the endpoint serves)")
        if self.min_score >= self.max_score:
            raise ConfigError(
                f"{prefix}.min_score, {prefix}.max_score: expected min < max, got {self.min_score} and {self.max_score}"
            )
        if self.default is not None and not 0.0 <= self.default <= 1.0:
            raise ConfigError(f"{prefix}.default: expected a reward in [0, 1] or empty, got {self.default}")
        if self.timeout_s <= 0 or self.tries < 1 or self.concurrency < 1:
            raise ConfigError(
                f"{prefix}.timeout_s, {prefix}.tries, {prefix}.concurrency: expected > 0, >= 1 and >= 1, got "
                f"{self.timeout_s}, {self.tries}, {self.concurrency}"
            )
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError(f"{prefix}.max_new_tokens, {prefix}.batch_size: expected positive integers")
        if self.rubric and "{completion}" not in self.rubric:
            raise ConfigError(f"{prefix}.rubric: has no {{completion}} for the answer under review to go in")
        if self.cache_path and "://" in self.cache_path:
            raise ConfigError(f"{prefix}.cache_path: expected a local file (SQLite), got a URL")
