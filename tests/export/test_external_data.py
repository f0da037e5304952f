"""Weights written to and read from model.onnx.data one tensor at a time, and nodes put in order."""

import os
import stat

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trainer_lib.export.external_data import DataWriter, is_external, read_array, save_structure, sort_nodes


def test_written_tensors_read_back(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "matrix": rng.standard_normal((64, 32)).astype(np.float32),  # 8 KiB: external
        "half": rng.standard_normal((40, 30)).astype(np.float16),  # 2400 bytes: external
        "codes": rng.integers(-64, 64, (2048,)).astype(np.int8),  # 2 KiB: external
        "scale": np.array(0.5, dtype=np.float32),  # a scalar: inline, still a scalar
        "small": np.arange(10, dtype=np.int64),  # 80 bytes: inline
        "strided": rng.standard_normal((32, 64)).astype(np.float32).T,  # not C-contiguous
    }
    with DataWriter(str(tmp_path)) as writer:
        tensors = {name: writer.tensor(name, array) for name, array in arrays.items()}
    assert {name for name, t in tensors.items() if is_external(t)} == {"matrix", "half", "codes", "strided"}
    for name, array in arrays.items():
        got = read_array(tensors[name], str(tmp_path))
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array), name
    data = tmp_path / "model.onnx.data"
    assert os.path.getsize(data) == sum(arrays[n].nbytes for n in ("matrix", "half", "codes", "strided"))
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o644
    offsets = [dict((e.key, e.value) for e in tensors[n].external_data) for n in ("matrix", "half")]
    assert int(offsets[1]["offset"]) == int(offsets[0]["offset"]) + int(offsets[0]["length"]) == arrays["matrix"].nbytes


def test_a_short_data_file_is_an_error(tmp_path):
    with DataWriter(str(tmp_path)) as writer:
        tensor = writer.tensor("w", np.ones((64, 64), np.float32))
    with open(tmp_path / "model.onnx.data", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(ValueError, match="w needs 4096 values"):
        read_array(tensor, str(tmp_path))


def test_sort_nodes_puts_producers_first_and_keeps_ties(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [  # out of order: the Add reads what comes later
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["x"], ["b"], name="neg"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    sort_nodes(model.graph)
    assert [n.name for n in model.graph.node] == ["relu", "neg", "add"]
    onnx.checker.check_model(model)
    save_structure(model, str(tmp_path / "model.onnx"))
    (out,) = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out, [1.0, 0.0])  # relu(x) + (-x)

    loop = helper.make_graph(
        [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])], "loop", [x], [y]
    )
    with pytest.raises(ValueError, match="cycle"):
        sort_nodes(loop)
