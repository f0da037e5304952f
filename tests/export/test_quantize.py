"""INT8 and INT4 copies: smaller, every large weight quantized, still close to the FP32 model."""

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tests.export.helpers import prompt_ids
from trainer_lib.export import parity
from trainer_lib.export.ort_generate import OrtDecoder
from trainer_lib.export.quantize import fold_transposed_weights, quantize_int8


def float_weights(path: str, min_elements: int = 1024) -> list[str]:
    model = onnx.load(f"{path}/model.onnx")
    return [
        t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and np.prod(t.dims) >= min_elements
    ]


def op_types(path: str) -> set[str]:
    return {n.op_type for n in onnx.load(f"{path}/model.onnx", load_external_data=False).graph.node}


def test_int8_weights_are_at_least_3x_smaller(exported):
    fp32, int8 = parity.weight_bytes(exported.fp32), parity.weight_bytes(exported.int8)
    assert fp32 / int8 >= 3.0, (fp32, int8)
    assert parity.directory_bytes(exported.int8) < parity.directory_bytes(exported.fp32) / 2.5
    assert float_weights(exported.fp32)  # the check below has something to find
    assert float_weights(exported.int8) == []  # embedding, every projection and the tied LM head
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= op_types(exported.int8)


def test_int8_without_embeddings_keeps_the_embedding_fp32(exported, tmp_path):
    out = tmp_path / "int8"
    quantize_int8(f"{exported.fp32}/model.onnx", str(out / "model.onnx"), embeddings=False)
    gathers = [n.input[0] for n in onnx.load(f"{out}/model.onnx").graph.node if n.op_type == "Gather"]
    left = float_weights(str(out))
    assert len(left) == 1 and left[0] in gathers  # only the embedding table stays fp32
    assert parity.weight_bytes(str(out)) > parity.weight_bytes(exported.int8)


def test_quantized_models_follow_pytorch(exported):
    reference = parity.TorchDecoder(exported.model)
    prompts = prompt_ids(exported.tokenizer)
    int8 = parity.logit_parity(reference, OrtDecoder(exported.int8), prompts)
    int4 = parity.logit_parity(reference, OrtDecoder(exported.int4), prompts)
    assert int8["top1_agreement"] >= 0.9 and int4["top1_agreement"] >= 0.8
    assert 0 < int8["prefill"]["mean_abs_diff"] < 0.2


def test_int4_uses_matmulnbits(exported):
    assert "MatMulNBits" in op_types(exported.int4)
    model = onnx.load(f"{exported.int4}/model.onnx", load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    # only activation x activation MatMuls (attention) are left; the tied head was folded and quantized too
    assert not [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert parity.weight_bytes(exported.int4) < parity.weight_bytes(exported.fp32) / 3


def test_fold_transposed_weights_keeps_results(tmp_path):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((5, 3)).astype(np.float32)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]), helper.make_node("MatMul", ["x", "w_t"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert fold_transposed_weights(model) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    path = os.path.join(tmp_path, "m.onnx")
    onnx.save(model, path)
    (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-6)
