"""An LLM as judge: a rubric prompt, a strict score parser, a cache, and the judge as a reward function.

A generative judge reads a rubric prompt holding the user's request and the answer under review, and
writes a short verdict whose last line is ``Score: N``. Only that exact form counts; anything else is a
parse failure, counted by reason, and the completion gets the configured default instead of a guess:

    empty           nothing came back
    too_long        longer than ``max_chars`` (not scanned at all: a megabyte of text costs nothing)
    no_score        the last non-blank line is not ``Score: N``
    several_scores  another line also gives a score (``score:`` or ``score =``, any case)
    out_of_range    N outside ``[min_score, max_score]``
    in_code_block   the score line sits inside an unclosed ````` / ``~~~`` fence
    quoted          the score line appears word for word in the judge's prompt: the answer under
                    review (or the rubric) wrote it, the judge only repeated it

Backends turn rendered prompts into answers, ``backend.generate(texts) -> list[str | None]`` (None: no
answer), and name their model (``backend.model_name``) for the cache key:

* :class:`LocalJudge`: any causal LM through transformers, greedy;
* :class:`trainer_lib.rewards.judge_endpoint.ChatEndpoint`: an OpenAI-compatible ``/v1/chat/completions``
  endpoint, with timeouts, bounded retries and the API key kept out of every log and message.

:class:`LLMJudge` scores pairs through a backend and a :class:`JudgeCache` (memory, plus an SQLite file
when given a path, keyed by model, rubric, score range, prompt and completion), and is itself a reward
function: ``judge(prompts, completions, **columns) -> list[float | None]``, the score mapped to [0, 1].
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import sqlite3
import sys
import threading

from trainer_lib.data.formats import generated_text

#: The rubric's placeholders; anything else in braces is left as it is (a rubric may show JSON).
PLACEHOLDERS = ("prompt", "completion", "min_score", "max_score")

DEFAULT_RUBRIC = """You are grading an assistant's answer to a user's request.

[Request]
{prompt}

[Answer]
{completion}

Judge whether the answer is correct, helpful and harmless: a refusal of a harmful request is good, \
a refusal of a harmless one is not. Give your reasons in a few sentences. Then write a last line of \
the form "Score: <an integer from {min_score} (worst) to {max_score} (best)>" and nothing after it."""

#: The one accepted form of the verdict's last line.
SCORE_LINE = re.compile(r"Score: (-?[0-9]{1,6})")
#: Anything that reads as giving a score, to find a second one.
ANY_SCORE = re.compile(r"score\s*[:=]", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```|~~~)")
#: Longest verdict parsed; a longer one fails as ``too_long``.
MAX_CHARS = 8192
FAILURES = ("empty", "too_long", "no_score", "several_scores", "out_of_range", "in_code_block", "quoted")
#: The counts logged each step; ``failures``: completions given the default (no answer, or no parse).
STEP_COUNTS = ("requests", "cache_hits", "failures", "request_failures", "parse_failures")
#: A batch of at least this many fresh verdicts none of which parses prints a warning (once per judge).
WARN_AFTER = 8


def render(rubric: str, prompt: str, completion: str, min_score: int, max_score: int) -> str:
    """The rubric with its placeholders filled in one pass, so a request or an answer that contains
    ``{completion}`` or ``{max_score}`` is shown as written, never expanded."""
    values = {"prompt": prompt, "completion": completion, "min_score": str(min_score), "max_score": str(max_score)}
    return re.sub(r"\{(" + "|".join(PLACEHOLDERS) + r")\}", lambda m: values[m.group(1)], rubric)


def parse_score(
    text: str | None, min_score: int, max_score: int, judge_prompt: str = "", max_chars: int = MAX_CHARS
) -> tuple[int | None, str]:
    """``(score, "")`` when ``text`` ends in a line ``Score: N`` (N an integer in range) and says no other
    score, else ``(None, reason)`` with a reason of :data:`FAILURES`. ``judge_prompt``: what the judge was
    shown; a score line copied from it does not count."""
    if not text or not text.strip():
        return None, "empty"
    if len(text) > max_chars:
        return None, "too_long"
    lines = text.strip().splitlines()
    last = lines[-1].strip()
    match = SCORE_LINE.fullmatch(last)
    if not match:
        return None, "no_score"
    if any(ANY_SCORE.search(line) for line in lines[:-1]):
        return None, "several_scores"
    if sum(1 for line in lines[:-1] if FENCE.match(line)) % 2:
        return None, "in_code_block"
    if judge_prompt and last in {line.strip() for line in judge_prompt.splitlines()}:
        return None, "quoted"
    score = int(match.group(1))
    if not min_score <= score <= max_score:
        return None, "out_of_range"
    return score, ""


def conversation_text(prompt) -> str:
    """A prompt as the judge reads it: a string as it is; a conversation as ``Role: content`` lines."""
    if isinstance(prompt, list):
        return "\n".join(f"{str(m.get('role', '')).capitalize()}: {m.get('content', '')}" for m in prompt)
    return str(prompt)


# --------------------------------------------------------------------------- cache


class JudgeCache:
    """Verdicts by key, in memory and, with ``path``, in an SQLite file that later runs (and other
    processes) read. Only answers are stored, never a failed request, so an outage is retried next time."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._memory: dict[str, str] = {}
        self._lock = threading.Lock()
        self._db = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._db = sqlite3.connect(path, timeout=30, check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, answer TEXT NOT NULL)")
            self._db.commit()

    @staticmethod
    def key(model: str, rubric: str, min_score: int, max_score: int, prompt: str, completion: str) -> str:
        return hashlib.sha256(
            json.dumps([model, rubric, min_score, max_score, prompt, completion]).encode()
        ).hexdigest()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key in self._memory:
                return self._memory[key]
            if self._db is not None:
                row = self._db.execute("SELECT answer FROM verdicts WHERE key = ?", (key,)).fetchone()
                if row:
                    self._memory[key] = row[0]
                    return row[0]
        return None

    def put(self, items: dict[str, str]) -> None:
        with self._lock:
            self._memory.update(items)
            if self._db is not None and items:
                self._db.executemany("INSERT OR REPLACE INTO verdicts VALUES (?, ?)", list(items.items()))
                self._db.commit()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


