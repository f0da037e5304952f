"""Episodes: a policy and an environment taking turns until the task is done or a limit is reached.

``run_episode(env, row, policy)`` plays one episode to its end, for tests and evaluation.
:class:`EpisodeBatch` plays many together, one turn at a time, for a rollout engine that generates every
waiting episode's next message in one batch:

    batch = EpisodeBatch(envs, rows, max_turns=6, max_total_tokens=4096, count_tokens=token_count)
    while not batch.finished:
        turns = batch.pending()
        batch.advance(generate([t.messages for t in turns], [t.tools for t in turns]))
    results = batch.results(gamma=1.0)

An episode ends for one of three reasons, recorded as ``done_reason``: the environment said so
(``"done"``), the policy used its ``max_turns`` assistant turns (``"max_turns"``), or the transcript
reached ``max_total_tokens`` (``"max_total_tokens"``), counted by ``count_tokens`` over every message's
content, the prompt included: characters by default, tokens with a tokenizer's count. A reply that
overruns the budget is kept in the transcript (the engine generated it) but is not sent to the
environment: cut short, it may hold half a tool call. An engine that counts the budget itself, in the
tokens of the trajectory it built (``trainer_lib.rl.multi_turn``), passes no ``max_total_tokens`` and says
so instead: ``advance(replies, overran=...)`` for replies that ran into it, ``Episode.end("max_total_tokens")``
for an episode with no room left for another reply.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from collections.abc import Callable, Sequence

from trainer_lib.agents.env import Environment

#: Why an episode ended.
DONE_REASONS = ("done", "max_turns", "max_total_tokens")
#: ``policy(messages, tools) -> assistant message``: the conversation so far and the tools' schemas.
Policy = Callable[[list[dict], list[dict]], dict]


def returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """The discounted return from each step: G_t = r_t + gamma * G_{t+1}, with G = 0 after the last step.

    Sutton and Barto, Reinforcement Learning (2nd ed., 2018), eq. 3.8, G_t = sum_k gamma^k R_{t+k+1}, in
    its recursive form (eq. 3.9); ``rewards[t]`` is their R_{t+1}, the reward that follows turn t. An episode
    cut by a limit is not bootstrapped here: its return counts only the rewards it received.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = [0.0] * len(rewards)
    following = 0.0
    for t in reversed(range(len(rewards))):
        following = float(rewards[t]) + gamma * following
        out[t] = following
    return out


@dataclasses.dataclass(frozen=True)
class ToolCallCounts:
    """The tool calls of an episode, summed over its steps' ``info`` (zero for environments without tools):
    ``valid`` calls ran; ``malformed`` ones could not; ``raised`` and ``timeout`` are runs that failed
    (``errors``); ``truncated`` results were cut to the output cap."""

    valid: int = 0
    malformed: int = 0
    raised: int = 0
    timeout: int = 0
    truncated: int = 0

    @property
    def errors(self) -> int:
        return self.raised + self.timeout

    @classmethod
    def from_infos(cls, infos: Sequence[dict]) -> ToolCallCounts:
        errors = [info.get("tool_errors") or {} for info in infos]
        return cls(
            valid=sum(int(info.get("tool_calls", 0)) for info in infos),
            **{
                kind: sum(int(e.get(kind, 0)) for e in errors)
                for kind in ("malformed", "raised", "timeout", "truncated")
            },
        )


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    """One finished episode: the whole transcript (prompt, assistant turns, environment messages), the tools
    it was offered, one reward, info and discounted return per assistant turn, and why it ended."""

    messages: list[dict]
    tools: list[dict]
    rewards: list[float]
    returns: list[float]
    done_reason: str
    tool_calls: ToolCallCounts
    infos: list[dict]

    @property
    def turns(self) -> int:
        return len(self.rewards)

    @property
    def episode_return(self) -> float:
        """G_0, the discounted return of the whole episode (0.0 for an episode with no turn)."""
        return self.returns[0] if self.returns else 0.0


@dataclasses.dataclass(frozen=True)
class PendingTurn:
    """An episode waiting for the policy: its index in the batch, its conversation and tools, and how much
    of the length budget is left for the reply (None without a budget)."""

    index: int
    messages: list[dict]
    tools: list[dict]
    remaining: int | None


def message_length(message: dict, count_tokens: Callable[[str], int] = len) -> int:
    """The length of a message for the budget: its text content, plus its structured tool calls as JSON."""
    content = message.get("content")
    text = content if isinstance(content, str) else ("" if content is None else json.dumps(content, default=str))
    if message.get("tool_calls"):
        text += json.dumps(message["tool_calls"], default=str)
    return count_tokens(text) if text else 0


