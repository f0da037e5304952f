"""Helpers for the serving tests: an export directory from a tiny model, a started server, PyTorch's answer."""

from __future__ import annotations

import json
import os

import pytest


def make_export_dir(model_dir: str, out_dir: str) -> str:
    """The export stage's layout: onnx/{fp32,int8,fp16}/model.onnx(.data), tokenizer/, parity.json, export.json
    (with its ``models`` map)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.export.onnx_decoder import export_decoder
    from trainer_lib.export.quantize import quantize_int8

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    fp32 = os.path.join(out_dir, "onnx", "fp32", "model.onnx")
    export_decoder(model, fp32)
    quantize_int8(fp32, os.path.join(out_dir, "onnx", "int8", "model.onnx"))
    write_fp16(fp32, os.path.join(out_dir, "onnx", "fp16", "model.onnx"))
    tokenizer.save_pretrained(os.path.join(out_dir, "tokenizer"))
    with open(os.path.join(out_dir, "parity.json"), "w") as f:
        json.dump({"note": "written by tests/serving/helpers.py; no parity was measured"}, f)
    with open(os.path.join(out_dir, "export.json"), "w") as f:  # the export stage's ids, written last
        json.dump(
            {
                "eos_token_id": model.generation_config.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id,
                "models": {name: f"onnx/{name}/model.onnx" for name in ("fp32", "int8", "fp16")},
            },
            f,
        )
    return out_dir


def write_fp16(fp32_path: str, fp16_path: str) -> None:
    """An FP16 copy of the FP32 decoder with the export's interface: float16 weights and KV cache, float32
    logits (onnxruntime's float16 converter; the export stage exports a half-precision model on a GPU)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    os.makedirs(os.path.dirname(fp16_path), exist_ok=True)
    fp16 = convert_float_to_float16(onnx.load(fp32_path), keep_io_types=["logits"])
    onnx.save(fp16, fp16_path, save_as_external_data=True, location="model.onnx.data")


def start_server(repository: str, **kwargs):
    """A started TritonServer, or a skip naming why the server could not start."""
    from trainer_lib.serving.server import TritonServer, TritonServerError

    server = TritonServer(repository, **kwargs)
    try:
        return server.start(timeout_s=60)
    except TritonServerError as exc:
        pytest.skip(f"tritonserver cannot start: {exc}")


def torch_greedy(model_dir: str, prompt: str, max_new_tokens: int) -> str:
    """PyTorch's greedy completion of ``prompt`` (raw text), decoded without special tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
