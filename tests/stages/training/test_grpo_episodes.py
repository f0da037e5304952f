"""GRPO on multi-turn episodes: a tiny model taught to call the calculator trains in a ToolEnvironment whose
answers accuracy_reward checks; the loss sees only the model's tokens; the episodes' statistics are logged;
resume is exact; the env keys are checked."""

import json
import os
import shutil

import pytest
import torch

from tests.rl.agent_helpers import AGENT_GRPO
from tests.stages.training.rl_helpers import weights
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def agent_grpo(model, data, out, *extra: str) -> None:
    """``posttrain grpo`` with :data:`AGENT_GRPO`'s settings, logging every step."""
    from trainer_lib.cli import main

    args = [
        "grpo",
        f"model.path={model}",
        f"data.path={data}",
        f"output_dir={out}",
        *AGENT_GRPO,
        "logging_steps=1",
        *extra,
    ]
    assert main(args) == 0


def test_grpo_trains_on_calculator_episodes_with_loss_on_the_model_tokens_only(
    calculator_model, questions, tmp_path, monkeypatch
):
    import trainer_lib.losses
    import trainer_lib.rl.rollout

    trained = []  # (the micro-batch, the mask its loss was averaged over)
    forward, sequence_mean = trainer_lib.rl.rollout.token_logprobs, trainer_lib.losses.sequence_mean

    def recording_forward(model, part, *args, **kwargs):
        if torch.is_grad_enabled():
            trained.append([part])
        return forward(model, part, *args, **kwargs)

    def recording_mean(values, mask):
        trained[-1].append(mask.detach().cpu())
        return sequence_mean(values, mask)

    monkeypatch.setattr(trainer_lib.rl.rollout, "token_logprobs", recording_forward)
    monkeypatch.setattr(trainer_lib.losses, "sequence_mean", recording_mean)
    out = tmp_path / "grpo"
    agent_grpo(calculator_model, questions, out, "max_steps=2", "save_steps=0", f"data.eval_path={questions}")

    assert len(trained) == 4  # 2 steps x 8 episodes / batch_size 4
    environment_tokens = 0
    for part, mask in trained:
        assert torch.equal(mask, part.action_mask.float())  # the loss sees the model's tokens only
        environment_tokens += int((part.response_mask.bool() & ~part.action_mask.bool()).sum())
        for row, trajectory in enumerate(part.episodes):
            on = [i for i, flag in enumerate(part.action_mask[row].tolist()) if flag]
            assert on == [i for start, stop in trajectory.turns for i in range(start, stop)]
    assert environment_tokens > 0  # the episodes had tool results in them

    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for key in (
        "episode/turns",
        "episode/tool_calls",
        "episode/valid_tool_call_rate",
        "episode/tool_errors",
        "episode/env_tokens",
        "episode/done_done",
        "episode/done_max_turns",
        "episode/done_max_total_tokens",
        "rewards/env",
        "rewards/accuracy_reward",
        "kl",
        "loss",
    ):
        assert key in train[-1], key
    assert all(r["episode/turns"] > 1 and r["episode/tool_calls"] > 0 for r in train)
    assert all(
        abs(sum(r[f"episode/done_{reason}"] for reason in ("done", "max_turns", "max_total_tokens")) - 1) < 1e-9
        for r in train
    )
    samples = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert {s["step"] for s in samples} == {1, 2}
    for sample in samples:
        # the environment's checker and the reward function judge the same final answer
        assert sample["rewards"]["env"] == sample["rewards"]["accuracy_reward"]
        assert sample["episode"]["done_reason"] in ("done", "max_turns", "max_total_tokens")
        assert sample["completion"] in sample["episode"]["transcript"]
    assert any("tool: " in s["episode"]["transcript"] for s in samples)
    assert len({s["reward"] for s in samples}) > 1  # the groups' rewards differ: advantages are not all 0
    # the held-out evaluation plays greedy episodes and scores them the same way
    evaluation = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "eval"][-1]
    assert 0 <= evaluation["rewards/env"] <= 1 and evaluation["rewards/env"] == evaluation["rewards/accuracy_reward"]


def test_resume_of_an_episode_run_is_exact(calculator_model, questions, tmp_path, capsys):
    """The episodes are seeded per step and the calculator is deterministic: losing the last checkpoint and
    rerunning gives the same weights."""
    out = tmp_path / "run"
    args = ("max_steps=3", "save_steps=2", "save_total_limit=0")
    agent_grpo(calculator_model, questions, out, *args)
    reference = weights(out)
    shutil.rmtree(out / "checkpoints" / "step-00000003")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    agent_grpo(calculator_model, questions, out, *args)
    assert "resuming at step 2" in capsys.readouterr().out
    resumed = weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)


