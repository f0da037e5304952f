"""A Qwen2-style decoder (biased q/k/v projections, tied embeddings) exports, and its INT8 holds."""

import json
import os

from tests.export.helpers import train_briefly
from trainer_lib.cli import main


def test_a_qwen2_model_exports_with_an_int8_that_holds(tiny_model_dir, tmp_path, capsys):
    import onnx
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "qwen2")
    tokenizer.save_pretrained(tmp_path / "qwen2")
    model_dir = train_briefly(str(tmp_path / "qwen2"), str(tmp_path / "trained"))
    out = tmp_path / "export"
    args = ["parity.num_prompts=4", "parity.max_new_tokens=4", "parity.latency_tokens=2", "fp16=false"]
    assert main(["export", f"model_path={model_dir}", f"output_dir={out}", *args]) == 0
    summary = json.loads((out / "export.json").read_text())
    assert sorted(summary["models"]) == ["fp32", "int8"] and summary["failed"] == {}
    assert summary["fp32_max_abs_diff"] < 1e-3 and summary["top1_agreement"]["int8"] >= 0.95
    graph = onnx.load(os.path.join(out, "onnx", "int8", "model.onnx"), load_external_data=False).graph
    (gather,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    (head,) = [n for n in graph.node if "logits" in n.output]
    assert head.op_type == "MatMulNBits" and head.input[1] == gather.input[0]  # one table for both
    added = {name for n in graph.node if n.op_type == "Add" for name in n.input}
    assert {"model.model.layers.0.self_attn.q_proj.bias", "model.model.layers.0.self_attn.v_proj.bias"} <= added
