"""Held-out agent episodes: each model plays one greedy episode per row of ``env.path`` in the environment of
the ``env`` keys (a question answered with tools, or ``env.class=module:Class``), and the episodes are scored.

    agent_success_rate          share of episodes the environment ended itself (done) with a final step reward
                                >= env.success_reward (default 1.0: accuracy_reward's right answer)
    agent_mean_turns            assistant turns per episode
    agent_valid_tool_call_rate  well-formed tool calls over all calls tried, over the whole set (0 when none was)
    agent_reward_mean           each episode's reward as GRPO takes it (env.reward: the last step's, or the
                                discounted sum of the steps'), averaged
    agent_done_<reason>         the share of episodes that ended so: done, max_turns, max_total_tokens

The episodes are played by :func:`trainer_lib.rl.multi_turn.generate_episodes` (temperature 0, one episode per
row, a KV cache per batch) on the PyTorch engine's model. Rows are cut into batches of ``batch_size`` and
batch ``i`` is played by rank ``i % world_size``, as :func:`trainer_lib.eval.generation.generate_sharded`
shares prompts out; each episode's row travels as JSON and every rank gets every row, in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainer_lib.errors import ConfigError, UserError

#: The four headline metrics; :func:`metric_names` adds the done reasons' shares.
AGENT_METRICS = ("agent_success_rate", "agent_mean_turns", "agent_valid_tool_call_rate", "agent_reward_mean")


def metric_names() -> list[str]:
    """Every metric an agent set gives each model."""
    from trainer_lib.agents import DONE_REASONS

    return [*AGENT_METRICS, *(f"agent_done_{reason}" for reason in DONE_REASONS)]


def load_rows(path: str, limit: int = 0) -> list[dict]:
    """The held-out rows of ``env.path`` (any dataset source, local or a URL), the first ``limit`` (0: all)."""
    from trainer_lib.data.sources import iter_source

    rows = []
    for _, row in iter_source(path, key="env.path"):
        rows.append(dict(row))
        if limit and len(rows) >= limit:
            break
    if not rows:
        raise UserError(f"env.path: {path}: no rows")
    return rows


@dataclass(frozen=True)
class EpisodeSettings:
    """How each episode is played and judged (the ``env`` keys)."""

    max_turns: int
    max_new_tokens: int
    max_total_tokens: int
    reward: str  # env.reward: final or sum
    gamma: float
    success_reward: float


def episode_row(trajectory, settings: EpisodeSettings) -> dict:
    """One episode's per-problem row: its opening, the whole transcript (and its messages), the final answer,
    turns, step rewards, the episode reward, success, why it ended and its tool-call counts."""
    from trainer_lib.rl.experience import prompt_text

    episode = trajectory.episode
    first = next((i for i, m in enumerate(episode.messages) if m.get("role") == "assistant"), len(episode.messages))
    final = episode.rewards[-1] if episode.rewards else 0.0
    return {
        "prompt": prompt_text(episode.messages[:first]),
        "transcript": prompt_text(episode.messages),
        "messages": episode.messages,
        "answer": trajectory.final_answer,
        "turns": episode.turns,
        "rewards": list(episode.rewards),
        "reward": trajectory.reward(settings.reward),
        "success": episode.done_reason == "done" and final >= settings.success_reward,
        "done_reason": episode.done_reason,
        "tool_calls": episode.tool_calls.valid,
        "malformed_tool_calls": episode.tool_calls.malformed,
        "tool_errors": episode.tool_calls.errors,
    }


def play_episodes(
    engine, rows: list[dict], make_env, settings: EpisodeSettings, batch_size: int, seed: int, strategy=None
) -> list[dict]:
    """One greedy episode per row with ``engine``'s model (the PyTorch engine's), ``make_env()`` building each
    episode's environment; the rows of :func:`episode_row`, in order, on every rank."""
    from trainer_lib.eval.generation import merge_texts
    from trainer_lib.rl.multi_turn import generate_episodes

    if getattr(engine, "name", None) != "torch" or engine.collective:
        raise ConfigError("env.path: episodes run on the PyTorch engine with a whole model (engine=torch, replica)")
    batches = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    rank, world = (strategy.rank, strategy.world_size) if strategy is not None else (0, 1)
    played: dict[int, str] = {}
    for index in range(rank, len(batches), world):
        rollout = generate_episodes(
            engine.model,
            engine.tokenizer,
            batches[index],
            make_env,
            n=1,
            max_turns=settings.max_turns,
            max_new_tokens=settings.max_new_tokens,
            max_total_tokens=settings.max_total_tokens,
            temperature=0.0,
            seed=seed,
            gamma=settings.gamma,
        )
        for offset, trajectory in enumerate(rollout.episodes):
            played[index * batch_size + offset] = json.dumps(episode_row(trajectory, settings), default=str)
    texts = [played[i] for i in range(len(rows))] if world == 1 else merge_texts(strategy, played, len(rows))
    return [json.loads(text) for text in texts]


def agent_metrics(rows: list[dict]) -> dict[str, float]:
    """The set's metrics (module docstring) from its per-problem rows."""
    from trainer_lib.agents import DONE_REASONS

    count = max(len(rows), 1)
    valid = sum(r["tool_calls"] for r in rows)
    tried = valid + sum(r["malformed_tool_calls"] for r in rows)
    return {
        "agent_success_rate": sum(bool(r["success"]) for r in rows) / count,
        "agent_mean_turns": sum(r["turns"] for r in rows) / count,
        "agent_valid_tool_call_rate": valid / tried if tried else 0.0,
        "agent_reward_mean": sum(r["reward"] for r in rows) / count,
        **{f"agent_done_{reason}": sum(r["done_reason"] == reason for r in rows) / count for reason in DONE_REASONS},
    }
