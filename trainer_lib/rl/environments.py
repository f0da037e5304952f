"""The environment of a multi-turn RL run, built once from the config's ``env`` section.

``env.class=tools`` is a :class:`trainer_lib.agents.ToolEnvironment` over the built-in tools named in
``env.tools`` (``calculator``; ``python``, run in one sandbox the run shares; ``search`` over ``env.corpus``),
whose final answer is scored by ``env.checker``, a reward function (``accuracy_reward`` by default) called as the
reward sources call it, on the answer and the row's columns. ``env.class=package.module:Class`` is built with
``env.settings`` as keyword arguments. Either way a fresh environment object plays each episode.

:class:`Episodes` is what a step's sampling calls instead of single-turn generation: it plays the episodes
(:func:`trainer_lib.rl.multi_turn.generate_episodes`) with the rollout settings, and hands each episode's
reward (``env.reward``: the last step's, or the discounted sum of the steps') to the reward sources as the
``env_reward`` column, which the source :func:`environment_reward` (``rewards/env`` in the logs) returns. The
configured reward functions score the final answer beside it, and the combination is as in single-turn RL.
"""

from __future__ import annotations

from collections.abc import Callable

from trainer_lib.errors import ConfigError

#: The column that carries each episode's reward from the rollout to the reward sources.
ENV_REWARD_COLUMN = "env_reward"
TOOL_ENVIRONMENT = "trainer_lib.agents.tool_env:ToolEnvironment"


def environment_reward(prompts, completions, *, env_reward, **columns) -> list[float]:
    """The reward source ``env``: each episode's reward, as :class:`Episodes` put it in its column."""
    return [float(value) for value in env_reward]


def environment_sources(env_cfg) -> list[tuple[str, Callable]]:
    """The reward source ``env`` of a multi-turn run (``env.class`` set), first among the sources; none else.
    With ``env.reward=turns`` (PPO) it is token-level: :class:`TurnRewards`."""
    if not env_cfg.class_:
        return []
    return [("env", TurnRewards() if env_cfg.reward == "turns" else environment_reward)]


class TurnRewards:
    """``env.reward=turns`` (PPO): each turn's step reward on the last token of that model turn, so that GAE
    credits the turn where it ended; its score per episode (logged as ``rewards/env``, and the held-out
    reward) is the undiscounted sum, left out of the completion's training reward (a token-level source)."""

    token_level = True
    __name__ = "env"

    def __call__(self, prompts, completions, *, env_reward, **columns) -> list[float]:
        return environment_reward(prompts, completions, env_reward=env_reward)

    def placed(self, rollout, tokenizer=None):
        """``(N, R)``: the step rewards of each row's episode at its turns' last tokens."""
        import torch

        placed = torch.zeros(rollout.response_ids.shape, dtype=torch.float32)
        for row, trajectory in enumerate(rollout.episodes or []):
            for (start, end), reward in zip(trajectory.turns, trajectory.episode.rewards):
                if end > start:
                    placed[row, end - 1] += reward
        return placed


def answer_checker(spec: str, **builtin_settings) -> tuple[Callable[[str, dict], float], object]:
    """``(checker(answer, row) -> float, the reward function)`` from a reward function's spec: the function
    scores the one answer with the row's columns as keyword lists, ``None`` (does not apply) counting 0.0."""
    from trainer_lib.rewards.functions import as_completions, check_rewards, resolve

    name, fn = resolve(spec, **builtin_settings)

    def check(answer: str, row: dict) -> float:
        prompt = row.get("prompt", row.get("question"))
        columns = {key: [value] for key, value in row.items() if key != "prompt"}
        values = check_rewards(name, fn([prompt], as_completions([prompt], [answer]), **columns), 1)
        return values[0] if values[0] is not None else 0.0

    return check, fn


class Episodes:
    """A run's environment and how its episodes are played: ``make_env()`` builds one per episode,
    ``rollout(...)`` plays a step's, ``close()`` releases what the tools and the checker hold (a sandbox)."""

    def __init__(self, env_cfg, reward_settings: dict):
        from trainer_lib.agents import load_environment

        self.cfg = env_cfg
        self.closers: list = []
        if env_cfg.class_ == "tools":
            tools = self.builtin_tools(env_cfg)
            checker, fn = answer_checker(env_cfg.checker, **reward_settings)
            self.closers.append(fn)
            settings = {**env_cfg.settings, "tools": tools, "checker": checker}
            self.spec, self.settings = TOOL_ENVIRONMENT, settings
        else:
            self.spec, self.settings = env_cfg.class_, dict(env_cfg.settings)
        self.load = lambda: load_environment(self.spec, self.settings, settings_key="env.settings")
        self.load()  # a bad class or setting fails now, before any model loads

    def builtin_tools(self, env_cfg) -> list:
        from trainer_lib.agents import calculator_tool, python_tool, search_tool

        tools = []
        for name in env_cfg.tools:
            if name == "calculator":
                tools.append(calculator_tool())
            elif name == "python":
                from trainer_lib.sandbox import Sandbox

                sandbox = Sandbox()
                self.closers.append(sandbox)
                tools.append(python_tool(sandbox))
            elif name == "search":
                tools.append(search_tool(env_cfg.corpus))
            else:
                raise ConfigError(f"env.tools: no built-in tool {name!r}")
        return tools

    def make_env(self):
        return self.load()

    def rollout(self, model, tokenizer, rows: list[dict], rollout_cfg, seed: int, record_logprobs: bool = False):
        """The episodes of ``rollout_cfg.n`` per row, and each one's reward for the ``env_reward`` column."""
        from trainer_lib.rl.multi_turn import generate_episodes

        rollout = generate_episodes(
            model,
            tokenizer,
            rows,
            self.make_env,
            n=rollout_cfg.n,
            max_turns=self.cfg.max_turns,
            max_new_tokens=rollout_cfg.max_new_tokens,
            max_total_tokens=self.cfg.max_total_tokens,
            temperature=rollout_cfg.temperature,
            top_p=rollout_cfg.top_p,
            top_k=rollout_cfg.top_k,
            seed=seed,
            record_logprobs=record_logprobs,
            gamma=self.cfg.gamma,
        )
        return rollout, [trajectory.reward(self.cfg.reward) for trajectory in rollout.episodes]

    def close(self) -> None:
        for item in self.closers:
            if hasattr(item, "close"):
                item.close()
