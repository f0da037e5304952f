"""Multi-turn rollouts: the policy and an environment take turns, and each episode is one token sequence.

:func:`generate_episodes` plays ``n`` episodes per dataset row (one environment object each, from
``make_env()``) through :class:`trainer_lib.agents.EpisodeBatch`, generating every waiting episode's next
turn in one batched model call, and returns a :class:`~trainer_lib.rl.rollout.Rollout` whose rows are whole
trajectories::

    prompt_ids    the chat template over the environment's first messages, with its tools and the
                  generation prompt
    response_ids  turn 1 as sampled | environment messages | turn 2 as sampled | ... | last turn
    action_mask   1 on the tokens the model sampled, 0 on the environment's (loss_mask: the loss and the
                  KL see only the model's tokens)

The model's tokens are kept exactly as sampled: re-tokenizing the conversation would give other ids for the
same text (a tokenizer does not always produce what a model sampled), and the update would then train
tokens no policy drew. The environment's messages of a step are rendered alone and appended: the text the
chat template adds after an assistant turn that ended at its end-of-turn token, up to the next generation
prompt (:class:`EnvironmentSuffix`; for ChatML ``\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n``).
A turn cut at ``max_new_tokens`` gets the end-of-turn token appended as an environment token, so the
template's layout holds. The text the environment sees is the turn decoded without its end-of-turn token.

Generation is a small explicit decode loop over one KV cache (a transformers ``DynamicCache``) kept for the
live episodes across turns, not ``model.generate``: ``generate`` wants the whole sequence as ``input_ids``
every call and derives its positions and what to forward from the cache length, which does not fit rows
whose past lengths differ and grow by environment tokens between calls; it has no per-row token budget
either. Here every token goes through the model once: a turn forwards only its new tokens (the last sampled
token of the previous turn, which nothing has read yet, and the environment's suffix), left-padded within
the block; the attention mask covers the whole cache, with 0 on holes (that padding, and the decode steps
of a row that had already finished its turn), and positions are the mask's cumulative sum, as ``generate``
numbers left-padded rows. Finished episodes' rows leave the cache (``batch_select_indices``). The ``n``
episodes of a row share the prefill of their prompt when their prompts are equal
(:func:`~trainer_lib.rl.rollout.shared_prompt_cache`). Sampling is ``generate``'s: transformers'
temperature, top-k and top-p warpers, then one ``torch.multinomial`` over the batch per step, from the global
generator seeded with ``seed`` inside ``fork_rng`` (the caller's RNG is left as it was), so a resumed run
plays the same episodes when its tools are deterministic.

An episode ends when the environment says so (``done``), after ``max_turns`` assistant turns, or when the
trajectory (prompt and response, every token counted) reaches ``max_total_tokens``: a turn is cut where the
budget runs out and is then not sent to the environment (it may hold half a tool call), and an episode whose
environment suffix would leave no room for a reply ends before it. Not supported yet: stop strings, logits
processors (NLPO), images, and ZeRO-3 on several ranks (every rank would have to step its forwards together).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence

import torch

from trainer_lib.agents import DONE_REASONS, EpisodeBatch, EpisodeResult
from trainer_lib.config.rl import EPISODE_REWARDS  # how an episode's step rewards become its reward (env.reward)
from trainer_lib.data.tokenize import chat_text
from trainer_lib.errors import UserError
from trainer_lib.rl.rollout import Rollout, eos_token_ids, pad_rows, shared_prompt_cache

#: The conversation the environment's messages are rendered after: a user turn and an assistant reply.
BASE_CONVERSATION = ({"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."})


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One episode of a multi-turn rollout: ``episode`` (the transcript, one reward and return per turn, why it
    ended, its tool-call counts) and ``turns``, the ``[start, end)`` of each model turn in the row's response
    ids; everything between two turns is the environment's."""

    episode: EpisodeResult
    turns: list[tuple[int, int]]

    @property
    def final_answer(self) -> str:
        """The last assistant message's text: what the reward functions score."""
        replies = [m for m in self.episode.messages if m.get("role") == "assistant"]
        return (replies[-1].get("content") or "") if replies else ""

    def reward(self, how: str) -> float:
        """The episode's one reward: the last step's reward (``final``), the discounted return
        G_0 = sum_t gamma^t r_t (``sum``, with the gamma its returns were made with), or the plain sum of the step
        rewards (``turns``, whose rewards PPO places per turn); 0.0 without a turn."""
        if how not in EPISODE_REWARDS:
            raise ValueError(f"expected one of {EPISODE_REWARDS}, got {how!r}")
        if not self.episode.rewards:
            return 0.0
        if how == "turns":
            return float(sum(self.episode.rewards))
        return self.episode.rewards[-1] if how == "final" else self.episode.episode_return


