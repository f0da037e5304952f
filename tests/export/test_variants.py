"""Which variant is served: the one asked for if the export wrote it, else an error naming why; auto the
smallest a CPU serves."""

import pytest

from trainer_lib.errors import UserError
from trainer_lib.export.variants import pick

SUMMARY = {
    "models": {"fp32": "onnx/fp32/model.onnx", "fp16": "onnx/fp16/model.onnx", "int8": "onnx/int8/model.onnx"},
    "failed": {"int4": "parity.int4_min_top1_agreement: top-1 agreement with PyTorch 0.690 < 0.85"},
    "file_bytes": {"fp32": 538_000_000, "fp16": 269_000_000, "int8": 155_000_000},
}


def test_a_written_variant_is_itself():
    assert [pick(SUMMARY, name, "variant") for name in ("fp32", "fp16", "int8")] == ["fp32", "fp16", "int8"]


def test_auto_is_the_smallest_written():
    assert pick(SUMMARY, "auto", "variant") == "int8"
    with_int4 = {
        **SUMMARY,
        "models": {**SUMMARY["models"], "int4": "onnx/int4/model.onnx"},
        "file_bytes": {**SUMMARY["file_bytes"], "int4": 90_000_000},
    }
    assert pick(with_int4, "auto", "variant") == "int4"


def test_auto_without_int8_falls_back_to_fp32_not_fp16():
    """FP16 is smaller than FP32, but a CPU cannot serve it: a laptop whose INT8 failed its parity gets FP32."""
    without_int8 = {**SUMMARY, "models": {k: v for k, v in SUMMARY["models"].items() if k != "int8"}}
    assert pick(without_int8, "auto", "variant") == "fp32"
    assert pick(without_int8, "fp16", "variant") == "fp16"  # by name it is still served


def test_auto_with_only_fp16_says_so():
    only_fp16 = {**SUMMARY, "models": {"fp16": "onnx/fp16/model.onnx"}}
    with pytest.raises(UserError, match="variant: auto picks a variant a CPU serves, and the export wrote only fp16"):
        pick(only_fp16, "auto", "variant")


def test_a_variant_left_out_names_its_figure():
    with pytest.raises(UserError, match=r"served.variant: the export left int4 out .* 0.690 < 0.85\); serve one"):
        pick(SUMMARY, "int4", "served.variant")


def test_a_variant_never_exported_says_what_there_is():
    with pytest.raises(UserError, match="variant: 'int4' is not in the export \\(it has fp32, fp16, int8\\)"):
        pick({**SUMMARY, "failed": {}}, "int4", "variant")