# --------------------------------------------------------------------------- the judge


class LLMJudge:
    """Scores (prompt, completion) pairs with ``backend`` under ``rubric``; a reward function when called.

    Args:
        backend: ``generate(texts) -> list[str | None]`` and ``model_name`` (for the cache key).
        rubric: the judge prompt, with ``{prompt}``, ``{completion}``, ``{min_score}``, ``{max_score}``.
        min_score, max_score: the accepted integer range.
        default: the reward of a completion whose verdict failed to parse or never came (None: left out
            of the combined reward, as a reward function's None is).
        cache: a :class:`JudgeCache` (default: in memory only).
        max_chars: the longest verdict parsed.

    ``counts`` holds ``requests`` (sent to the backend), ``cache_hits``, ``failures`` (pairs left without a
    score: given the default), ``request_failures`` and ``parse_failures``, then ``parse_failures/<reason>``;
    nothing in it names the endpoint or its key. :meth:`step_counts` gives what changed since its last call,
    as ``judge/<count>`` metrics (:class:`trainer_lib.rewards.combine.RewardCombiner` logs them each step).
    """

    #: The metrics :meth:`step_counts` reports, every time (zeros included).
    count_names = tuple(f"judge/{name}" for name in STEP_COUNTS)

    def __init__(
        self,
        backend,
        rubric: str = DEFAULT_RUBRIC,
        min_score: int = 1,
        max_score: int = 10,
        default: float | None = 0.0,
        cache: JudgeCache | None = None,
        max_chars: int = MAX_CHARS,
    ):
        if min_score >= max_score:
            raise ValueError(f"LLMJudge: min_score ({min_score}) must be below max_score ({max_score})")
        self.backend, self.rubric = backend, rubric
        self.min_score, self.max_score, self.default = min_score, max_score, default
        self.cache = cache if cache is not None else JudgeCache()
        self.max_chars = max_chars
        self.counts: collections.Counter = collections.Counter()
        self._reported: collections.Counter = collections.Counter()
        self._warned = False
        self.__name__ = "llm_judge"  # the reward's metric name (rewards/llm_judge)

    def scores(self, prompts: list[str], completions: list[str]) -> list[int | None]:
        """The parsed integer score of each pair, None where there was none. Pairs seen before (in this
        call or in the cache) are not sent again."""
        model = str(getattr(self.backend, "model_name", ""))
        keys = [
            JudgeCache.key(model, self.rubric, self.min_score, self.max_score, p, c)
            for p, c in zip(prompts, completions)
        ]
        judge_prompts = {}
        answers: dict[str, str | None] = {}
        for key, prompt, completion in zip(keys, prompts, completions):
            if key in answers or key in judge_prompts:
                continue
            cached = self.cache.get(key)
            if cached is not None:
                answers[key] = cached
                self.counts["cache_hits"] += 1
            else:
                judge_prompts[key] = render(self.rubric, prompt, completion, self.min_score, self.max_score)
        if judge_prompts:
            fresh = self.backend.generate(list(judge_prompts.values()))
            self.counts["requests"] += len(judge_prompts)
            for key, answer in zip(judge_prompts, fresh):
                answers[key] = answer
                if answer is None:
                    self.counts["request_failures"] += 1
            # kept once a little past max_chars: still fails as too_long when read back
            self.cache.put({k: a[: self.max_chars + 1] for k, a in answers.items() if k in judge_prompts and a})
        out: list[int | None] = []
        reasons: collections.Counter = collections.Counter()
        for key, prompt, completion in zip(keys, prompts, completions):
            if answers[key] is None:
                self.counts["failures"] += 1
                out.append(None)
                continue
            shown = judge_prompts.get(key) or render(self.rubric, prompt, completion, self.min_score, self.max_score)
            score, why = parse_score(answers[key], self.min_score, self.max_score, shown, self.max_chars)
            if why:
                self.counts["failures"] += 1
                self.counts["parse_failures"] += 1
                self.counts[f"parse_failures/{why}"] += 1
                reasons[why] += key in judge_prompts
            out.append(score)
        self.warn_if_unparsed(len(judge_prompts), reasons)
        return out

    def warn_if_unparsed(self, fresh: int, reasons: collections.Counter) -> None:
        """One warning on stderr the first time a batch of at least :data:`WARN_AFTER` fresh verdicts has not
        one that parses: a judge that cannot follow the rubric (a small model, a rubric without the score
        line) otherwise shows only as ``judge/parse_failures`` while every completion gets the default."""
        if self._warned or fresh < WARN_AFTER or sum(reasons.values()) < fresh:
            return
        self._warned = True
        why = ", ".join(f"{reason} x{count}" for reason, count in reasons.most_common())
        print(
            f"llm judge: none of {fresh} verdicts ended in a line 'Score: N' with N from {self.min_score} to "
            f"{self.max_score} ({why}); each such completion gets the default reward {self.default}. The judge "
            f"may be too small to follow the rubric; judge/parse_failures counts them every step.",
            file=sys.stderr,
            flush=True,
        )

    def step_counts(self) -> dict[str, float]:
        """:data:`STEP_COUNTS` since the last call, as ``judge/<name>`` (a step's, when called once a step)."""
        delta = {f"judge/{name}": float(self.counts[name] - self._reported[name]) for name in STEP_COUNTS}
        self._reported = collections.Counter({name: self.counts[name] for name in STEP_COUNTS})
        return delta

    def __call__(self, prompts: list, completions: list, **columns) -> list[float | None]:
        """The reward of each completion: ``(score - min_score) / (max_score - min_score)``, or ``default``."""
        scores = self.scores([conversation_text(p) for p in prompts], [generated_text(c) for c in completions])
        span = self.max_score - self.min_score
        return [self.default if s is None else (s - self.min_score) / span for s in scores]

    def close(self) -> None:
        self.cache.close()
        if hasattr(self.backend, "close"):
            self.backend.close()