class EnvironmentSuffix:
    """The tokens of an environment's messages, rendered alone, to append after an assistant turn.

    The chat template renders :data:`BASE_CONVERSATION` with and without the messages (and with the
    generation prompt); the text after the base's assistant turn, cut right after its end-of-turn token, is
    the suffix. What a template adds around every conversation (a default system prompt, as SmolLM2's adds,
    the tools' block) is in both renderings and cancels out. ``end_tokens`` are the texts of the tokens that
    may end a turn (the tokenizer's eos and the generation config's)."""

    def __init__(self, tokenizer, end_tokens: dict[str, int]):
        self.tokenizer = tokenizer
        self.end_tokens = {text: token for text, token in end_tokens.items() if text}
        self.bases: dict[str, tuple[str, int]] = {}

    def base(self, tools: list[dict]) -> tuple[str, int]:
        """(the base's text up to its assistant turn's end-of-turn token, that token's id), per tool set."""
        key = json.dumps(tools, sort_keys=True, default=str)
        if key not in self.bases:
            text = chat_text(self.tokenizer, list(BASE_CONVERSATION), tools=tools or None)
            ends = [(text.rfind(end) + len(end), end) for end in self.end_tokens if end in text]
            if not ends:
                raise UserError(
                    "model.chat_template: an assistant turn does not end with the end-of-turn token "
                    f"({', '.join(self.end_tokens)}), so the environment's messages cannot be appended to "
                    "what the model sampled"
                )
            cut, end = max(ends)
            self.bases[key] = (text[:cut], self.end_tokens[end])
        return self.bases[key]

    def text(self, messages: list[dict], tools: list[dict]) -> str:
        """What the template writes after an assistant turn's end-of-turn token for ``messages``, up to and
        including the next generation prompt."""
        before, _ = self.base(tools)
        after = chat_text(
            self.tokenizer, [*BASE_CONVERSATION, *messages], add_generation_prompt=True, tools=tools or None
        )
        if not after.startswith(before):
            raise UserError(
                "model.chat_template: it renders an assistant turn differently once messages follow it, so "
                "the environment's messages cannot be appended to what the model sampled"
            )
        return after[len(before) :]

    def ids(self, messages: list[dict], tools: list[dict], closed: bool) -> list[int]:
        """The suffix's token ids, after the end-of-turn token when the turn was cut before it (``closed``
        False)."""
        ids = self.tokenizer(self.text(messages, tools), add_special_tokens=False)["input_ids"]
        return ids if closed else [self.base(tools)[1], *ids]