class Episode:
    """One episode as a state machine: built from ``env.reset(row)``, moved on by ``advance(reply)``."""

    def __init__(
        self,
        env: Environment,
        row: dict,
        max_turns: int,
        max_total_tokens: int | None = None,
        count_tokens: Callable[[str], int] = len,
    ):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.env = env
        self.max_turns = max_turns
        self.max_total_tokens = max_total_tokens
        self.count_tokens = count_tokens
        observation = env.reset(row)
        self.messages = list(observation.messages)
        self.tools = list(observation.tools)
        self.rewards: list[float] = []
        self.infos: list[dict] = []
        self.length = sum(message_length(m, count_tokens) for m in self.messages)
        self.done_reason: str | None = "max_total_tokens" if self._over_budget() else None

    @property
    def finished(self) -> bool:
        return self.done_reason is not None

    @property
    def remaining(self) -> int | None:
        return None if self.max_total_tokens is None else max(0, self.max_total_tokens - self.length)

    def _over_budget(self) -> bool:
        return self.max_total_tokens is not None and self.length >= self.max_total_tokens

    def _add(self, message: dict) -> None:
        self.messages.append(message)
        self.length += message_length(message, self.count_tokens)

    def advance(self, reply: dict, overran: bool = False) -> None:
        """Take the policy's next assistant message, let the environment answer it, and check the limits.

        ``overran``: the engine measured the budget itself (a rollout engine counts the trajectory's tokens,
        not the messages' text) and the reply ran into it: it is kept but not stepped, as any reply over
        ``max_total_tokens`` is."""
        if self.finished:
            raise RuntimeError(f"the episode has ended ({self.done_reason})")
        self._add({"role": "assistant", **reply})
        if overran or (self.max_total_tokens is not None and self.length > self.max_total_tokens):
            self.rewards.append(0.0)  # the reply overran the budget: it is never stepped
            self.infos.append({})
            self.done_reason = "max_total_tokens"
            return
        result = self.env.step(reply)
        self.rewards.append(float(result.reward))
        self.infos.append(dict(result.info))
        for message in result.messages:
            self._add(message)
        if result.done:
            self.done_reason = "done"
        elif self._over_budget():
            self.done_reason = "max_total_tokens"
        elif len(self.rewards) >= self.max_turns:
            self.done_reason = "max_turns"

    def end(self, reason: str) -> None:
        """End a running episode between turns for one of :data:`DONE_REASONS` (an engine that measures the
        length budget itself ends an episode with no room left for another reply)."""
        if reason not in DONE_REASONS:
            raise ValueError(f"reason must be one of {DONE_REASONS}, got {reason!r}")
        if self.finished:
            raise RuntimeError(f"the episode has ended ({self.done_reason})")
        self.done_reason = reason

    def result(self, gamma: float = 1.0) -> EpisodeResult:
        if not self.finished:
            raise RuntimeError("the episode is still running")
        return EpisodeResult(
            messages=list(self.messages),
            tools=list(self.tools),
            rewards=list(self.rewards),
            returns=returns(self.rewards, gamma),
            done_reason=self.done_reason,
            tool_calls=ToolCallCounts.from_infos(self.infos),
            infos=list(self.infos),
        )


def run_episode(
    env: Environment,
    row: dict,
    policy: Policy,
    max_turns: int = 8,
    max_total_tokens: int | None = None,
    count_tokens: Callable[[str], int] = len,
    gamma: float = 1.0,
) -> EpisodeResult:
    """Play one episode of ``env`` on ``row``, asking ``policy(messages, tools)`` for each assistant turn."""
    episode = Episode(env, row, max_turns, max_total_tokens, count_tokens)
    while not episode.finished:
        episode.advance(policy(list(episode.messages), episode.tools))
    return episode.result(gamma)


class EpisodeBatch:
    """Many episodes advanced together, a turn at a time: ``pending()`` lists those waiting for the policy,
    ``advance(replies)`` takes one reply each, in that order. ``envs[i]`` plays ``rows[i]`` (one
    environment object per episode); with ``step_workers > 1`` the environments' steps run in threads,
    so one episode's slow tool does not hold up the others' steps."""

    def __init__(
        self,
        envs: Sequence[Environment],
        rows: Sequence[dict],
        max_turns: int = 8,
        max_total_tokens: int | None = None,
        count_tokens: Callable[[str], int] = len,
        step_workers: int = 1,
    ):
        if len(envs) != len(rows):
            raise ValueError(f"{len(envs)} environments for {len(rows)} rows: one environment per episode")
        self.episodes = [Episode(e, r, max_turns, max_total_tokens, count_tokens) for e, r in zip(envs, rows)]
        self.step_workers = max(1, step_workers)
        self.asked: list[int] = []

    @property
    def finished(self) -> bool:
        return all(episode.finished for episode in self.episodes)

    def pending(self) -> list[PendingTurn]:
        """The episodes that need the policy's next message now, with what it should see."""
        waiting = [(i, e) for i, e in enumerate(self.episodes) if not e.finished]
        self.asked = [i for i, _ in waiting]
        return [PendingTurn(i, list(e.messages), e.tools, e.remaining) for i, e in waiting]

    def advance(self, replies: Sequence[dict], overran: Sequence[bool] | None = None) -> None:
        """One assistant message for each turn of the last ``pending()``, in its order; ``overran`` marks the
        replies that ran into an engine's own length budget (:meth:`Episode.advance`)."""
        if len(replies) != len(self.asked):
            raise ValueError(f"{len(replies)} replies for {len(self.asked)} pending episodes")
        overran = list(overran) if overran is not None else [False] * len(replies)
        if len(overran) != len(replies):
            raise ValueError(f"{len(overran)} overran flags for {len(replies)} replies")
        triples = list(zip([self.episodes[i] for i in self.asked], replies, overran))
        self.asked = []
        if self.step_workers == 1 or len(triples) < 2:
            for episode, reply, over in triples:
                episode.advance(reply, over)
            return
        with concurrent.futures.ThreadPoolExecutor(min(self.step_workers, len(triples))) as pool:
            list(pool.map(lambda triple: triple[0].advance(triple[1], triple[2]), triples))

    def results(self, gamma: float = 1.0) -> list[EpisodeResult]:
        """Every episode's result, in the order of ``rows``, once all have finished."""
        return [episode.result(gamma) for episode in self.episodes]