def test_env_keys_are_checked(calculator_model, questions):
    from trainer_lib.stages.training.grpo import GRPOConfig
    from trainer_lib.stages.training.ppo import PPOConfig

    base = [f"model.path={calculator_model}", f"data.path={questions}", "output_dir=/tmp/x"]
    cfg = load_config(GRPOConfig, None, [*base, "env.class=tools", "env.tools=calculator"])  # no reward.functions
    assert (cfg.env.class_, cfg.env.reward, cfg.env.max_turns) == ("tools", "final", 4)
    for keys, message in [
        (["env.class=tools"], "env.tools: env.class=tools needs at least one tool"),
        (["env.class=tools", "env.tools=abacus"], "env.tools: expected some of calculator, python, search"),
        (["env.class=tools", "env.tools=search"], "env.corpus: the search tool needs its documents"),
        (["env.class=mymodule"], "env.class: expected tools or package.module:Class"),
        (["env.class=m:C", "env.tools=calculator"], "env.tools: the built-in tools are for env.class=tools"),
        (["env.class=tools", "env.tools=calculator", "env.gamma=2"], "env: expected max_turns >= 1"),
        (["env.class=tools", "env.tools=calculator", "env.reward=mean"], "env.reward: expected one of"),
        (["env.class=tools", "env.tools=calculator", "rollout.stop=x"], "rollout.stop: not supported with env"),
        (["env.class=tools", "env.tools=calculator", "overlong_buffer=4"], "overlong_buffer: measures one"),
        ([], "reward.functions: required .* or env.class"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(GRPOConfig, None, [*base, *keys])
    # PPO plays episodes too (tests/stages/training/test_ppo_episodes.py)
    assert load_config(PPOConfig, None, [*base, "env.class=tools", "env.tools=calculator"]).env.class_ == "tools"


def test_a_bad_environment_fails_before_any_model_loads(questions, tmp_path):
    """env.class is built once when the stage starts: a module that is not there, or a setting the class
    does not take, is a one-line error naming the key."""
    from trainer_lib.rl.experience import build_episodes
    from trainer_lib.stages.training.grpo import GRPOConfig

    base = [f"model.path={tmp_path / 'no_model'}", f"data.path={questions}", f"output_dir={tmp_path / 'out'}"]
    cfg = load_config(GRPOConfig, None, [*base, "env.class=no_such_module:Env"])
    with pytest.raises(ConfigError, match="env.class: cannot import module 'no_such_module'"):
        build_episodes(cfg)
    cfg = load_config(GRPOConfig, None, [*base, "env.class=tools", "env.tools=calculator", "env.settings.timeout_s=3"])
    with pytest.raises(ConfigError, match="env.settings.timeout_s is not a setting of .*ToolEnvironment"):
        build_episodes(cfg)
    cfg = load_config(GRPOConfig, None, [*base, "env.class=tools", "env.tools=calculator", "env.checker=my:fn"])
    with pytest.raises(Exception, match="my:fn: cannot import module 'my'"):
        build_episodes(cfg)


@pytest.mark.parametrize(
    "extra",
    [
        ("lora.r=4", "lora.alpha=8"),
        ("multi_adapter=true", "lora.r=4", "lora.alpha=8"),
        ("buffer.mode=uniform", "buffer.dynamic_sampling=true"),
    ],
    ids=["lora", "multi_adapter", "dynamic_sampling"],
)
def test_episodes_train_under_lora_multi_adapter_and_dynamic_sampling(calculator_model, questions, tmp_path, extra):
    """What single-turn GRPO offers works on episodes too: LoRA (the reference is the adapters off),
    multi_adapter (one base for every role), a live prompt pool with DAPO's dynamic sampling (groups whose
    episodes all earned the same reward are dropped and refilled). Each run plays multi-turn episodes with
    tool calls and changes the weights. (``--nproc 2``: the test below.)"""
    out = tmp_path / "grpo"
    agent_grpo(calculator_model, questions, out, "max_steps=2", "save_steps=0", *extra)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["episode/turns"] > 1 and r["episode/env_tokens"] > 0 for r in train)  # the environment answered
    assert sum(r["episode/tool_calls"] for r in train) > 0
    if "buffer.dynamic_sampling=true" in extra:
        assert all("dynamic_sampling/dropped_groups" in r for r in train)
    trained, start = weights(out), weights(calculator_model)
    assert not any("lora" in k for k in trained)  # adapters merged into the saved policy
    assert any(not torch.equal(trained[k], start[k]) for k in start)


@pytest.mark.distributed
@pytest.mark.extended
def test_episodes_train_on_two_ranks(calculator_model, questions, tmp_path):
    """--nproc 2: each rank plays its share of the step's episodes (one prompt's group each) and the update
    averages over both; the logged episode statistics are the whole step's."""
    from tests.conftest import clean_env
    from tests.engine.layout_runs import run_stage

    out = tmp_path / "grpo"
    args = [f"model.path={calculator_model}", f"data.path={questions}", f"output_dir={out}", *AGENT_GRPO]
    run_stage("grpo", [*args, "logging_steps=1", "max_steps=2", "save_steps=2"], clean_env())
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["episode/turns"] > 1 and r["episode/env_tokens"] > 0 for r in train)
    marker = json.loads((out / "checkpoints" / "step-00000002" / "COMPLETE").read_text())
    assert marker["world_size"] == 2  # two ranks trained (and both ranks' loop states were saved)
    assert all((out / "checkpoints" / "step-00000002" / f"loop_state_rank{r}.json").is_file() for r in (0, 1))
    trained, start = weights(out), weights(calculator_model)
    assert any(not torch.equal(trained[k], start[k]) for k in start)
