"""The streaming HF writer: the same files and tensors as save_pretrained / merge_and_unload, in shards."""

import contextlib
import copy
import json
import os

import pytest
import torch

from trainer_lib.config import LoraConfig
from trainer_lib.models.load import apply_lora
from trainer_lib.models.save import save_hf_model


def no_gather(tensors):
    return contextlib.nullcontext()


def tensors_of(directory) -> dict:
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out


def assert_same_weights(ours, reference):
    a, b = tensors_of(ours), tensors_of(reference)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0, msg=key)


@pytest.fixture
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("tied", [True, False])
def test_shards_and_index_match_save_pretrained(tiny, tmp_path, tied):
    from transformers import AutoModelForCausalLM

    model, tokenizer = tiny
    if not tied:  # an untied head: lm_head.weight is a tensor of its own and is saved
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() + 1.0)
    save_hf_model(
        model,
        tokenizer,
        str(tmp_path / "ours"),
        gather=no_gather,
        is_writer=True,
        extra_files={"note.txt": "hi"},
        max_shard_size="40KB",
    )
    model.save_pretrained(tmp_path / "reference", max_shard_size="40KB")

    files = sorted(os.listdir(tmp_path / "ours"))
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) >= 3 and "note.txt" in files and "tokenizer.json" in files
    assert set(os.listdir(tmp_path / "reference")) <= set(files)
    ours = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    reference = json.loads((tmp_path / "reference" / "model.safetensors.index.json").read_text())
    assert ours == reference
    assert ("lm_head.weight" in ours["weight_map"]) == (not tied)
    assert_same_weights(tmp_path / "ours", tmp_path / "reference")
    assert json.loads((tmp_path / "ours" / "config.json").read_text()) == json.loads(
        (tmp_path / "reference" / "config.json").read_text()
    )
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, atol=0, rtol=0, msg=name)


def test_one_shard_is_model_safetensors(tiny, tmp_path):
    model, tokenizer = tiny
    save_hf_model(model, tokenizer, str(tmp_path / "ours"), gather=no_gather, is_writer=True)
    model.save_pretrained(tmp_path / "reference")
    assert "model.safetensors" in os.listdir(tmp_path / "ours")
    assert "model.safetensors.index.json" not in os.listdir(tmp_path / "ours")
    assert_same_weights(tmp_path / "ours", tmp_path / "reference")


def trained_lora(model, **extra):
    """LoRA adapters with non-zero B (a fresh one is zero, and merging it would prove nothing)."""
    peft = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]), **extra)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in peft.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return peft


def test_lora_merged_equals_merge_and_unload(tiny, tmp_path):
    model, tokenizer = tiny
    peft = trained_lora(model)
    live = {k: v.clone() for k, v in peft.state_dict().items()}
    save_hf_model(peft, tokenizer, str(tmp_path / "ours"), gather=no_gather, is_writer=True, max_shard_size="40KB")
    assert all(torch.equal(live[k], v) for k, v in peft.state_dict().items())  # the live model is untouched
    copy.deepcopy(peft).merge_and_unload().save_pretrained(tmp_path / "reference", max_shard_size="40KB")
    assert_same_weights(tmp_path / "ours", tmp_path / "reference")
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    assert index == json.loads((tmp_path / "reference" / "model.safetensors.index.json").read_text())
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_lora_reward_model_with_saved_head(tiny_model_dir, tmp_path):
    """modules_to_save: the trained copy of the head is written under the head's own name."""
    from transformers import AutoModelForSequenceClassification

    from trainer_lib.models.heads import HEAD_MODULES

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    peft = trained_lora(model, task_type="SEQ_CLS", modules_to_save=HEAD_MODULES)
    save_hf_model(peft, None, str(tmp_path / "ours"), gather=no_gather, is_writer=True)
    copy.deepcopy(peft).merge_and_unload().save_pretrained(tmp_path / "reference")
    assert "score.weight" in tensors_of(tmp_path / "ours")
    assert_same_weights(tmp_path / "ours", tmp_path / "reference")


def test_lora_adapter_only(tiny, tmp_path):
    model, tokenizer = tiny
    peft = trained_lora(model)
    save_hf_model(peft, tokenizer, str(tmp_path / "ours"), gather=no_gather, is_writer=True, merge_lora=False)
    peft.save_pretrained(tmp_path / "reference")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(tmp_path / "ours"))
    assert_same_weights(tmp_path / "ours", tmp_path / "reference")


def test_not_the_writer_writes_nothing(tiny, tmp_path):
    model, tokenizer = tiny
    save_hf_model(model, tokenizer, str(tmp_path / "ours"), gather=no_gather, is_writer=False, max_shard_size="40KB")
    assert not (tmp_path / "ours").exists()


def test_fused_experts_are_saved_under_their_checkpoint_names(tmp_path):
    """Mixtral's experts live fused in the model and unfused in its checkpoints: converted back per shard."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(
        MixtralConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
        )
    )
    save_hf_model(model, None, str(tmp_path / "ours"), gather=no_gather, is_writer=True, max_shard_size="20KB")
    model.save_pretrained(tmp_path / "reference", max_shard_size="20KB")
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in tensors_of(tmp_path / "ours")
    assert_same_weights(tmp_path / "ours", tmp_path / "reference")
    loaded = MixtralForCausalLM.from_pretrained(tmp_path / "ours")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, atol=0, rtol=0, msg=name)


def test_saved_parameters_counts_the_headers(tiny, tmp_path):
    """The count from the safetensors headers of a sharded save equals the model's own (tied weights once)."""
    from trainer_lib.models.save import saved_parameters

    model, tokenizer = tiny
    save_hf_model(model, tokenizer, str(tmp_path / "m"), gather=no_gather, is_writer=True, max_shard_size="40KB")
    assert len([n for n in os.listdir(tmp_path / "m") if n.endswith(".safetensors")]) > 1
    assert saved_parameters(str(tmp_path / "m")) == sum(p.numel() for p in model.parameters())
    assert saved_parameters(str(tmp_path / "missing")) == 0
