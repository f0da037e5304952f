"""PPO on multi-turn episodes (issue 43): the tiny model taught to call the calculator trains in the tools
environment; the loss, KL and GAE run over the model's tokens only, skipping the tool results between its
turns; with ``env.reward=turns`` each turn's reward lands on that turn's last token (per-turn credit)."""

import json
import os
import shutil

import pytest
import torch

from tests.rl.agent_helpers import AGENT_GRPO
from tests.stages.training.rl_helpers import weights
from trainer_lib.agents import ToolCallCounts
from trainer_lib.agents.episode import EpisodeResult
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.losses import gae_advantages
from trainer_lib.rl.environments import TurnRewards
from trainer_lib.rl.multi_turn import Trajectory
from trainer_lib.rl.rollout import Rollout

pytestmark = pytest.mark.usefixtures("single_thread")


def agent_ppo(model, data, out, *extra: str) -> None:
    from trainer_lib.cli import main

    args = ["ppo", f"model.path={model}", f"data.path={data}", f"output_dir={out}", *AGENT_GRPO]
    assert main([*args, "logging_steps=1", *extra]) == 0


def test_gae_skips_the_environments_tokens_between_turns():
    """A model turn (positions 0-1), two environment tokens, a second turn (4-5): the advantages are those of
    the four model tokens alone, as if the tool result were not there (hand computation, gamma 0.9, lam 0.5)."""
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[0.0, 0.5, 7.0, 7.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 9.0, 9.0, 0.3, 0.6]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma, lam)
    r, v = [0.0, 0.5, 0.0, 1.0], [0.2, 0.4, 0.3, 0.6]
    expected, running = [0.0] * 4, 0.0
    for t in reversed(range(4)):
        running = r[t] + gamma * (v[t + 1] if t < 3 else 0.0) - v[t] + gamma * lam * running
        expected[t] = running
    assert advantages[0, [0, 1, 4, 5]].tolist() == pytest.approx(expected)
    assert advantages[0, 2:4].tolist() == [0.0, 0.0] and returns[0, 2:4].tolist() == [0.0, 0.0]
    assert returns[0, [0, 1, 4, 5]].tolist() == pytest.approx([a + b for a, b in zip(expected, v)])


def test_turn_rewards_land_on_each_turns_last_token():
    episode = EpisodeResult([], [], [0.25, 1.0], [1.25, 1.0], "done", ToolCallCounts(), [{}, {}])
    single = EpisodeResult([], [], [0.5], [0.5], "done", ToolCallCounts(), [{}])
    rollout = Rollout(
        torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1), torch.zeros(2, 8, dtype=torch.long),
        torch.ones(2, 8), ["", ""], [True, True], {},
        episodes=[Trajectory(episode, [(0, 2), (5, 8)]), Trajectory(single, [(0, 3)])],
    )  # fmt: skip
    placed = TurnRewards().placed(rollout)
    assert placed[0].tolist() == [0, 0.25, 0, 0, 0, 0, 0, 1.0] and placed[1].tolist() == [0, 0, 0.5, 0, 0, 0, 0, 0]
    assert TurnRewards()(["q", "q"], ["a", "b"], env_reward=[1.25, 0.5]) == [1.25, 0.5]


def test_ppo_trains_on_calculator_episodes_with_per_turn_rewards(calculator_model, questions, tmp_path, capsys):
    """env.reward=turns: each turn's reward on its last token; the run logs the episodes and the critic, the
    first step's token rewards are the turns' (no KL yet; accuracy_reward is the completion's reward), and
    losing the last checkpoint and rerunning gives the same weights."""
    out = tmp_path / "ppo"
    args = ("max_steps=3", "save_steps=2", "save_total_limit=0", "env.reward=turns", "ppo_epochs=1")
    agent_ppo(calculator_model, questions, out, *args)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for key in ("episode/turns", "episode/tool_calls", "rewards/env", "rewards/accuracy_reward", "value_loss"):
        assert key in train[-1], key
    # every step's episodes called the tool (by step 3 most calls of the 3e-3-taught model are malformed: still calls)
    calls = [r["episode/tool_calls"] + r["episode/malformed_tool_calls"] for r in train]
    assert all(r["episode/turns"] > 1 for r in train) and all(c > 0 for c in calls)
    assert train[0]["episode/tool_calls"] > 0
    # the turn rewards sum to the logged episode reward (env.reward=turns: the plain sum)
    assert train[0]["non_score_reward"] == pytest.approx(train[0]["rewards/env"], abs=1e-5)
    reference = weights(out)
    shutil.rmtree(out / "checkpoints" / "step-00000003")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    agent_ppo(calculator_model, questions, out, *args)
    assert "resuming at step 2" in capsys.readouterr().out
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)


def test_turn_rewards_are_ppos():
    from trainer_lib.stages.training.grpo import GRPOConfig
    from trainer_lib.stages.training.ppo import PPOConfig

    base = ["model.path=m", "data.path=d", "output_dir=o", *AGENT_GRPO, "env.reward=turns"]
    assert load_config(PPOConfig, None, base).env.reward == "turns"
    with pytest.raises(ConfigError, match="env.reward=turns: rewards on each turn's last token are PPO's"):
        load_config(GRPOConfig, None, base)
    with pytest.raises(ConfigError, match="env.class with objective=nlpo"):
        load_config(PPOConfig, None, [*base, "objective=nlpo"])
