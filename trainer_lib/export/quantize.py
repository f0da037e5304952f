"""INT8 and INT4 copies of an exported FP32 decoder (onnxruntime's weight-only block quantization).

* INT8: every weight matrix in blocks of :data:`INT8_BLOCK` values along its input dimension, one
  fp32 scale per block (symmetric), as ``com.microsoft.MatMulNBits`` with ``bits=8``. Activations
  stay fp32 between the layers; inside each product onnxruntime quantizes them per block too
  (``accuracy_level=4``: int8 dot products, the fast path on CPUs). ``embeddings=True`` stores the
  embedding table the same way (``com.microsoft.GatherBlockQuantized``); a tied LM head reads that
  very table, so the largest matrix of a small model is stored once, in 8 bits.
* INT4: ``MatMulNBits`` with 4-bit weights (blocks of 32 along the input dim), weight-only, by
  round-to-nearest or HQQ (:func:`int4_file`); needs the ``onnx-ir`` package. The embedding table and a
  tied head are stored in 8-bit blocks as for INT8.

Why blocks, not one scale per channel: an LLM's hidden states carry a few outlier features a hundred
times larger than the rest. ``quantize_dynamic``'s INT8 (per-tensor uint8 activations, per-channel
weights) flattened every other feature of those rows to a handful of levels: on SmolLM2-135M-Instruct
its top-1 agreement with PyTorch was 0.53 over 4,600 positions of real prompts, against 0.96 here
(docs/export-and-serving.md).

Both outputs keep the FP32 graph's inputs and outputs and, like the FP32 export, keep their
weights in ``model.onnx.data``.

**A slice at a time.** onnxruntime's quantizers load the whole model and copy it on the way. So
:func:`quantize_in_slices` hands them the graph in slices instead: the nodes to quantize, grouped by
the activation they read and packed up to :data:`SLICE_BYTES` of weights, each slice a small model of
its own. Each result is spliced back into the graph and its weights appended to the output file. Per
node this is what the quantizer does on the whole graph (each node is quantized on its own); the tests
compare the two.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np

from trainer_lib.export.external_data import DataWriter, read_array, replace_field, save_structure

SLICE_BYTES = 64 * 2**20  # FP32 weights per slice handed to onnxruntime's quantizer
INT8_BLOCK = 32  # weights per INT8 scale (a power of two >= 16)
#: onnxruntime's compute type of a MatMulNBits: 4 quantizes the activations per block to int8 at run time
INT8_COMPUTE = 4
MS_DOMAIN = "com.microsoft"


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


def quantize_in_slices(fp32_path: str, out_path: str, op_types: tuple[str, ...], quantize, prepare=None) -> None:
    """``fp32_path`` -> ``out_path`` with ``quantize(slice_path, result_path)`` (a whole-model
    quantizer, both files with external data) run on each slice of :func:`_slices`; ``prepare(model,
    source_dir)``, if given, rewrites the FP32 graph first (its new weights in memory)."""
    import onnx

    source = os.path.dirname(os.path.abspath(fp32_path))
    model = onnx.load(fp32_path, load_external_data=False)
    if prepare is not None:
        prepare(model, source)
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


@contextlib.contextmanager
def quiet_quantizer():
    """onnxruntime's weight quantizer logs two INFO lines per node to the root handler: keep its warnings."""
    import logging

    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def int8_file(path: str, result: str, block_size: int = INT8_BLOCK) -> None:
    """One ONNX file -> its INT8 copy: every MatMul with a weight initializer as an 8-bit MatMulNBits."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(path), bits=8, block_size=block_size, is_symmetric=True, accuracy_level=INT8_COMPUTE
    )
    with quiet_quantizer():
        quantizer.process()
    save_model(quantizer.model.model, result)


def int8_blocks(table: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(packed, scales)`` of a ``[rows, columns]`` table quantized as MatMulNBits stores an 8-bit weight
    whose output channels are the rows: ``packed`` uint8 ``[rows, columns / block, block]`` (the zero point is
    128), ``scales`` float32 ``[rows, columns / block]``. onnxruntime's own routine, so a tied head's table
    comes out byte for byte as its quantizer writes it."""
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    rows, columns = table.shape
    blocks = columns // block_size
    packed = np.zeros((rows, blocks, block_size), dtype=np.uint8)
    scales = np.zeros(rows * blocks, dtype=np.float32)
    zero_points = np.zeros(rows * blocks, dtype=np.uint8)  # (unused when symmetric)
    weight = np.ascontiguousarray(table.T, dtype=np.float32)  # MatMul's [in, out] layout
    quantize_matmul_8bits(packed, weight, scales, zero_points, block_size, rows, columns, True)
    return packed, scales.reshape(rows, blocks)


def quantize_embeddings(model, base_dir: str, block_size: int = INT8_BLOCK) -> int:
    """Rewrite each embedding ``Gather`` of ``model`` (an fp32 table ``[vocab, hidden]``) as an 8-bit
    ``GatherBlockQuantized``; where the table is also the LM head (``MatMul(h, Transpose(table))``, tied
    embeddings), that MatMul becomes an 8-bit MatMulNBits reading the same packed table. Returns how many
    tables were quantized. A table whose width is not a multiple of ``block_size`` stays fp32."""
    from onnx import TensorProto

    weights = {t.name: t for t in model.graph.initializer}
    transposed = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Transpose"}
    replaced: dict[str, list] = {}  # an old node's first output -> the nodes that take its place
    for node in model.graph.node:
        table = weights.get(node.input[0]) if node.op_type == "Gather" else None
        if table is None or table.data_type != TensorProto.FLOAT or len(table.dims) != 2 or table.dims[1] % block_size:
            continue
        names = _add_int8_table(model, table, read_array(table, base_dir), block_size)
        replaced[node.output[0]] = _int8_gather(node, names, table.dims[1], block_size)
        for head in model.graph.node:
            if head.op_type == "MatMul" and transposed.get(head.input[1]) == table.name:
                replaced[head.output[0]] = [_int8_head(head, names, table.dims, block_size)]
    if replaced:
        _replace_nodes(model, replaced)
    return len([n for n in model.graph.node if n.op_type == "GatherBlockQuantized"])


