"""The FP32 ONNX decoder: its interface, and logits equal to PyTorch's (within 1e-3) at prefill,
at a cached decode step, with an empty past and with a left-padded batch; and the same export of a
half-precision model (the FP16 variant on CUDA machines)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import DynamicCache

from tests.export.helpers import prompt_ids

TOL = 1e-3


@pytest.fixture(scope="module")
def session(exported):
    return ort.InferenceSession(f"{exported.fp32}/model.onnx", providers=["CPUExecutionProvider"])


def run_onnx(session, ids, mask, positions, past):
    names = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    feed = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **dict(zip(names, past))}
    logits, *present = session.run(None, feed)
    return logits, present


def empty_past(exported, batch):
    layout = exported.layout
    shape = (batch, layout["num_kv_heads"], 0, layout["head_dim"])
    return [np.zeros(shape, np.float32) for _ in range(2 * layout["num_layers"])]


def run_torch(model, ids, mask, positions, cache):
    with torch.inference_mode():
        out = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(positions),
            past_key_values=cache,
            use_cache=True,
        )
    return out.logits.numpy()


def test_graph_interface(session, exported):
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    layers = exported.layout["num_layers"]
    assert list(inputs) == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *[f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")],
    ]
    assert list(outputs) == ["logits", *[f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]]
    assert inputs["input_ids"].type == inputs["attention_mask"].type == "tensor(int64)"
    assert inputs["input_ids"].shape == ["batch", "sequence"]
    assert inputs["attention_mask"].shape == ["batch", "total_sequence"]
    assert inputs["past_key_values.0.key"].shape == [
        "batch",
        exported.layout["num_kv_heads"],
        "past_sequence",
        exported.layout["head_dim"],
    ]
    assert inputs["past_key_values.0.key"].type == outputs["logits"].type == "tensor(float)"
    assert outputs["logits"].shape[:2] == ["batch", "sequence"]
    assert outputs["logits"].shape[2] == exported.model.config.vocab_size


def test_prefill_and_cached_decode_match_pytorch(session, exported):
    ids = np.array([prompt_ids(exported.tokenizer)[0]], dtype=np.int64)
    mask, positions = np.ones_like(ids), np.arange(ids.shape[1])[None]
    cache = DynamicCache(config=exported.model.config)
    expected = run_torch(exported.model, ids, mask, positions, cache)
    logits, present = run_onnx(session, ids, mask, positions, empty_past(exported, 1))
    assert logits.shape == expected.shape
    assert np.abs(logits - expected).max() < TOL
    assert present[0].shape[2] == ids.shape[1]

    for step in range(3):  # cached single-token steps, each on the graph's own presents
        next_ids = expected[:, -1:].argmax(-1)
        mask = np.ones((1, mask.shape[1] + 1), dtype=np.int64)
        positions = np.array([[mask.shape[1] - 1]])
        expected = run_torch(exported.model, next_ids, mask, positions, cache)
        logits, present = run_onnx(session, next_ids, mask, positions, present)
        assert np.abs(logits - expected).max() < TOL, f"decode step {step}"
    assert present[0].shape[2] == mask.shape[1]


def test_left_padded_batch_matches_pytorch_and_unpadded_prompts(session, exported):
    short, long = prompt_ids(exported.tokenizer)[1], prompt_ids(exported.tokenizer)[3]
    assert len(short) < len(long)
    width = len(long)
    ids = np.zeros((2, width), dtype=np.int64)
    mask = np.zeros((2, width), dtype=np.int64)
    for row, prompt in enumerate((short, long)):
        ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
    positions = np.maximum(mask.cumsum(1) - 1, 0)
    cache = DynamicCache(config=exported.model.config)
    expected = run_torch(exported.model, ids, mask, positions, cache)
    logits, present = run_onnx(session, ids, mask, positions, empty_past(exported, 2))
    real = mask.astype(bool)
    assert np.abs(logits[real] - expected[real]).max() < TOL
    # padding must not change a prompt's result: compare with each prompt run alone
    for row, prompt in enumerate((short, long)):
        alone = run_torch(
            exported.model,
            np.array([prompt]),
            np.ones((1, len(prompt)), dtype=np.int64),
            np.arange(len(prompt))[None],
            DynamicCache(config=exported.model.config),
        )
        assert np.abs(logits[row, -1] - alone[0, -1]).max() < TOL

    next_ids = expected[:, -1:].argmax(-1)
    mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
    positions = mask.sum(1, keepdims=True) - 1
    expected = run_torch(exported.model, next_ids, mask, positions, cache)
    logits, _ = run_onnx(session, next_ids, mask, positions, present)
    assert np.abs(logits - expected).max() < TOL


def test_weights_live_in_external_data(exported):
    import os

    assert sorted(os.listdir(exported.fp32)) == ["model.onnx", "model.onnx.data"]
    assert os.path.getsize(f"{exported.fp32}/model.onnx.data") > 10 * os.path.getsize(f"{exported.fp32}/model.onnx")


def test_half_precision_export_frees_the_model(trained_model_dir, exported, tmp_path):
    """What the stage runs on a CUDA machine for FP16 (there on the GPU, here on CPU): the model in
    half precision exported as it is; and afterwards nothing of the export holds its weights."""
    import gc
    import weakref

    from transformers import AutoModelForCausalLM

    from trainer_lib.export import parity
    from trainer_lib.export.onnx_decoder import export_decoder
    from trainer_lib.export.ort_generate import OrtDecoder

    model = AutoModelForCausalLM.from_pretrained(trained_model_dir, dtype=torch.float16).eval()
    weight = weakref.ref(model.model.layers[0].mlp.up_proj.weight)
    assert export_decoder(model, str(tmp_path / "model.onnx")) == exported.layout
    del model
    gc.collect()
    assert weight() is None

    decoder = OrtDecoder(str(tmp_path))
    assert decoder.cache_dtype == np.float16
    assert {o.name: o.type for o in decoder.session.get_outputs()}["logits"] == "tensor(float)"
    prompts = prompt_ids(exported.tokenizer)
    figures = parity.logit_parity(parity.reference_logits(parity.TorchDecoder(exported.model), prompts), decoder)
    assert 1e-4 < figures["prefill"]["max_abs_diff"] < 2e-2 and figures["top1_agreement"] == 1.0
    # Hugging Face's half-precision Llama computes RMSNorm's statistic and the rotary angles in fp32
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    types = {v.name: v.type.tensor_type.elem_type for v in graph.value_info}
    for node in graph.node:
        if node.op_type in ("ReduceMean", "Cos", "Sin"):
            assert types[node.input[0]] == onnx.TensorProto.FLOAT, node.name
