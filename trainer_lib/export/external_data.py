"""Weights in ``model.onnx.data``, read and written one tensor at a time.

Every exported directory keeps its initializers over :data:`~trainer_lib.export.onnx_decoder.INLINE_BYTES`
in one file beside ``model.onnx``. The INT8, INT4 and FP16 copies are built from the FP32 graph
loaded without its data (``onnx.load(..., load_external_data=False)``): each weight is read from
the FP32 file when its turn comes (:func:`read_array`) and each result is appended to the new file
at once (:class:`DataWriter`), so building a copy holds a slice of the weights, never all of them.
"""

from __future__ import annotations

import math
import os

import numpy as np

from trainer_lib.export.onnx_decoder import EXTERNAL_DATA, INLINE_BYTES


def is_external(tensor) -> bool:
    import onnx

    return tensor.data_location == onnx.TensorProto.EXTERNAL


def read_array(tensor, base_dir: str) -> np.ndarray:
    """The values of ``tensor`` (an initializer), its external data read from ``base_dir``; the
    proto itself is left as it was (no data kept in it)."""
    from onnx import helper, numpy_helper

    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    info = {entry.key: entry.value for entry in tensor.external_data}
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    count = math.prod(tensor.dims)
    path = os.path.join(base_dir, info["location"])
    array = np.fromfile(path, dtype=dtype, count=count, offset=int(info.get("offset", 0)))
    if array.size != count:
        raise ValueError(f"{path}: {tensor.name} needs {count} values, the file has {array.size} there")
    return array.reshape(tuple(tensor.dims))


class DataWriter:
    """Appends arrays to ``<directory>/model.onnx.data``; :meth:`tensor` returns the initializer that
    points at them (inline when under ``INLINE_BYTES``, as in the FP32 export)."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, EXTERNAL_DATA)
        self.file = open(self.path, "wb")  # closed by close(), or by the with block

    def tensor(self, name: str, array: np.ndarray):
        import onnx
        from onnx import helper, numpy_helper

        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn a scalar into shape [1])
            array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            return numpy_helper.from_array(array, name)
        offset = self.file.tell()
        array.tofile(self.file)
        tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.dims.extend(array.shape)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", EXTERNAL_DATA), ("offset", offset), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        return tensor

    def close(self) -> None:
        self.file.close()
        os.chmod(self.path, 0o644)  # a serving container may run as another user

    def __enter__(self) -> DataWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def save_structure(model, path: str) -> None:
    """Write ``model`` (its large initializers already in ``model.onnx.data`` beside ``path``, by a
    :class:`DataWriter`) as ``path``, its nodes in topological order."""
    import onnx

    sort_nodes(model.graph)
    onnx.save_model(model, path)
    os.chmod(path, 0o644)


def sort_nodes(graph) -> None:
    """Order ``graph``'s nodes so that each comes after the producers of its inputs (onnxruntime
    sorts for itself, but other tools and readers expect it); ties keep their old order."""
    import heapq

    produced = {out for node in graph.node for out in node.output if out}
    waiting = {index: {name for name in node.input if name in produced} for index, node in enumerate(graph.node)}
    readers: dict[str, list[int]] = {}
    for index, names in waiting.items():
        for name in names:
            readers.setdefault(name, []).append(index)
    ready = [index for index, names in waiting.items() if not names]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for out in graph.node[index].output:
            for reader in readers.get(out, []):
                waiting[reader].discard(out)
                if not waiting[reader]:
                    heapq.heappush(ready, reader)
    if len(order) != len(graph.node):
        raise ValueError("the graph has a cycle")
    replace_field(graph.node, [graph.node[index] for index in order])


def replace_field(field, items: list) -> None:
    """Make the repeated proto ``field`` hold ``items`` (copies), which may be its own elements:
    protobuf keeps an element taken out of its field valid."""
    items = list(items)
    del field[:]
    field.extend(items)