def _add_int8_table(model, table, values: np.ndarray, block_size: int) -> dict[str, str]:
    """The packed table and its scales as initializers (in memory), in the shapes the two ops read."""
    from onnx import numpy_helper

    packed, scales = int8_blocks(values, block_size)
    rows, hidden = table.dims
    names = {key: f"{table.name}_int8{key}" for key in ("", "_scales", "_scales_flat", "_row")}
    arrays = {
        "": packed,
        "_scales": scales.reshape(rows, -1, 1),  # GatherBlockQuantized: the rank of the packed table
        "_scales_flat": scales.reshape(-1),  # MatMulNBits: one scale per (row, block)
        "_row": np.array([0, 0, hidden], dtype=np.int64),  # a gathered row's blocks back to [hidden]
    }
    model.graph.initializer.extend(numpy_helper.from_array(arrays[key], names[key]) for key in arrays)
    return names


def _int8_gather(node, names: dict, hidden: int, block_size: int) -> list:
    """``Gather(table, ids)`` as ``GatherBlockQuantized`` ([batch, seq, blocks, block]) and a Reshape to hidden."""
    from onnx import helper

    blocks = f"{node.output[0]}_blocks"
    gather = helper.make_node(
        "GatherBlockQuantized",
        [names[""], node.input[1], names["_scales"]],
        [blocks],
        domain=MS_DOMAIN,
        gather_axis=0,
        quantize_axis=2,
        block_size=block_size,
        bits=8,
    )
    return [gather, helper.make_node("Reshape", [blocks, names["_row"]], [node.output[0]])]


def _int8_head(head, names: dict, dims, block_size: int):
    """A tied LM head ``MatMul(h, Transpose(table))`` as an 8-bit MatMulNBits on the packed table."""
    from onnx import helper

    rows, hidden = dims
    return helper.make_node(
        "MatMulNBits",
        [head.input[0], names[""], names["_scales_flat"]],
        list(head.output),
        domain=MS_DOMAIN,
        K=hidden,
        N=rows,
        bits=8,
        block_size=block_size,
        accuracy_level=INT8_COMPUTE,
    )


def _replace_nodes(model, replaced: dict[str, list]) -> None:
    """Each node whose first output is in ``replaced`` gives way to its new nodes; Transposes nothing reads any more
    go; the com.microsoft domain is declared."""
    from onnx import helper

    from trainer_lib.export.external_data import sort_nodes

    nodes = [new for node in model.graph.node for new in replaced.get(node.output[0], [node])]
    read = {name for node in nodes for name in node.input}
    replace_field(model.graph.node, [n for n in nodes if n.op_type != "Transpose" or n.output[0] in read])
    sort_nodes(model.graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def quantize_int8(fp32_path: str, out_path: str, embeddings: bool = True, block_size: int = INT8_BLOCK) -> None:
    """``fp32_path`` -> ``out_path``: every weight matrix in 8-bit blocks (:func:`int8_file`, a slice at a
    time), and with ``embeddings`` the embedding table too, shared with a tied LM head
    (:func:`quantize_embeddings`)."""
    prepare = (lambda model, source: quantize_embeddings(model, source, block_size)) if embeddings else None
    quantize_in_slices(
        fp32_path, out_path, ("MatMul",), lambda path, result: int8_file(path, result, block_size), prepare
    )


def int4_file(path: str, result: str, block_size: int = 32, method: str = "rtn") -> None:
    """One ONNX file -> its INT4 copy: every MatMul with a weight initializer as a 4-bit MatMulNBits, by
    round-to-nearest (symmetric, int8 dot products at run time) or HQQ (asymmetric with float zero points,
    fitted without data: closer to the weights, but onnxruntime's CPU kernels run it in fp32)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer

    hqq = HQQWeightOnlyQuantConfig(block_size=block_size, bits=4) if method == "hqq" else None
    quantizer = MatMulNBitsQuantizer(
        onnx.load(path), bits=4, block_size=block_size, is_symmetric=True, accuracy_level=INT8_COMPUTE, algo_config=hqq
    )
    with quiet_quantizer():
        quantizer.process()
    save_model(quantizer.model.model, result)


def quantize_int4(
    fp32_path: str, out_path: str, block_size: int = 32, method: str = "rtn", embeddings: bool = True
) -> None:
    """``fp32_path`` -> ``out_path``: 4-bit MatMul weights (:func:`int4_file`, a slice at a time); with
    ``embeddings`` the embedding table (and a tied head) in 8-bit blocks as for INT8: 4 bits there cost the
    most agreement for the least size."""
    prepare = (lambda model, source: quantize_embeddings(model, source)) if embeddings else None
    quantize_in_slices(
        fp32_path, out_path, ("MatMul",), lambda path, result: int4_file(path, result, block_size, method), prepare
    )
