"""INT8 and INT4 copies: smaller, every large weight quantized, still close to the FP32 model, and
built a slice at a time with the same result as onnxruntime's quantizers on the whole graph; a tied
embedding and LM head share one 8-bit table."""

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tests.export.helpers import prompt_ids
from trainer_lib.export import parity, quantize
from trainer_lib.export.ort_generate import OrtDecoder, pad_left
from trainer_lib.export.quantize import fold_transposed_weights, quantize_in_slices, quantize_int8


def float_weights(path: str, min_elements: int = 1024) -> list[str]:
    """Float initializers of ``min_elements`` or more, quantization scales (one per block) left out."""
    model = onnx.load(f"{path}/model.onnx")
    return [
        t.name
        for t in model.graph.initializer
        if t.data_type == TensorProto.FLOAT and np.prod(t.dims) >= min_elements and "scales" not in t.name
    ]


def op_types(path: str) -> set[str]:
    return {n.op_type for n in onnx.load(f"{path}/model.onnx", load_external_data=False).graph.node}


def test_int8_weights_are_at_least_3x_smaller(exported):
    fp32, int8 = parity.weight_bytes(exported.fp32), parity.weight_bytes(exported.int8)
    assert fp32 / int8 >= 3.0, (fp32, int8)
    assert parity.directory_bytes(exported.int8) < parity.directory_bytes(exported.fp32) / 2.5
    assert float_weights(exported.fp32)  # the check below has something to find
    assert float_weights(exported.int8) == []  # embedding, every projection and the tied LM head
    assert {"MatMulNBits", "GatherBlockQuantized"} <= op_types(exported.int8)
    assert not {"MatMulInteger", "DynamicQuantizeLinear"} & op_types(exported.int8)


