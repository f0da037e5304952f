"""The shared-base model of multi-adapter RL: each role computes what its separate model would."""

import pytest
import torch

from tests.stages.training.rl_helpers import LENGTH_REWARD, write_reward_adapter
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError


@pytest.fixture(scope="module")
def reward_adapter(tiny_model_dir, tmp_path_factory):
    return write_reward_adapter(tiny_model_dir, tmp_path_factory.mktemp("rm_adapter"))


def _config(tiny_model_dir, *extra):
    from trainer_lib.stages.training.ppo import PPOConfig

    return load_config(
        PPOConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            "data.path=unused.jsonl",
            "output_dir=/tmp/x",
            f"reward.functions={LENGTH_REWARD}",
            *extra,
        ],
    )


def _shared(tiny_model_dir, reward_adapter, with_value=True):
    from trainer_lib.config import EngineConfig
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.models import multi_adapter

    cfg = _config(tiny_model_dir, "lora.r=4", "multi_adapter=true", f"reward.model_path={reward_adapter}")
    strategy = DeepSpeedStrategy(EngineConfig(), 1)
    strategy.setup_distributed()  # (where the stages build it: the strategy knows its device)
    return multi_adapter.build(cfg, strategy, with_value=with_value)


def test_roles_match_their_separate_models(tiny_model_dir, reward_adapter):
    """Reward view = the LoRA reward model loaded on its own; reference = the base; the policy adapter
    is active again after every role switch, and the trainable set (policy, value, value head) survives."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    shared = _shared(tiny_model_dir, reward_adapter)
    model = shared.model
    with torch.no_grad():  # a policy that differs from the base
        for name, param in model.named_parameters():
            if "lora_B.default" in name:
                param.normal_(0, 0.5)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".default." in n or ".value." in n or n.startswith("value_head.") for n in trainable)

    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]])
    backbone = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    separate = PeftModel.from_pretrained(backbone, reward_adapter)
    separate.config.pad_token_id = 0
    with torch.no_grad():
        expected = separate(input_ids=ids, attention_mask=mask).logits
        policy = model(input_ids=ids, attention_mask=mask).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(shared.reward_model()(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-5)
    assert torch.allclose(shared.reference()(input_ids=ids, attention_mask=mask).logits, base, atol=1e-5)
    assert not torch.allclose(policy, base, atol=1e-3)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, policy)
    assert {name for name, p in model.named_parameters() if p.requires_grad} == trainable


def test_value_starts_from_the_reward_model_and_groups_split_the_learning_rates(tiny_model_dir, reward_adapter):
    from trainer_lib.models.multi_adapter import param_group
    from trainer_lib.rl.rollout import Rollout

    shared = _shared(tiny_model_dir, reward_adapter)
    assert torch.equal(shared.model.value_head.weight, shared.model.reward_head.weight)
    prompt = torch.tensor([[5, 6, 7]])
    response = torch.tensor([[8, 9]])
    rollout = Rollout(prompt, torch.ones_like(prompt), response, torch.ones_like(response), ["x"], [True])
    with torch.no_grad():
        values = shared.token_values(rollout)
        full = torch.cat([prompt, response], 1)
        # the value at the last prompt token = the reward model's score of the prompt alone, as for a separate critic
        score = shared.reward_model()(input_ids=full[:, :3], attention_mask=torch.ones(1, 3, dtype=torch.long)).logits
    assert values.shape == (1, 2) and torch.allclose(values[0, 0], score[0, 0], atol=1e-5)
    groups = {name: param_group(name, 1e-3, 5e-4) for name, p in shared.model.named_parameters() if p.requires_grad}
    assert {g for g in groups.values()} == {("default", 1e-3), ("value", 5e-4)}
    assert groups["value_head.weight"] == ("value", 5e-4)


def test_multi_adapter_settings_are_validated(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"multi_adapter: needs lora.r > 0"):
        _config(tiny_model_dir, "multi_adapter=true")
    with pytest.raises(ConfigError, match=r"multi_adapter: not supported with engine.zero_stage=3"):
        _config(tiny_model_dir, "multi_adapter=true", "lora.r=4", "engine.zero_stage=3")
    with pytest.raises(ConfigError, match=r"engine.gradient_checkpointing: not supported with multi_adapter"):
        _config(tiny_model_dir, "multi_adapter=true", "lora.r=4", "engine.gradient_checkpointing=true")
    assert _config(tiny_model_dir, "multi_adapter=true", "lora.r=4", "engine.zero_stage=2").multi_adapter
