"""The FP16 copy: float16 weights and cache, float32 logits, close to PyTorch; the parts kept in fp32
(rotary angles, RMSNorm statistics, softmax) are what keeps it right at long positions and large
activations, where a plain conversion breaks; and streaming the weights changes nothing."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers.float16 import convert_float_to_float16
from transformers import DynamicCache

from tests.export.helpers import prompt_ids
from trainer_lib.export import parity
from trainer_lib.export.fp16 import convert_fp16, fp32_islands, join_fp32_chains
from trainer_lib.export.ort_generate import OrtDecoder


@pytest.fixture(scope="module")
def fp16(exported):
    return OrtDecoder(exported.fp16, threads=1)


def naive_fp16(fp32_dir: str, out_dir: str) -> str:
    """onnxruntime's converter on the whole graph, nothing kept in fp32 (what the islands prevent)."""
    model = convert_float_to_float16(onnx.load(f"{fp32_dir}/model.onnx"), keep_io_types=["logits"])
    os.makedirs(out_dir)
    onnx.save(model, f"{out_dir}/model.onnx")
    return out_dir


def test_interface_and_weights(exported, fp16):
    inputs = {i.name: i.type for i in fp16.session.get_inputs()}
    outputs = {o.name: o.type for o in fp16.session.get_outputs()}
    assert inputs["input_ids"] == inputs["attention_mask"] == inputs["position_ids"] == "tensor(int64)"
    assert {t for name, t in inputs.items() if name.startswith("past_key_values.")} == {"tensor(float16)"}
    assert {t for name, t in outputs.items() if name.startswith("present.")} == {"tensor(float16)"}
    assert outputs["logits"] == "tensor(float)"
    assert fp16.cache_dtype == np.float16 and fp16.providers == ["CPUExecutionProvider"]
    assert sorted(os.listdir(exported.fp16)) == ["model.onnx", "model.onnx.data"]
    model = onnx.load(f"{exported.fp16}/model.onnx")
    large = [t for t in model.graph.initializer if np.prod(t.dims) >= 64]
    assert large and {t.data_type for t in large} == {TensorProto.FLOAT16}
    ratio = parity.weight_bytes(exported.fp32) / parity.weight_bytes(exported.fp16)
    assert 1.95 < ratio <= 2.0  # every weight halved; only small fp32 constants (inv_freq, eps) stay


def test_follows_pytorch(exported, fp16):
    prompts = prompt_ids(exported.tokenizer)
    figures = parity.logit_parity(parity.reference_logits(parity.TorchDecoder(exported.model), prompts), fp16)
    # fp16 rounding (a unit in the last place is ~5e-4 relative) shows, but stays small
    for phase in ("prefill", "decode"):
        assert 1e-4 < figures[phase]["max_abs_diff"] < 2e-2, figures
    assert figures["top1_agreement"] == 1.0
    eos = exported.tokenizer.eos_token_id
    expected = parity.torch_greedy(exported.model, prompts, 8, eos, exported.tokenizer.pad_token_id)
    assert parity.greedy_parity(expected, fp16, prompts, 8, eos)["greedy_exact_match"] == 1.0


def test_island_nodes_compute_in_fp32(exported):
    model = onnx.load(f"{exported.fp16}/model.onnx", load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.input]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    for node in model.graph.node:
        if node.op_type in ("Cos", "Sin", "Softmax", "Pow", "ReduceMean", "Sqrt", "Reciprocal"):
            assert types[node.input[0]] == TensorProto.FLOAT, (node.op_type, node.name)
    # no fp32 -> fp16 -> fp32 round trip is left between two kept nodes
    producer = {out: node for node in model.graph.node for out in node.output}
    for node in model.graph.node:
        source = producer.get(node.input[0]) if node.op_type == "Cast" else None
        if source is not None and source.op_type == "Cast":
            assert types.get(source.input[0]) != TensorProto.FLOAT, node.name