def test_a_tied_head_reads_the_embedding_table_it_shares(exported):
    model = onnx.load(f"{exported.int8}/model.onnx", load_external_data=False)
    (gather,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    (head,) = [n for n in model.graph.node if "logits" in n.output]
    assert head.op_type == "MatMulNBits" and head.input[1] == gather.input[0]
    vocab = len(exported.tokenizer)
    tables = [t.name for t in model.graph.initializer if t.dims and t.dims[0] == vocab]
    assert [name for name in tables if "scales" not in name] == [gather.input[0]]  # one copy, in 8 bits


def test_int8_blocks_round_trip_within_half_a_step():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((6, 64)).astype(np.float32) * np.array([1.0, 50.0] * 32, dtype=np.float32)
    packed, scales = quantize.int8_blocks(table, 32)
    assert packed.shape == (6, 2, 32) and scales.shape == (6, 2)
    restored = (packed.astype(np.float32) - 128) * scales[:, :, None]
    step = np.abs(scales[:, :, None])  # one scale per block of 32: a large feature costs its own block only
    assert np.all(np.abs(restored.reshape(6, 64) - table).reshape(6, 2, 32) <= step / 2 + 1e-6)


def test_int8_without_embeddings_keeps_the_embedding_fp32(exported, tmp_path):
    out = tmp_path / "int8"
    quantize_int8(f"{exported.fp32}/model.onnx", str(out / "model.onnx"), embeddings=False)
    gathers = [n.input[0] for n in onnx.load(f"{out}/model.onnx").graph.node if n.op_type == "Gather"]
    left = float_weights(str(out))
    assert len(left) == 1 and left[0] in gathers  # only the embedding table stays fp32
    assert parity.weight_bytes(str(out)) > parity.weight_bytes(exported.int8)


def test_quantized_models_follow_pytorch(exported):
    reference = parity.reference_logits(parity.TorchDecoder(exported.model), prompt_ids(exported.tokenizer))
    int8 = parity.logit_parity(reference, OrtDecoder(exported.int8))
    int4 = parity.logit_parity(reference, OrtDecoder(exported.int4))
    assert int8["top1_agreement"] >= 0.95 and int4["top1_agreement"] >= 0.8
    assert 0 < int8["prefill"]["mean_abs_diff"] < 0.05


def test_int4_uses_matmulnbits(exported):
    assert {"MatMulNBits", "GatherBlockQuantized"} <= op_types(exported.int4)  # the embedding in 8 bits
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


def whole_model_int8(fp32_dir: str, out_dir: str) -> None:
    """The same quantization on the whole folded model at once: the embedding first, then
    onnxruntime's 8-bit MatMulNBits quantizer on every MatMul."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(f"{fp32_dir}/model.onnx")
    quantize.quantize_embeddings(model, fp32_dir)
    fold_transposed_weights(model)
    quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    os.makedirs(out_dir)
    onnx.save(quantizer.model.model, f"{out_dir}/model.onnx")


def same_model(a: str, b: str) -> None:
    """Equal weights (names, types, values) and op types, and equal logits on a padded batch."""
    ma, mb = onnx.load(f"{a}/model.onnx"), onnx.load(f"{b}/model.onnx")
    wa = {t.name: numpy_helper.to_array(t) for t in ma.graph.initializer}
    wb = {t.name: numpy_helper.to_array(t) for t in mb.graph.initializer}
    assert wa.keys() == wb.keys()
    for name in wa:
        assert wa[name].dtype == wb[name].dtype and np.array_equal(wa[name], wb[name]), name
    assert sorted(n.op_type for n in ma.graph.node) == sorted(n.op_type for n in mb.graph.node)
    tokens, mask, positions = pad_left([[5, 17, 42, 9], [100, 7]])
    da, db = OrtDecoder(a), OrtDecoder(b)
    la, _ = da.forward(tokens, mask, positions, da.empty_past(2))
    lb, _ = db.forward(tokens, mask, positions, db.empty_past(2))
    np.testing.assert_array_equal(la, lb)


def test_slices_quantize_as_the_whole_graph_does(exported, tmp_path, monkeypatch):
    monkeypatch.setattr(quantize, "SLICE_BYTES", 1)  # every activation's readers a slice of their own
    calls = []

    def counted(path: str, result: str) -> None:
        calls.append(sorted(n.op_type for n in onnx.load(path, load_external_data=False).graph.node))
        quantize.int8_file(path, result)

    sliced = str(tmp_path / "sliced")
    quantize_in_slices(
        f"{exported.fp32}/model.onnx", f"{sliced}/model.onnx", ("MatMul",), counted, quantize.quantize_embeddings
    )
    whole_model_int8(exported.fp32, str(tmp_path / "whole"))
    same_model(sliced, str(tmp_path / "whole"))
    # per layer: q, k and v read one activation (one slice of 3), then o, gate + up, down; the tied head
    # went with the embedding, before the slices
    layers = exported.layout["num_layers"]
    assert calls[0] == ["MatMul"] * 3 and calls[2] == ["MatMul"] * 2
    assert len(calls) == 4 * layers
    assert sorted(os.listdir(sliced)) == ["model.onnx", "model.onnx.data"]  # no slice left behind


def test_int4_slices_equal_the_whole_graph(exported, tmp_path):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(f"{exported.fp32}/model.onnx")
    quantize.quantize_embeddings(model, exported.fp32)
    fold_transposed_weights(model)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    os.makedirs(tmp_path / "whole")
    onnx.save(quantizer.model.model, str(tmp_path / "whole" / "model.onnx"))
    same_model(exported.int4, str(tmp_path / "whole"))


def test_hqq_int4_fits_float_zero_points_and_follows_pytorch_closer(exported, tmp_path):
    hqq = tmp_path / "hqq"
    quantize.quantize_int4(f"{exported.fp32}/model.onnx", str(hqq / "model.onnx"), method="hqq")
    model = onnx.load(f"{hqq}/model.onnx", load_external_data=False)
    weights = {t.name: t for t in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits" and len(n.input) == 4]
    assert nbits and all(weights[n.input[3]].data_type == TensorProto.FLOAT for n in nbits)  # float zero points
    reference = parity.reference_logits(parity.TorchDecoder(exported.model), prompt_ids(exported.tokenizer))
    rtn = parity.logit_parity(reference, OrtDecoder(exported.int4))
    fitted = parity.logit_parity(reference, OrtDecoder(str(hqq)))
    assert fitted["prefill"]["mean_abs_diff"] < rtn["prefill"]["mean_abs_diff"]
