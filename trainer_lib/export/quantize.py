"""INT8 and INT4 copies of an exported FP32 decoder (onnxruntime.quantization, weights only).

* INT8: ``quantize_dynamic`` with int8 weights, one scale per output channel; activations are
  quantized on the fly per call (no calibration data). ``embeddings=True`` quantizes the
  embedding ``Gather`` too: on small models the vocabulary table is most of the weights.
* INT4: ``MatMulNBitsQuantizer`` (symmetric, blocks of 32 along the input dim), weight-only
  ``com.microsoft.MatMulNBits``; needs the ``onnx-ir`` package. Embeddings stay FP32 (4-bit
  Gather would force opset 21).

Both outputs keep the FP32 graph's inputs and outputs and, like the FP32 export, keep their
weights in ``model.onnx.data``.

**A slice at a time.** onnxruntime's quantizers load the whole model, and ``quantize_dynamic``
copies it twice more on the way (a deep copy, saved and reloaded for shape inference): about 4x
the FP32 weights in memory. So :func:`quantize_in_slices` hands them the graph in slices instead:
the nodes to quantize, grouped by the activation they read (so the activation's one
``DynamicQuantizeLinear`` stays in one slice) and packed up to :data:`SLICE_BYTES` of weights,
each slice a small model of its own. Each result is spliced back into the graph and its weights
appended to the output file. Per node this is what the quantizer does on the whole graph (each
node is quantized on its own); the tests compare the two.
"""

from __future__ import annotations

import os
import tempfile

from trainer_lib.export.external_data import DataWriter, read_array, replace_field, save_structure

SLICE_BYTES = 64 * 2**20  # FP32 weights per slice handed to onnxruntime's quantizer


def fold_transposed_weights(model, base_dir: str = "") -> int:
    """Replace ``Transpose(initializer)`` nodes by a transposed initializer; returns how many.

    A tied LM head is exported as ``MatMul(h, Transpose(embedding))``; the quantizers only touch
    MatMuls whose weight is an initializer, so without this the head (often the largest
    matrix) would stay FP32. External data is read from ``base_dir``.
    """
    import numpy as np
    from onnx import numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    folded = []
    for node in model.graph.node:
        if node.op_type != "Transpose" or node.input[0] not in weights:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        array = np.transpose(read_array(weights[node.input[0]], base_dir), perm)
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), node.output[0]))
        folded.append(node)
    for node in folded:
        model.graph.node.remove(node)
    return len(folded)


def save_model(model, path: str) -> None:
    """Write ``model`` (its data in memory) to ``path``, initializers over 1 KiB in ``model.onnx.data``."""
    from onnx import TensorProto

    directory = os.path.dirname(os.path.abspath(path))
    with DataWriter(directory) as writer:
        for i, tensor in enumerate(model.graph.initializer):
            if tensor.data_type != TensorProto.STRING:
                model.graph.initializer[i].CopyFrom(writer.tensor(tensor.name, read_array(tensor, directory)))
    save_structure(model, path)


