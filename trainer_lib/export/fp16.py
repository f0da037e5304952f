"""FP16 copy of an exported FP32 decoder, for serving on GPUs (on CPU machines; the export stage
exports a CUDA machine's FP16 model from PyTorch in half precision instead).

onnxruntime's converter (``onnxruntime.transformers.float16.convert_float_to_float16``) turns every
float tensor, value and ``Cast`` of the graph to float16, except:

* ``logits`` stays float32 (one Cast at the end), as in every other variant; the cache inputs
  and outputs become float16, which :class:`~trainer_lib.export.ort_generate.OrtDecoder` reads
  from the graph;
* the nodes of :func:`fp32_islands` stay float32, where half precision would break the model:
  the rotary angles (``position * inv_freq``: fp16 has no odd integers above 2048 and a step of
  2 radians at 2048), the RMSNorm statistics (``mean(x^2)`` overflows fp16 once the RMS passes
  256) and softmax. Hugging Face models run in fp16 compute the first two in fp32 as well (and
  softmax too in their eager attention), so the result follows a half-precision PyTorch model,
  like the CUDA export.

The converter casts around each kept node on its own, so a chain of them would round to fp16
between links; :func:`join_fp32_chains` removes those round trips afterwards.

onnxruntime's CPU provider runs the result as is: for an op it has no fp16 kernel for, it
inserts the casts to fp32 and back itself. The weights go to ``model.onnx.data``, as for FP32,
converted one tensor at a time on their way from the FP32 file (the graph is converted without
them, see :func:`convert_fp16`).
"""

from __future__ import annotations

import os

import numpy as np

from trainer_lib.export.external_data import DataWriter, is_external, read_array, replace_field, save_structure

# Ops computed in fp32 wherever they are (reductions and exponentials over a whole row).
FP32_OPS = ("Softmax", "LayerNormalization")
# What may follow an RMSNorm's ReduceMean before the Mul that applies it: + eps, sqrt, 1/x.
NORM_STEPS = ("Add", "Sqrt", "Reciprocal", "Div")


def float_values(graph) -> set[str]:
    """Names of the float32 values of ``graph`` whose types it records (inputs, outputs, value_info)."""
    import onnx

    typed = [*graph.value_info, *graph.input, *graph.output]
    return {v.name for v in typed if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}


def producers(graph) -> dict:
    """Value name -> the node of ``graph`` that outputs it."""
    return {out: node for node in graph.node for out in node.output}


def fp32_islands(model) -> list[str]:
    """Names of the nodes of ``model`` (an FP32 ``onnx.ModelProto``) to keep in fp32: ancestors of
    ``Cos``/``Sin`` back to the integer position ids, each RMSNorm from ``Pow`` to the ``Mul`` that
    scales by its reciprocal RMS, and every :data:`FP32_OPS` node."""
    graph = model.graph
    floats, producer = float_values(graph), producers(graph)
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    keep = [node for node in graph.node if node.op_type in ("Cos", "Sin", *FP32_OPS)]
    stack = [name for node in keep if node.op_type in ("Cos", "Sin") for name in node.input]
    while stack:  # the rotary angles: every float value that Cos and Sin are computed from
        node = producer.get(stack.pop())
        if node is not None and node not in keep and any(out in floats for out in node.output):
            keep.append(node)
            stack += node.input
    for node in graph.node:
        source = producer.get(node.input[0]) if node.input else None
        if node.op_type != "ReduceMean" or source is None or source.op_type != "Pow":
            continue
        chain, value = [source, node], node.output[0]
        while len(consumers.get(value, [])) == 1:
            step = consumers[value][0]
            chain.append(step)
            if step.op_type == "Mul":  # x * rsqrt(mean(x^2) + eps): the norm is done
                keep += chain
                break
            if step.op_type not in NORM_STEPS:
                break
            value = step.output[0]
    return sorted({node.name for node in keep})


def join_fp32_chains(model) -> int:
    """Rewire ``Cast(to=float)(Cast(to=float16)(x))`` with a float ``x`` to read ``x`` itself, and
    drop the casts nothing reads any more; returns how many pairs were joined."""
    import onnx

    graph = model.graph
    floats, producer = float_values(graph), producers(graph)

    def cast_to(node) -> int | None:
        return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None

    renamed = {}
    for node in graph.node:
        source = producer.get(node.input[0]) if node.op_type == "Cast" else None
        if (
            cast_to(node) == onnx.TensorProto.FLOAT
            and source is not None
            and cast_to(source) == onnx.TensorProto.FLOAT16
        ):
            if source.input[0] in floats:
                renamed[node.output[0]] = source.input[0]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    outputs = {v.name for v in graph.output}
    while True:  # casts left without readers (a dropped one may leave its source cast unread)
        read = {name for node in graph.node for name in node.input} | outputs
        unread = [node for node in graph.node if node.op_type == "Cast" and node.output[0] not in read]
        if not unread:
            return len(renamed)
        for node in unread:
            graph.node.remove(node)


def convert_fp16(fp32_path: str, out_path: str) -> None:
    """``fp32_path`` -> ``out_path``: float16 weights, values and cache; float32 logits and
    :func:`fp32_islands`. The weights stream from one data file to the other, a tensor at a time."""
    import onnx
    from onnx import helper
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source = os.path.dirname(os.path.abspath(fp32_path))
    model = onnx.load(fp32_path, load_external_data=False)
    keep = fp32_islands(model)
    # The converter needs the values of the initializers it converts, so the large ones (their
    # data still in the FP32 file) become graph inputs for it: their types turn float16 like every
    # other input, and they come back as initializers below, converted as they are copied.
    weights = [t for t in model.graph.initializer if is_external(t)]
    replace_field(model.graph.initializer, [t for t in model.graph.initializer if not is_external(t)])
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in weights)
    # The exporter writes every value's type, so no shape inference (which cannot take a model
    # over protobuf's 2 GB in memory).
    model = convert_float_to_float16(model, keep_io_types=["logits"], disable_shape_infer=True, node_block_list=keep)
    join_fp32_chains(model)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    replace_field(model.graph.input, [v for v in model.graph.input if v.name not in {t.name for t in weights}])
    out_dir = os.path.dirname(os.path.abspath(out_path))
    with DataWriter(out_dir) as writer:
        for tensor in weights:
            array = read_array(tensor, source)
            if types[tensor.name] == onnx.TensorProto.FLOAT16:
                array = to_float16(array)
            model.graph.initializer.append(writer.tensor(tensor.name, array))
    save_structure(model, out_path)


def to_float16(array: np.ndarray, chunk: int = 2**22) -> np.ndarray:
    """``array`` in float16 as the converter turns its own tensors (finite values clipped to
    +-65504, tiny ones kept off zero), ``chunk`` values at a time."""
    from onnxruntime.transformers.float16 import convert_np_to_float16

    out = np.empty(array.shape, dtype=np.float16)
    values, target = array.reshape(-1), out.reshape(-1)
    for start in range(0, values.size, chunk):
        target[start : start + chunk] = convert_np_to_float16(values[start : start + chunk])
    return out
