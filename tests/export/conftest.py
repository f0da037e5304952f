"""One FP32 export of the trained tiny model, and its FP16, INT8 and INT4 copies, for the export tests."""

from __future__ import annotations

import os
import types

import pytest

from tests.export.helpers import trained_model_dir  # noqa: F401  (a fixture)


@pytest.fixture(scope="session")
def exported(trained_model_dir, tmp_path_factory):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.export.fp16 import convert_fp16
    from trainer_lib.export.onnx_decoder import export_decoder
    from trainer_lib.export.quantize import quantize_int4, quantize_int8

    root = tmp_path_factory.mktemp("onnx")
    model = AutoModelForCausalLM.from_pretrained(trained_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(trained_model_dir)
    dirs = {name: str(root / name) for name in ("fp32", "fp16", "int8", "int4")}
    layout = export_decoder(model, os.path.join(dirs["fp32"], "model.onnx"))
    quantize_int8(os.path.join(dirs["fp32"], "model.onnx"), os.path.join(dirs["int8"], "model.onnx"))
    quantize_int4(os.path.join(dirs["fp32"], "model.onnx"), os.path.join(dirs["int4"], "model.onnx"))
    convert_fp16(os.path.join(dirs["fp32"], "model.onnx"), os.path.join(dirs["fp16"], "model.onnx"))
    return types.SimpleNamespace(model=model, tokenizer=tokenizer, layout=layout, root=str(root), **dirs)