def _slices(model, op_types: tuple[str, ...]) -> list[list]:
    """The nodes to quantize (``op_types`` whose weight is a float initializer), grouped by the
    activation they read and packed into slices of about ``SLICE_BYTES`` of weights."""
    import math

    from onnx import TensorProto

    weights = {t.name: t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    by_activation: dict[str, list] = {}
    for node in model.graph.node:
        if node.op_type in op_types and len(node.input) == 2:
            weight, activation = (node.input[0], node.input[1]) if node.op_type == "Gather" else node.input[::-1]
            if weight in weights and activation not in weights:
                by_activation.setdefault(activation, []).append(node)
    slices, size = [[]], 0
    for nodes in by_activation.values():
        nbytes = sum(4 * math.prod(weights[n.input[0 if n.op_type == "Gather" else 1]].dims) for n in nodes)
        if slices[-1] and size + nbytes > SLICE_BYTES:
            slices.append([])
            size = 0
        slices[-1] += nodes
        size += nbytes
    return [nodes for nodes in slices if nodes]


def _slice_model(model, nodes: list, base_dir: str):
    """``nodes`` of ``model`` as a model of their own: their activations as inputs, their outputs as
    outputs, their weights (read from ``base_dir``) as initializers."""
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    types = {v.name: v for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    names = [name for node in nodes for name in node.input]
    inputs = list(dict.fromkeys(name for name in names if name not in weights))
    initializers = [
        numpy_helper.from_array(read_array(weights[name], base_dir), name)
        for name in dict.fromkeys(names)
        if name in weights
    ]
    graph = helper.make_graph(
        list(nodes),
        "slice",
        [types[name] for name in inputs],
        [types[out] for node in nodes for out in node.output],
        initializers,
    )
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


def quantize_in_slices(fp32_path: str, out_path: str, op_types: tuple[str, ...], quantize) -> None:
    """``fp32_path`` -> ``out_path`` with ``quantize(slice_path, result_path)`` (a whole-model
    quantizer, both files with external data) run on each slice of :func:`_slices`."""
    import onnx

    source = os.path.dirname(os.path.abspath(fp32_path))
    model = onnx.load(fp32_path, load_external_data=False)
    fold_transposed_weights(model, source)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    replaced, new_nodes, new_weights = set(), [], []
    with DataWriter(out_dir) as writer, tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        for number, nodes in enumerate(_slices(model, op_types)):
            given, result = (
                os.path.join(tmp, f"{number}-in", "model.onnx"),
                os.path.join(tmp, f"{number}-out", "model.onnx"),
            )
            save_model(_slice_model(model, nodes, source), given)
            os.makedirs(os.path.dirname(result))
            quantize(given, result)
            quantized = onnx.load(result, load_external_data=False)
            new_weights += [
                writer.tensor(t.name, read_array(t, os.path.dirname(result))) for t in quantized.graph.initializer
            ]
            new_nodes += quantized.graph.node
            replaced.update(node.output[0] for node in nodes)
            domains = {o.domain for o in model.opset_import}
            model.opset_import.extend(o for o in quantized.opset_import if o.domain not in domains)
        replace_field(model.graph.node, [n for n in model.graph.node if n.output[0] not in replaced] + new_nodes)
        read = {name for node in model.graph.node for name in node.input}
        # what was not quantized (norm weights, ...) is copied over; what only quantized nodes read is dropped
        old_weights = [writer.tensor(t.name, read_array(t, source)) for t in model.graph.initializer if t.name in read]
        replace_field(model.graph.initializer, old_weights + new_weights)
    save_structure(model, out_path)


def int8_file(path: str, result: str, op_types: tuple[str, ...]) -> None:
    """One ONNX file -> its int8 copy: per-channel weights of the ``op_types`` nodes, external data."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # reduce_range: 7-bit weights. On x86 CPUs without VNNI (AVX2 only) onnxruntime's u8 x s8 kernel
    # (VPMADDUBSW) saturates its 16-bit sums; full-range weights then cost top-1 agreement (0.867
    # against PyTorch on such a machine, where VNNI machines gave >= 0.9).
    quantize_dynamic(
        path,
        result,
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
        op_types_to_quantize=list(op_types),
        use_external_data_format=True,
    )


def quantize_int8(fp32_path: str, out_path: str, embeddings: bool = True) -> None:
    """``fp32_path`` -> ``out_path``: int8 per-channel MatMul weights (and Gather if ``embeddings``),
    quantized a slice at a time (:func:`int8_file` on each)."""
    op_types = ("MatMul", "Gather") if embeddings else ("MatMul",)
    quantize_in_slices(fp32_path, out_path, op_types, lambda path, result: int8_file(path, result, op_types))


def quantize_int4(fp32_path: str, out_path: str, block_size: int = 32) -> None:
    """``fp32_path`` -> ``out_path``: 4-bit block-quantized MatMul weights (``MatMulNBits``)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    def int4(path: str, result: str) -> None:
        quantizer = MatMulNBitsQuantizer(onnx.load(path), bits=4, block_size=block_size, is_symmetric=True)
        quantizer.process()
        save_model(quantizer.model.model, result)

    quantize_in_slices(fp32_path, out_path, ("MatMul",), int4)
