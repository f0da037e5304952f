"""Where loaded weights go (models/load.py Placement), in one process: under ZeRO-3, set here by a user's
DeepSpeed file, models are built partitioned and hold the checkpoint's weights; reward models and LoRA on
top train; names transformers must convert go through its own ZeRO-3 loading. Two processes:
test_load_zero3.py."""

import json
import os
import shutil

import pytest
import torch


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    """A one-process strategy whose ZeRO-3 comes from ``engine.deepspeed_config`` (engine.zero_stage stays 0)."""
    from trainer_lib.config import EngineConfig
    from trainer_lib.engine.strategy import DeepSpeedStrategy

    path = tmp_path_factory.mktemp("ds") / "zero3.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}))
    strategy = DeepSpeedStrategy(EngineConfig(deepspeed_config=str(path)), micro_batch_size=1)
    strategy.setup_distributed()
    return strategy


def _gathered(strategy, model) -> dict:
    out = {}
    for name, param in model.named_parameters():
        with strategy.gathered([param]):
            out[name] = param.detach().clone()
    return out


def test_zero3_builds_the_model_partitioned_with_the_checkpoints_weights(zero3, tiny_model_dir):
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import load_causal_lm

    placement = zero3.placement()
    assert zero3.zero_stage == 3 and placement.zero3_config == zero3.ds_config(train=True)
    assert zero3.placement(train=False).zero3_config == zero3.ds_config(train=False)
    rng = torch.get_rng_state()
    model = load_causal_lm(ModelConfig(path=tiny_model_dir), placement=placement)
    assert torch.equal(torch.get_rng_state(), rng)  # nothing to initialise: nothing drawn
    assert not is_deepspeed_zero3_enabled()  # only while loading: later from_pretrained calls load whole
    assert not model.training and all(p.numel() == 0 and p.ds_numel > 0 for p in model.parameters())
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = dict(plain.named_parameters())
    loaded = _gathered(zero3, model)
    assert loaded.keys() == expected.keys()
    for name, value in loaded.items():
        assert torch.equal(value, expected[name]), name
    engine = zero3.prepare(model, lr=1e-3, weight_decay=0.1, total_steps=1)
    # 2-D weights decay, norms do not, as without ZeRO-3 (a partition is flat: the whole shape counts)
    assert {g["weight_decay"] for g in engine.optimizer.optimizer.param_groups} == {0.0, 0.1}


def test_zero3_reward_model_with_lora_loads_partitioned_and_trains(zero3, tiny_model_dir):
    from trainer_lib.config import LoraConfig, ModelConfig
    from trainer_lib.models.heads import apply_reward_lora, load_reward_model

    cfg = ModelConfig(path=tiny_model_dir)
    torch.manual_seed(7)
    plain = dict(load_reward_model(cfg, pad_token_id=0).named_parameters())
    after_plain = torch.get_rng_state()
    torch.manual_seed(7)
    model = load_reward_model(cfg, pad_token_id=0, placement=zero3.placement())
    # the causal LM's body, its lm_head not read, and the new score head drawn as a plain load draws it
    assert torch.equal(torch.get_rng_state(), after_plain)
    loaded = _gathered(zero3, model)
    assert loaded.keys() == plain.keys()
    for name, value in loaded.items():
        assert torch.equal(value, plain[name]), name
    model = apply_reward_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    engine = zero3.prepare(model, lr=1e-2, weight_decay=0.0, total_steps=1)
    ids = torch.tensor([[5, 6, 7, 8]])
    loss = engine(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().pow(2).mean()
    zero3.backward(loss, engine)
    zero3.optimizer_step(engine)
    assert zero3.grad_norm(engine) > 0


def test_names_transformers_must_map_load_through_its_own_zero3_path(zero3, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import load_causal_lm

    renamed = tmp_path / "renamed"
    shutil.copytree(tiny_model_dir, renamed)
    tensors = load_file(renamed / "model.safetensors")
    tensors["model.final_norm.weight"] = tensors.pop("model.norm.weight")  # no longer the model's name
    save_file(tensors, renamed / "model.safetensors", metadata={"format": "pt"})
    model = load_causal_lm(ModelConfig(path=str(renamed)), placement=zero3.placement())
    assert all(hasattr(p, "ds_id") for p in model.parameters())  # partitioned all the same
    embed = _gathered(zero3, model.model.embed_tokens)["weight"]
    assert torch.equal(embed, tensors["model.embed_tokens.weight"])


def test_without_zero3_placement_loads_as_before(tiny_model_dir):
    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import Placement, load_causal_lm

    model = load_causal_lm(ModelConfig(path=tiny_model_dir), placement=Placement())
    assert all(p.device.type == "cpu" and p.numel() > 0 for p in model.parameters())
    assert not os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
