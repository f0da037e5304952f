"""Where the generate model's onnxruntime session runs: the providers model.py asks for, per Triton instance.

The choice is a pure function of what onnxruntime has and where Triton placed the instance; the GPU cases
are checked as data here (no GPU on these machines), the CPU case also through a real session.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from trainer_lib.serving import repository as repo
from trainer_lib.serving import triton_generate_model as model

GPU_BUILD = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
CUDA_BUILD = ["CUDAExecutionProvider", "CPUExecutionProvider"]
CPU_BUILD = ["CPUExecutionProvider"]
TRT = {"trt_fp16_enable": True, "trt_engine_cache_path": "/cache"}


def test_a_gpu_instance_tries_tensorrt_then_cuda_on_its_device_then_the_cpu():
    assert model.execution_providers(GPU_BUILD, "GPU", 3, TRT) == [
        ("TensorrtExecutionProvider", {"trt_fp16_enable": True, "trt_engine_cache_path": "/cache", "device_id": 3}),
        ("CUDAExecutionProvider", {"device_id": 3}),
        ("CPUExecutionProvider", {}),
    ]
    assert TRT == {"trt_fp16_enable": True, "trt_engine_cache_path": "/cache"}  # the caller's options untouched


def test_a_gpu_instance_without_tensorrt_gets_cuda():
    expected = [("CUDAExecutionProvider", {"device_id": 1}), ("CPUExecutionProvider", {})]
    assert model.execution_providers(CUDA_BUILD, "GPU", 1, TRT) == expected  # this onnxruntime has none
    assert model.execution_providers(GPU_BUILD, "GPU", 1, None) == expected  # deploy asked for none (int8)


def test_a_gpu_instance_on_a_cpu_only_onnxruntime_falls_back_to_the_cpu():
    assert model.execution_providers(CPU_BUILD, "GPU", 0, TRT) == [("CPUExecutionProvider", {})]


@pytest.mark.parametrize("kind", ["CPU", "MODEL"])
def test_other_instances_run_on_the_cpu_whatever_onnxruntime_has(kind):
    assert model.execution_providers(GPU_BUILD, kind, 0, TRT) == [("CPUExecutionProvider", {})]


def test_tensorrt_options_build_fp16_engines_cached_for_the_profile(export_dir):
    signature = repo.onnx_signature(os.path.join(export_dir, "onnx", "fp16", "model.onnx"))
    profile = repo.tensorrt_profile(signature, max_batch_size=4, max_context=64)
    options = model.tensorrt_options("/engines", profile)
    assert options == {
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": "/engines",
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": "/engines",
        "trt_profile_min_shapes": profile["min"],
        "trt_profile_opt_shapes": profile["opt"],
        "trt_profile_max_shapes": profile["max"],
    }
    assert "trt_profile_min_shapes" not in model.tensorrt_options("/engines", None)


def test_the_tensorrt_profile_spans_prefill_and_decode(export_dir):
    """The tiny model: 2 layers, 2 KV heads of width 16. At each end the mask spans cached + new tokens."""
    signature = repo.onnx_signature(os.path.join(export_dir, "onnx", "fp16", "model.onnx"))
    profile = repo.tensorrt_profile(signature, max_batch_size=4, max_context=64)

    def shapes(end: str) -> dict:
        return dict(item.split(":") for item in profile[end].split(","))

    past = [f"past_key_values.{i}.{kind}" for i in range(2) for kind in ("key", "value")]
    assert list(shapes("min")) == ["input_ids", "attention_mask", "position_ids", *past]
    assert shapes("min") == {"input_ids": "1x1", "attention_mask": "1x1", "position_ids": "1x1"} | {
        name: "1x2x0x16" for name in past
    }
    assert shapes("opt") == {"input_ids": "1x1", "attention_mask": "1x33", "position_ids": "1x1"} | {
        name: "1x2x32x16" for name in past
    }
    assert shapes("max") == {"input_ids": "4x64", "attention_mask": "4x127", "position_ids": "4x64"} | {
        name: "4x2x63x16" for name in past
    }
    assert repo.tensorrt_profile(signature, 1, 8192)["opt"].split(",")[1] == "attention_mask:1x1025"


def test_a_graph_that_is_not_the_exports_decoder_has_no_profile():
    signature = {"inputs": [("pixel_values", "TYPE_FP32", [-1, 3, 224, 224])], "outputs": []}
    with pytest.raises(Exception, match="pixel_values"):
        repo.tensorrt_profile(signature, 1, 16)


def test_engines_go_to_the_named_dir_else_the_version_dir_else_the_temp_dir(tmp_path, monkeypatch):
    version_dir = tmp_path / "repo" / "chat" / "7"
    version_dir.mkdir(parents=True)
    named = model.engine_cache_dir(str(version_dir), str(tmp_path / "volume"), "chat", "7")
    assert named == str(tmp_path / "volume" / "chat" / "7") and os.path.isdir(named)
    assert model.engine_cache_dir(str(version_dir)) == str(version_dir / "tensorrt_cache")
    assert (version_dir / "tensorrt_cache").is_dir()
    # a version dir that cannot take a subdirectory (here a file; KServe mounts the repository read-only)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    fallback = model.engine_cache_dir(str(blocked), "", "chat", "7")
    assert fallback == str(tmp_path / "tmp" / "posttrain-tensorrt" / "chat" / "7") and os.path.isdir(fallback)


def test_a_gpu_instance_on_this_machine_gets_what_this_onnxruntime_has(export_dir, tmp_path):
    """instance_providers reads the real onnxruntime: here a CPU build, so a GPU instance with a TensorRT
    section still gets the CPU, and the session it configures runs."""
    import onnxruntime as ort

    from trainer_lib.export.ort_generate import OrtDecoder

    version_dir = tmp_path / "m" / "1"
    settings = repo.write_generate_version(
        export_dir, str(version_dir), "fp16", tensorrt={"max_context": 64, "cache_dir": "", "profile": None}
    )
    args = {"model_instance_kind": "GPU", "model_instance_device_id": "0", "model_name": "m", "model_version": "1"}
    providers = model.instance_providers(args, str(version_dir), settings)
    available = ort.get_available_providers()
    gpu_ones = [name for name in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if name in available]
    assert [name for name, _ in providers] == [*gpu_ones, "CPUExecutionProvider"]
    assert (version_dir / "tensorrt_cache").exists() == ("TensorrtExecutionProvider" in available)
    decoder = OrtDecoder(str(version_dir / "model.onnx"), providers=providers)
    assert decoder.session.get_providers()[-1] == "CPUExecutionProvider"
    assert len(decoder.generate([[5, 6, 7]], 3)[0]) == 3


def test_a_tensorrt_context_refuses_longer_requests_by_name(export_dir, tmp_path):
    import sys

    version_dir = tmp_path / "m" / "1"
    repo.write_generate_version(export_dir, str(version_dir), "fp32")
    sys.path.insert(0, str(version_dir))
    try:
        generator = model.Generator(str(version_dir))
    finally:
        sys.path.remove(str(version_dir))
        sys.modules.pop("ort_generate", None)
    prompt = "What is two plus two?"
    length = len(generator.tokenizer.encode(prompt).ids)
    generator.check_length([prompt], [10**6])  # no TensorRT: no bound
    generator.max_context = length + 4
    generator.check_length([prompt, prompt], [4, 1])
    with pytest.raises(ValueError, match=rf"{length} prompt tokens \+ max_tokens 5 exceed the {length + 4} tokens"):
        generator.check_length([prompt, prompt], [1, 5])
