"""GRPO on a tiny model: a custom reward rises (also under DAPO, GSPO and REINFORCE++), metrics are
logged, resume is bit-exact."""

import json
import os
import shutil

import pytest
import torch

from tests.stages.training.rl_helpers import (
    LENGTH_REWARD,
    mean_sampled_reward,
    run_rl,
    weights,
    write_prompts,
    write_reward_adapter,
)
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("rl") / "prompts.jsonl")


def _grpo(model, data, out, *extra):
    run_rl("grpo", model, data, out, 3, *extra)


def test_grpo_raises_a_custom_reward(tiny_model_dir, prompts, tmp_path):
    out = tmp_path / "grpo"
    _grpo(tiny_model_dir, prompts, out, "max_steps=30", "lr=1e-2", "save_steps=0")
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["reward"] > train[0]["reward"]
    for key in (
        "reward",
        "rewards/reward",
        "kl",
        "entropy",
        "clip_fraction",
        "response_length",
        "generate_time",
        "generate_tokens_per_s",
        "train_time",
        "lr",
    ):
        assert key in train[-1], key
    assert json.loads((out / "summary.json").read_text())["steps"] == 30


@pytest.mark.parametrize(
    "keys",
    [
        # DAPO: clip-higher, token-level loss, overlong shaping, no KL term
        ("clip_high=0.28", "loss_aggregation=token", "overlong_buffer=4", "beta=0"),
        # GSPO: one ratio per completion; two mini-batches, so the second update is off-policy
        ("objective=gspo", "clip_low=0.003", "clip_high=0.004", "mini_batch_size=8"),
        # REINFORCE++: KL penalty in the token rewards, advantages normalized over the batch
        ("advantage=reinforce_pp",),
    ],
    ids=["dapo", "gspo", "reinforce_pp"],
)
def test_grpo_variants_raise_a_custom_reward(tiny_model_dir, prompts, tmp_path, keys):
    out = tmp_path / "run"
    _grpo(tiny_model_dir, prompts, out, "max_steps=30", "lr=1e-2", "save_steps=0", *keys)
    before, after = mean_sampled_reward(tiny_model_dir, prompts), mean_sampled_reward(out, prompts)
    assert after > before + 0.3, (before, after)
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert train[-1]["reward"] > train[0]["reward"]
    assert ("overlong_penalty" in train[-1]) == ("overlong_buffer=4" in keys)
    assert ("kl" in train[-1]) == ("beta=0" not in keys)
    if "mini_batch_size=8" in keys:  # the second mini-batch is off-policy: its ratios move, some are clipped
        assert max(r["clip_fraction"] for r in train) > 0


def _config_keys(model, data) -> list[str]:
    """The keys every GRPO/PPO config needs, for building configs without running them."""
    return [f"model.path={model}", f"data.path={data}", "output_dir=/tmp/x", f"reward.functions={LENGTH_REWARD}"]