class TokenSampler:
    """Next tokens as the rollouts' decode loop draws them (:func:`trainer_lib.rl.decode.sample_tokens`:
    temperature, top-k, top-p, one uniform number per row from the global generator; greedy at temperature
    0), with each drawn token's log-prob under ``log_softmax(logits / temperature)``, as
    :class:`~trainer_lib.rl.rollout.SampledLogprobs` records it."""

    def __init__(self, temperature: float, top_p: float, top_k: int):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens (B,), their log-probs (B,))`` from next-token logits ``(B, V)``."""
        from trainer_lib.rl.decode import sample_tokens

        uniform = torch.rand(logits.shape[0], device=logits.device) if self.temperature > 0 else None
        return sample_tokens(logits, uniform, self.temperature, self.top_k, self.top_p)


class LiveCache:
    """The KV cache of the live episodes (one row each) and the attention mask over all it holds: 1 on tokens,
    0 on holes."""

    def __init__(self, model, cache, mask: torch.Tensor):
        self.model, self.cache, self.mask = model, cache, mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(B, V)`` after a block of new tokens ``(B, T)`` (0 in ``mask`` on holes; each
        row's last column a token)."""
        self.mask = torch.cat([self.mask, mask], dim=1)
        positions = (self.mask.cumsum(1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]

    def prefill(self, blocks: list[list[int]], pad: int) -> torch.Tensor:
        """Next-token logits after each row's new tokens, left-padded into one block."""
        ids, mask = pad_rows(blocks, pad, left=True)
        return self.forward(ids.to(self.mask.device), mask.to(self.mask.device))

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (episodes that go on), in this order."""
        if len(rows) == self.mask.shape[0]:
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]


@dataclasses.dataclass
class Track:
    """One episode's tokens as they grow: ``unread`` are those the model has not been given yet."""

    prompt: list[int]
    response: list[int] = dataclasses.field(default_factory=list)
    action: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turns: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    unread: list[int] = dataclasses.field(default_factory=list)
    seen: int = 0  # messages of the episode already in the tokens

    def room(self, max_total_tokens: int) -> int:
        return max_total_tokens - len(self.prompt) - len(self.response)

    def add(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        if sampled:
            self.turns.append((len(self.response), len(self.response) + len(ids)))
        self.response += ids
        self.action += [int(sampled)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def decode_turn(live: LiveCache, logits, caps: list[int], sample: TokenSampler, eos: set[int], pad: int):
    """One turn of every live row: ``[(tokens, log-probs)]``, each row until an end-of-turn token or its cap.
    A row's last token is not forwarded here (the next turn's block starts with it); a row that has finished
    feeds a hole while the others go on."""
    tokens: list[list[int]] = [[] for _ in caps]
    logprobs: list[list[float]] = [[] for _ in caps]
    going = [True] * len(caps)
    device = live.mask.device
    while True:
        drawn, drawn_logprobs = (t.tolist() for t in sample(logits))
        for row in range(len(caps)):
            if going[row]:
                tokens[row].append(drawn[row])
                logprobs[row].append(drawn_logprobs[row])
                going[row] = drawn[row] not in eos and len(tokens[row]) < caps[row]
        if not any(going):
            return list(zip(tokens, logprobs))
        feed = torch.tensor([[t[-1] if g else pad] for t, g in zip(tokens, going)], device=device)
        logits = live.forward(feed, torch.tensor([[int(g)] for g in going], device=device))


def first_cache(model, tracks: list[Track], live: list[int], n: int, pad: int) -> LiveCache:
    """The live episodes' cache before turn 1, their prompts left unread; the ``n`` episodes of a row share one
    prefill of their prompt but its last token when all groups' prompts are equal within the group."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    prompts = [tracks[i].prompt for i in live]
    groups = [prompts[g : g + n] for g in range(0, len(prompts), n)]
    share = n > 1 and len(live) == len(tracks) and all(p == group[0] for group in groups for p in group)
    if share and min(len(p) for p in prompts) > 1:
        ids, mask = pad_rows(prompts[::n], pad, left=True)
        cache = shared_prompt_cache(model, ids.to(device), mask.to(device), n)
        for i in live:
            tracks[i].unread = tracks[i].prompt[-1:]
        return LiveCache(model, cache, mask[:, :-1].repeat_interleave(n, dim=0).to(device))
    for i in live:
        tracks[i].unread = list(tracks[i].prompt)
    return LiveCache(
        model, DynamicCache(config=model.config), torch.zeros((len(live), 0), dtype=torch.long, device=device)
    )


@dataclasses.dataclass(frozen=True)
class Limits:
    max_new_tokens: int
    max_total_tokens: int


def play_turn(batch: EpisodeBatch, tracks: list[Track], live: list[int], turns, tokenizer, eos: set[int], limits):
    """Record one turn of the live episodes and step their environments with it."""
    replies, overran = [], []
    for i, (tokens, logprobs) in zip(live, turns):
        room = tracks[i].room(limits.max_total_tokens)
        closed = tokens[-1] in eos
        tracks[i].add(tokens, sampled=True, logprobs=logprobs)
        replies.append({"content": tokenizer.decode(tokens[:-1] if closed else tokens, skip_special_tokens=True)})
        overran.append(not closed and len(tokens) >= room)
    batch.advance(replies, overran)


def append_environment(batch, tracks, live, turns, suffix: EnvironmentSuffix, eos: set[int], limits) -> list[int]:
    """Append each going-on episode's environment messages, rendered alone; end the episodes left without
    room for a reply. The rows that go on."""
    going = []
    for row in play_rows(batch, live):
        i, (tokens, _) = live[row], turns[row]
        episode = batch.episodes[i]
        messages = episode.messages[tracks[i].seen + 1 :]  # after the assistant message
        tracks[i].seen = len(episode.messages)
        ids = suffix.ids(messages, episode.tools, closed=tokens[-1] in eos)
        if tracks[i].room(limits.max_total_tokens) - len(ids) < 1:
            episode.end("max_total_tokens")
            continue
        tracks[i].add(ids, sampled=False)
        tracks[i].unread = [tokens[-1], *ids]
        going.append(row)
    return going


def play_rows(batch: EpisodeBatch, live: list[int]) -> list[int]:
    """The positions in ``live`` of the episodes that have not ended."""
    return [row for row, i in enumerate(live) if not batch.episodes[i].finished]


def play(model, tokenizer, batch: EpisodeBatch, tracks: list[Track], sample: TokenSampler, limits: Limits, n: int):
    """Every episode of ``batch`` to its end, a batched turn at a time, over one KV cache."""
    eos_ids = eos_token_ids(model, tokenizer)
    eos, pad = set(eos_ids), tokenizer.pad_token_id
    suffix = EnvironmentSuffix(tokenizer, {tokenizer.decode([token]): token for token in eos_ids})
    for i, episode in enumerate(batch.episodes):
        if not episode.finished and tracks[i].room(limits.max_total_tokens) < 1:
            episode.end("max_total_tokens")
    live = [i for i, episode in enumerate(batch.episodes) if not episode.finished]
    if not live:
        return
    cache = first_cache(model, tracks, live, n, pad)
    while live:
        if [turn.index for turn in batch.pending()] != live:
            raise RuntimeError("the batch's pending episodes differ from the cache's rows")
        logits = cache.prefill([tracks[i].unread for i in live], pad)
        caps = [min(limits.max_new_tokens, tracks[i].room(limits.max_total_tokens)) for i in live]
        turns = decode_turn(cache, logits, caps, sample, eos, pad)
        play_turn(batch, tracks, live, turns, tokenizer, eos, limits)
        going = append_environment(batch, tracks, live, turns, suffix, eos, limits)
        cache.keep(going)
        live = [live[row] for row in going]


@torch.no_grad()
def generate_episodes(
    model,
    tokenizer,
    rows: Sequence[dict],
    make_env: Callable[[], object],
    *,
    n: int = 1,
    max_turns: int = 4,
    max_new_tokens: int = 64,
    max_total_tokens: int = 1024,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    record_logprobs: bool = False,
    gamma: float = 1.0,
    step_workers: int = 1,
) -> Rollout:
    """``n`` episodes per row (``n`` consecutive rollout rows each), played to their ends.

    ``make_env()`` builds one environment per episode; ``max_new_tokens`` bounds each turn and
    ``max_total_tokens`` the whole trajectory. ``temperature=0`` is greedy; sampling draws from the global
    generator seeded with ``seed`` (left as it was afterwards). The Rollout's ``completions`` are the final
    answers (the last assistant message), ``finished`` says which episodes the environment ended (``done``),
    ``episodes`` holds one :class:`Trajectory` per row (returns discounted by ``gamma``), ``logprobs`` (with
    ``record_logprobs``) the sampler's log-prob of each model token (0 on the environment's), and ``stats``
    ``generate_time``, ``generated_tokens`` (the model's) and ``tokens_per_s``. ``step_workers`` > 1 steps
    the environments in threads.
    """
    expanded = [row for row in rows for _ in range(n)]
    batch = EpisodeBatch([make_env() for _ in expanded], expanded, max_turns=max_turns, step_workers=step_workers)
    tracks = []
    for episode in batch.episodes:
        text = chat_text(tokenizer, episode.messages, add_generation_prompt=True, tools=episode.tools or None)
        tracks.append(Track(tokenizer(text, add_special_tokens=False)["input_ids"], seen=len(episode.messages)))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        play(
            model,
            tokenizer,
            batch,
            tracks,
            TokenSampler(temperature, top_p, top_k),
            Limits(max_new_tokens, max_total_tokens),
            n,
        )
    elapsed = time.perf_counter() - start
    model.train(was_training)
    return assemble(tokenizer.pad_token_id, tracks, batch.results(gamma), elapsed, record_logprobs)


def assemble(
    pad: int, tracks: list[Track], results: list[EpisodeResult], elapsed: float, record_logprobs: bool
) -> Rollout:
    """The Rollout of finished episodes."""
    prompt_ids, prompt_mask = pad_rows([t.prompt for t in tracks], pad, left=True)
    response_ids, response_mask = pad_rows([t.response for t in tracks], pad, left=False)
    action_mask = pad_rows([t.action for t in tracks], 0, left=False)[0]
    trajectories = [Trajectory(result, track.turns) for result, track in zip(results, tracks)]
    logprobs = None
    if record_logprobs:
        logprobs = torch.zeros(response_ids.shape, dtype=torch.float32)
        for row, track in enumerate(tracks):
            logprobs[row, : len(track.logprobs)] = torch.tensor(track.logprobs, dtype=torch.float32)
    tokens = int(action_mask.sum())
    return Rollout(
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        [t.final_answer for t in trajectories],
        [t.episode.done_reason == "done" for t in trajectories],
        {"generate_time": elapsed, "generated_tokens": tokens, "tokens_per_s": tokens / max(elapsed, 1e-9)},
        logprobs=logprobs,
        action_mask=action_mask,
        episodes=trajectories,
    )


def episode_sums(trajectories: Sequence[Trajectory], action_mask: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """A step's episode statistics as sums, to add up over ranks (then :func:`episode_metrics`)."""
    counts = [t.episode.tool_calls for t in trajectories]
    return {
        "episodes": float(len(trajectories)),
        "episode/turns": float(sum(t.episode.turns for t in trajectories)),
        "episode/tool_calls": float(sum(c.valid for c in counts)),
        "episode/malformed_tool_calls": float(sum(c.malformed for c in counts)),
        "episode/tool_errors": float(sum(c.errors for c in counts)),
        "episode/env_tokens": float((response_mask - action_mask).sum()),
        **{
            f"episode/done_{reason}": float(sum(t.episode.done_reason == reason for t in trajectories))
            for reason in DONE_REASONS
        },
    }


def episode_metrics(sums: dict) -> dict:
    """Per-episode means of :func:`episode_sums` (done reasons as fractions), and the share of tool calls
    that were well formed (``episode/valid_tool_call_rate``; 0 when no call was tried)."""
    count = max(sums["episodes"], 1.0)
    metrics = {key: value / count for key, value in sums.items() if key.startswith("episode/")}
    tried = sums["episode/tool_calls"] + sums["episode/malformed_tool_calls"]
    metrics["episode/valid_tool_call_rate"] = sums["episode/tool_calls"] / tried if tried else 0.0
    return metrics
