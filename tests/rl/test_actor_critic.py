"""The two model layouts of the RL stages: the same methods, and an update trains exactly the roles it should."""

import pytest
import torch

from tests.stages.training.rl_helpers import LENGTH_REWARD, write_reward_adapter
from trainer_lib.config import load_config
from trainer_lib.rl.actor_critic import SeparateModels, SharedBaseModels, build_models

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def reward_adapter(tiny_model_dir, tmp_path_factory):
    return write_reward_adapter(tiny_model_dir, tmp_path_factory.mktemp("rm_adapter"))


def _public(cls) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_both_layouts_offer_the_same_methods():
    assert _public(SeparateModels) == _public(SharedBaseModels)
    assert {"actor_logprobs", "reference_logprobs", "token_values", "update", "log_extra", "keep_policy_only"} <= (
        _public(SeparateModels)
    )


def _models(tiny_model_dir, tmp_path, *extra):
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.stages.training.ppo import PPOConfig

    cfg = load_config(
        PPOConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            "data.path=unused.jsonl",
            f"output_dir={tmp_path}",
            f"reward.functions={LENGTH_REWARD}",
            "lora.r=4",
            "prompts_per_step=1",
            "rollout.n=2",
            "batch_size=2",
            "lr=1e-2",
            "critic_lr=1e-2",
            *extra,
        ],
    )
    strategy = DeepSpeedStrategy(cfg.engine_for(1), micro_batch_size=cfg.batch_size, seed=0)
    strategy.setup_distributed()
    from trainer_lib.models.load import load_tokenizer

    return build_models(cfg, strategy, load_tokenizer(cfg.model), 4, use_reference=True, with_critic=True)


def _rollout():
    from trainer_lib.rl.rollout import Rollout

    prompt = torch.tensor([[5, 6, 7], [0, 8, 9]])
    response = torch.tensor([[10, 11, 12], [13, 14, 0]])
    return Rollout(prompt, (prompt > 0).long(), response, (response > 0).long(), ["a", "b"], [True, False])


def _snapshot(models) -> dict[str, torch.Tensor]:
    """Every parameter of every model the layout holds, by role and name."""
    modules = {"actor": models.actor, **{k: e.module for k, e in models.extra_engines.items()}}
    return {f"{role}:{n}": p.detach().clone() for role, m in modules.items() for n, p in m.named_parameters()}


def _changed(models, train_actor: bool) -> set[str]:
    """Names of the parameters one update changes (bitwise)."""
    from trainer_lib.rl.rollout import token_logprobs

    rollout = _rollout()
    before = _snapshot(models)
    logprobs, _ = token_logprobs(models.actor_engine, rollout, with_entropy=False)
    policy_loss = -logprobs.sum() / rollout.response_mask.sum()
    models.update(policy_loss, lambda: 0.5 * ((models.token_values(rollout) - 1.0) ** 2).mean(), train_actor)
    after = _snapshot(models)
    return {name for name in before if not torch.equal(before[name], after[name])}


def _role(name: str) -> str:
    """The role a parameter of either layout belongs to ("default" is PEFT's first adapter)."""
    model, _, name = name.partition(":")
    if model == "critic":
        return "value" if ".default." in name else "frozen base"
    if ".value." in name or name.startswith("value_head."):
        return "value"
    if ".reward." in name or name.startswith("reward_head."):
        return "reward"
    return "policy" if ".default." in name else "frozen base"


def test_separate_engines_step_the_actor_only_when_it_trains(tiny_model_dir, tmp_path):
    models = _models(tiny_model_dir, tmp_path)
    try:
        assert isinstance(models, SeparateModels) and set(models.extra_engines) == {"critic"}
        assert models.reference_logprobs(_rollout(), 1.0, 2).shape == (2, 3)  # LoRA: the actor, adapters off
        both = _changed(models, train_actor=True)
        assert {_role(n) for n in both} == {"policy", "value"}  # the frozen bases unchanged
        frozen_actor = _changed(models, train_actor=False)
        assert frozen_actor and {_role(n) for n in frozen_actor} == {"value"}
        assert set(models.log_extra()) == {"critic_lr", "critic_grad_norm"}
    finally:
        models.rewards.close()


def test_shared_base_trains_the_policy_and_value_adapters_and_nothing_else(tiny_model_dir, tmp_path, reward_adapter):
    models = _models(tiny_model_dir, tmp_path, "multi_adapter=true", f"reward.model_path={reward_adapter}")
    try:
        assert isinstance(models, SharedBaseModels) and models.extra_engines == {}
        both = _changed(models, train_actor=True)
        assert {_role(n) for n in both} == {"policy", "value"}  # the base and the reward adapter unchanged
        # Adam's moments would move the policy adapter again: its group's lr is 0 for this step
        frozen_actor = _changed(models, train_actor=False)
        assert frozen_actor and {_role(n) for n in frozen_actor} == {"value"}
        assert set(models.log_extra()) == {"critic_lr"}
        models.keep_policy_only()
        assert list(models.actor.peft_config) == ["default"]
    finally:
        models.rewards.close()