def test_grpo_defaults_are_grpo(tiny_model_dir, prompts):
    """Without the new keys the stage is today's GRPO: symmetric clip, sequence mean, KL as a loss term."""
    from trainer_lib.losses import constant_normalized_sum, sequence_mean, token_mean
    from trainer_lib.stages.training.grpo import (
        GroupAdvantage,
        GRPOConfig,
        ReinforcePPAdvantage,
        advantage_estimator,
        token_aggregation,
    )

    base = _config_keys(tiny_model_dir, prompts)
    cfg = load_config(GRPOConfig, None, base)
    assert (cfg.objective, cfg.loss_aggregation, cfg.overlong_buffer) == ("grpo", "auto", 0)
    assert cfg.clip_range() == (0.2, 0.2) and token_aggregation(cfg) is sequence_mean
    estimator = advantage_estimator(cfg, strategy=None)
    assert isinstance(estimator, GroupAdvantage) and estimator.kl_coef == 0.04
    cfg = load_config(GRPOConfig, None, [*base, "advantage=dr_grpo", "epsilon=0.1", "clip_high=0.3"])
    assert token_aggregation(cfg).func is constant_normalized_sum and cfg.clip_range() == (0.1, 0.3)
    cfg = load_config(GRPOConfig, None, [*base, "advantage=reinforce_pp"])
    assert token_aggregation(cfg) is token_mean
    estimator = advantage_estimator(cfg, strategy=None)
    assert isinstance(estimator, ReinforcePPAdvantage) and estimator.kl_coef == 0.0
    for bad, message in [
        ("clip_high=0", "clip_low, clip_high: expected > 0"),
        ("overlong_buffer=65", "overlong_buffer: expected 0 to rollout.max_new_tokens"),
        ("objective=dapo", "objective: expected one of"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(GRPOConfig, None, [*base, bad])
    with pytest.raises(ConfigError, match="objective=gspo: needs one advantage per completion"):
        load_config(GRPOConfig, None, [*base, "objective=gspo", "advantage=reinforce_pp"])


def test_resume_is_bit_exact(tiny_model_dir, prompts, tmp_path, capsys):
    """RLOO under LoRA (reference = adapters off), 2 epochs of 2 mini-batches, running reward
    normalization: losing everything after the step-3 checkpoint and rerunning changes nothing."""
    out = tmp_path / "run"
    args = (
        "max_steps=5",
        "save_steps=3",
        "save_total_limit=0",
        "advantage=rloo",
        "lora.r=4",
        "lora.alpha=8",
        "ppo_epochs=2",
        "mini_batch_size=8",
        "reward.normalize=running",
        "lr=1e-2",
    )
    _grpo(tiny_model_dir, prompts, out, *args)
    reference = weights(out)
    reference_state = torch.load(
        out / "checkpoints" / "step-00000005" / "mp_rank_00_model_states.pt", weights_only=False
    )["rewards"]
    shutil.rmtree(out / "checkpoints" / "step-00000005")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    _grpo(tiny_model_dir, prompts, out, *args)
    assert "resuming at step 3" in capsys.readouterr().out
    resumed = weights(out)
    assert reference.keys() == resumed.keys()
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    state = torch.load(out / "checkpoints" / "step-00000005" / "mp_rank_00_model_states.pt", weights_only=False)[
        "rewards"
    ]
    assert state == reference_state and state["moments"]["count"] == 5 * 16
    key = "model.layers.0.self_attn.q_proj.weight"  # LoRA merged into the saved weights
    assert not torch.equal(weights(tiny_model_dir)[key], resumed[key])


def test_group_settings_are_validated(tiny_model_dir, prompts):
    base = _config_keys(tiny_model_dir, prompts)
    from trainer_lib.stages.training.grpo import GRPOConfig

    with pytest.raises(ConfigError, match="rollout.n: group methods need at least 2"):
        load_config(GRPOConfig, None, [*base, "rollout.n=1"])
    with pytest.raises(ConfigError, match="mini_batch_size: 5 does not divide the 32"):
        load_config(GRPOConfig, None, [*base, "mini_batch_size=5"])
    with pytest.raises(ConfigError, match="reward.functions: required"):
        load_config(GRPOConfig, None, base[:-1])
    with pytest.raises(ConfigError, match="advantage: expected one of"):
        load_config(GRPOConfig, None, [*base, "advantage=ppo"])
    cfg = load_config(GRPOConfig, None, [*base, "reward.functions=code_execution,my.mod:fn", "reward.weights=1,0.5"])
    assert cfg.reward.functions == ["code_execution", "my.mod:fn"] and cfg.reward.weights == [1.0, 0.5]


def test_a_missing_reward_function_fails_before_any_model_loads(prompts, tmp_path):
    """reward.functions is imported first: its typo is the error even when model.path is wrong too (a
    70B model is not loaded before the one-line error)."""
    from trainer_lib.errors import UserError
    from trainer_lib.rl.experience import start
    from trainer_lib.stages.training.grpo import GRPOConfig

    (tmp_path / "rw.py").write_text("def reward(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    base = [f"model.path={tmp_path / 'no_model'}", f"data.path={prompts}", f"output_dir={tmp_path / 'out'}"]
    cfg = load_config(GRPOConfig, None, [*base, f"reward.functions=accuracy_reward,{tmp_path / 'rw.py'}:rewrad"])
    with pytest.raises(UserError, match=r"reward.functions: .*rw.py:rewrad: module .* has no attribute 'rewrad'"):
        start(cfg)
    assert not (tmp_path / "out").exists()


def test_reward_functions_are_told_the_step(tiny_model_dir, prompts, tmp_path, monkeypatch):
    """A reward function written for TRL (``trainer_state`` keyword) sees each step's global_step and epoch."""
    log = tmp_path / "calls.jsonl"
    (tmp_path / "stepwise.py").write_text(
        "import json, os\n\n"
        "def reward(prompts, completions, trainer_state, **kwargs):\n"
        "    with open(os.environ['STEP_LOG'], 'a') as fh:\n"
        "        state = [trainer_state.global_step, trainer_state.epoch, trainer_state.max_steps]\n"
        "        fh.write(json.dumps(state) + '\\n')\n"
        "    return [float(len(c[0]['content']) < 8) for c in completions]\n"
    )
    monkeypatch.setenv("STEP_LOG", str(log))
    _grpo(
        tiny_model_dir,
        prompts,
        tmp_path / "out",
        "max_steps=3",
        "save_steps=0",
        "eval_steps=0",
        f"reward.functions={tmp_path / 'stepwise.py'}:reward",
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [[0, 0.0, 3], [1, 4 / 24, 3], [2, 8 / 24, 3]]  # 4 prompts a step of 24


def test_multi_adapter_grpo_scores_with_the_reward_adapter(tiny_model_dir, prompts, tmp_path):
    """multi_adapter=true, a LoRA reward model of the same base as the only reward: it scores through its
    adapter on the shared base (normalized with its stored statistics), the policy trains, the output is
    the merged policy alone."""
    reward_dir = write_reward_adapter(tiny_model_dir, tmp_path / "rm", reward_mean=0.0, reward_std=1.0)
    out = tmp_path / "grpo"
    _grpo(
        tiny_model_dir,
        prompts,
        out,
        "multi_adapter=true",
        "lora.r=4",
        "lora.alpha=8",
        "reward.functions=[]",
        f"reward.model_path={reward_dir}",
        "max_steps=3",
        "logging_steps=1",
        "lr=1e-2",
        "save_steps=0",
    )
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(r["kl"] >= 0 and "rewards/reward_model" in r for r in train) and train[-1]["kl"] > 0
    assert len({r["reward"] for r in train}) == 3  # the reward adapter scores each step's completions
    merged = weights(out)
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not any("lora" in k or "score" in k for k in merged) and not torch.equal(
        weights(tiny_model_dir)[key], merged[key]
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_truncated_importance_sampling_weighs_the_samplers_log_probs(tiny_model_dir, prompts, tmp_path, precision):
    """rollout.tis_cap: the loss is reweighted by min(pi_train / pi_rollout, cap) from the log-probs the sampler
    recorded. In fp32 the sampler (a KV-cached decode) and the trained forward agree, so the weights are 1; in
    bf16 their rounding differs, so the weights move off 1 and stay under the cap."""
    out = tmp_path / precision
    _grpo(
        tiny_model_dir,
        prompts,
        out,
        "max_steps=4",
        "logging_steps=2",
        "save_steps=0",
        "lr=1e-2",
        "rollout.tis_cap=2",
        f"engine.precision={precision}",
    )
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert len(train) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in train)
    gap, weight = max(r["rollout_logprob_gap"] for r in train), [r["tis_weight"] for r in train]
    if precision == "fp32":
        assert gap < 1e-4 and all(abs(w - 1) < 1e-3 for w in weight)
    else:
        assert gap > 1e-4 and all(0 < w <= 2 for w in weight)
    trained, start = weights(out), weights(tiny_model_dir)
    assert any(not torch.equal(trained[k].float(), start[k].float()) for k in start)  # the update happened


def test_tis_cap_is_validated(tiny_model_dir, prompts):
    from trainer_lib.stages.training.grpo import GRPOConfig
    from trainer_lib.stages.training.ppo import PPOConfig

    base = _config_keys(tiny_model_dir, prompts)
    with pytest.raises(ConfigError, match="rollout.tis_cap: expected 0 \\(off\\) or a cap >= 1, got 0.5"):
        load_config(GRPOConfig, None, [*base, "rollout.tis_cap=0.5"])
    with pytest.raises(ConfigError, match="rollout.tis_cap: truncated importance sampling is GRPO's"):
        load_config(PPOConfig, None, [*base, "rollout.tis_cap=2"])


def test_grpo_logs_its_samples_and_ends_its_heartbeat(tiny_model_dir, prompts, tmp_path):
    """samples.jsonl at each logging step: whole groups with the prompt, the completion, each source's reward
    and the group-normalized advantage; heartbeat.json says finished."""
    from trainer_lib.loop.heartbeat import run_state
    from trainer_lib.loop.samples import ROWS_PER_LOG

    out = tmp_path / "grpo"
    _grpo(tiny_model_dir, prompts, out, "max_steps=3", "logging_steps=2", "save_steps=0", "prompts_per_step=2")
    rows = [json.loads(line) for line in open(out / "samples.jsonl")]
    assert sorted({r["step"] for r in rows}) == [2, 3]  # logging steps, and the last
    questions = {json.loads(line)["prompt"][0]["content"] for line in open(prompts)}
    for step in (2, 3):
        mine = [r for r in rows if r["step"] == step]
        assert len(mine) == min(8, ROWS_PER_LOG) and {r["kind"] for r in mine} == {"rollout"}
        for group in (0, 1):
            members = [r for r in mine if r["group"] == group]
            assert len(members) == 4 and len({r["prompt"] for r in members}) == 1
            assert members[0]["prompt"].removeprefix("user: ") in questions
            rewards = [r["reward"] for r in members]
            # GRPO's advantage: (r - mean) / (std + eps) over the group (the sampled std, as losses.grpo_advantages)
            mean = sum(rewards) / 4
            std = (sum((x - mean) ** 2 for x in rewards) / 3) ** 0.5
            for row in members:
                assert row["rewards"] == {"reward": pytest.approx(row["reward"])}
                assert row["advantage"] == pytest.approx((row["reward"] - mean) / (std + 1e-4), abs=1e-3)
                assert isinstance(row["completion"], str) and row["length"] > 0
    heartbeat = json.loads((out / "heartbeat.json").read_text())
    assert heartbeat["state"] == "finished" and heartbeat["step"] == 3 and heartbeat["stage"] == "grpo"
    assert heartbeat["config"]["rollout.n"] == 4
    assert run_state(heartbeat, finished=False) == "finished"