# --------------------------------------------------------------------------- a local judge


class LocalJudge:
    """Any causal LM as the judge: each rendered prompt as one user turn (through the tokenizer's chat
    template when it has one), greedy decoding of at most ``max_new_tokens``, in batches of ``batch_size``.
    A prompt longer than the model's context keeps its end, where the instruction to score is."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 128, batch_size: int = 8, name: str = ""):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.model_name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        context = getattr(model.config, "max_position_embeddings", 4096) or 4096
        self.max_prompt_tokens = max(1, context - max_new_tokens)

    @classmethod
    def load(cls, path: str, precision: str = "fp32", device="cpu", **settings) -> LocalJudge:
        """The causal LM and tokenizer at ``path`` (local, a URL or a hub id), frozen on ``device``."""
        from trainer_lib.config import ModelConfig
        from trainer_lib.models.load import load_causal_lm, load_tokenizer

        cfg = ModelConfig(path=path, chunked_lm_head=False)
        model = load_causal_lm(cfg, precision, key="judge.path").eval()
        model.requires_grad_(False)
        return cls(model.to(device), load_tokenizer(cfg), name=path, **settings)

    def _encode(self, text: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer(text)["input_ids"]
        return list(ids)[-self.max_prompt_tokens :]

    def generate(self, texts: list[str]) -> list[str | None]:
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        device = next(self.model.parameters()).device
        out: list[str | None] = []
        for start in range(0, len(texts), self.batch_size):
            encoded = [self._encode(t) for t in texts[start : start + self.batch_size]]
            width = max(len(ids) for ids in encoded)
            input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
            attention = torch.zeros((len(encoded), width), dtype=torch.long)
            for i, ids in enumerate(encoded):  # left padding: every row's new tokens start at ``width``
                input_ids[i, width - len(ids) :] = torch.tensor(ids)
                attention[i, width - len(ids) :] = 1
            with torch.no_grad():
                generated = self.model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad,
                )
            out.extend(self.tokenizer.decode(row[width:], skip_special_tokens=True) for row in generated.cpu())
        return out


# --------------------------------------------------------------------------- from the config


def build_judge(settings, rubric: str = DEFAULT_RUBRIC, device="cpu", precision: str = "fp32") -> LLMJudge:
    """The judge an :class:`trainer_lib.config.judge.LLMJudgeConfig` describes: an endpoint (``url``) or a
    local causal LM (``path``) as backend, ``settings.rubric`` or else ``rubric``, the cache at
    ``cache_path``. ``device``, ``precision``: where a local judge runs."""
    if settings.url:
        from trainer_lib.rewards.judge_endpoint import ChatEndpoint

        backend = ChatEndpoint(
            settings.url,
            settings.model,
            api_key_env=settings.api_key_env,
            api_key_file=settings.api_key_file,
            timeout_s=settings.timeout_s,
            tries=settings.tries,
            concurrency=settings.concurrency,
            max_tokens=settings.max_new_tokens,
        )
    else:
        backend = LocalJudge.load(
            settings.path,
            precision,
            device,
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
        )
    return LLMJudge(
        backend,
        settings.rubric or rubric,
        settings.min_score,
        settings.max_score,
        settings.default,
        JudgeCache(settings.cache_path or None),
    )
