"""LoRA on every linear layer (all-linear) and an adapter-only output (lora.merge=false)."""

import json
import os

import torch

from trainer_lib.cli import main
from trainer_lib.config import LoraConfig
from trainer_lib.models.load import apply_lora

EVERY_LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _kinds(module_names) -> set[str]:
    """``model.layers.0.mlp.up_proj`` -> ``up_proj``."""
    return {name.rsplit(".", 1)[-1] for name in module_names}


def test_all_linear_targets_every_linear_layer_but_the_head(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = apply_lora(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, target_modules=["all-linear"])
    )
    assert _kinds(model.peft_config["default"].target_modules) == EVERY_LINEAR
    adapted = {name.split(".lora_A")[0] for name, _ in model.named_parameters() if "lora_A" in name}
    assert len(adapted) == 2 * len(EVERY_LINEAR)  # every linear layer of both blocks
    assert _kinds(adapted) == EVERY_LINEAR  # and not lm_head


def test_unmerged_lora_saves_a_peft_adapter(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    assert (
        main(
            [
                "sft",
                f"model.path={tiny_model_dir}",
                f"data.path={chat_jsonl}",
                f"output_dir={out}",
                "max_steps=4",
                "batch_size=2",
                "lr=1e-2",
                "data.max_length=64",
                "save_steps=0",
                "lora.r=4",
                "lora.target_modules=all-linear",
                "lora.merge=false",
            ]
        )
        == 0
    )
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out))
    assert not os.path.exists(out / "model.safetensors")
    assert _kinds(json.loads((out / "adapter_config.json").read_text())["target_modules"]) == EVERY_LINEAR

    ids = torch.tensor([[5, 17, 42, 99, 7]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        base_logits = base(ids).logits
        tuned = PeftModel.from_pretrained(base, str(out)).eval()
        tuned_logits = tuned(ids).logits
    assert not torch.allclose(base_logits, tuned_logits, atol=1e-4)