def test_rotary_angles_stay_exact_at_long_positions(exported, fp16, tmp_path):
    """fp16 cannot hold position 5001 (its step there is 4) nor its angle in radians: the keys
    in the cache, rotated by those angles, would be wrong."""
    naive = OrtDecoder(naive_fp16(exported.fp32, str(tmp_path / "naive")))
    ids = np.array([prompt_ids(exported.tokenizer)[0]], dtype=np.int64)
    mask, positions = np.ones_like(ids), 5000 + np.arange(ids.shape[1])[None]
    cache = DynamicCache(config=exported.model.config)
    with torch.inference_mode():
        exported.model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(positions),
            past_key_values=cache,
            use_cache=True,
        )
    expected = cache.layers[0].keys.numpy()
    errors = {}
    for name, decoder in (("islands", fp16), ("naive", naive)):
        _, present = decoder.forward(ids, mask, positions, decoder.empty_past(1))
        errors[name] = np.abs(present[0].astype(np.float32) - expected).max()
    assert errors["islands"] < 1e-2 < 0.1 < errors["naive"], errors


def rms_norm_model(path: str, hidden: int = 512) -> np.ndarray:
    """``y = w * x / sqrt(mean(x^2) + eps)`` as the exporter writes an RMSNorm; returns ``w``."""
    weight = np.random.default_rng(0).uniform(0.5, 1.5, hidden).astype(np.float32)
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["squared"], name="pow"),
        helper.make_node("ReduceMean", ["squared", "last"], ["mean"], name="mean"),
        helper.make_node("Add", ["mean", "eps"], ["shifted"], name="add"),
        helper.make_node("Sqrt", ["shifted"], ["rms"], name="sqrt"),
        helper.make_node("Reciprocal", ["rms"], ["inverse"], name="reciprocal"),
        helper.make_node("Mul", ["x", "inverse"], ["normed"], name="scale"),
        helper.make_node("Mul", ["w", "normed"], ["y"], name="weight"),
    ]
    initializers = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(weight, "w"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])
    graph = helper.make_graph(nodes, "rms_norm", [x], [y], initializers)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    os.makedirs(os.path.dirname(path))
    onnx.save(model, path, save_as_external_data=True, location="model.onnx.data", size_threshold=1024)
    return weight


def test_rms_norm_of_large_activations(tmp_path):
    """An RMS of 1000 squares to 1e6, past fp16's largest value (65504): the statistic is kept in
    fp32 and the output matches. (onnxruntime's CPU provider has no fp16 Pow or ReduceMean and
    computes them in fp32 anyway, so a plain conversion passes here too; a GPU would not.)"""
    fp32_path, fp16_path = str(tmp_path / "fp32" / "model.onnx"), str(tmp_path / "fp16" / "model.onnx")
    weight = rms_norm_model(fp32_path)
    assert fp32_islands(onnx.load(fp32_path)) == ["add", "mean", "pow", "reciprocal", "scale", "sqrt"]
    convert_fp16(fp32_path, fp16_path)
    model = onnx.load(fp16_path)
    assert {t.name: t.data_type for t in model.graph.initializer}["w"] == TensorProto.FLOAT16
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    reads = {node.name: [types.get(name) for name in node.input[:1]] for node in model.graph.node}
    kept = ("pow", "mean", "add", "sqrt", "reciprocal", "scale")
    assert [reads[name] for name in kept] == [[TensorProto.FLOAT]] * 6  # each reads the last one's fp32 output
    x = np.random.default_rng(1).normal(0, 1000, (2, weight.size)).astype(np.float16)
    expected = weight * x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5)
    (y,) = ort.InferenceSession(fp16_path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), expected, rtol=1e-2, atol=1e-2)


def test_streamed_weights_equal_an_in_memory_conversion(exported, tmp_path):
    model = onnx.load(f"{exported.fp32}/model.onnx")
    model = convert_float_to_float16(
        model, keep_io_types=["logits"], disable_shape_infer=True, node_block_list=fp32_islands(model)
    )
    assert join_fp32_chains(model) > 0
    streamed = onnx.load(f"{exported.fp16}/model.onnx")
    expected = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in streamed.graph.initializer}
    assert got.keys() == expected.keys()
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    assert sorted(n.op_type for n in streamed.graph.node) == sorted(n.op_type for n in model.graph.node)
