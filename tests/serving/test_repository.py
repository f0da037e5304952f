"""The model repository's files and configs, checked without a server."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tests.serving.helpers import torch_greedy
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.serving import repository as repo


def _parse(text: str):
    """The config parsed by protobuf into Triton's ModelConfig (tritonclient ships the proto)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_a_config_that_is_not_a_model_config_is_refused():
    with pytest.raises(ValueError, match="max_batch_sise"):
        repo.config_text({"name": "m", "backend": "python", "max_batch_sise": 4})


@pytest.mark.parametrize("variant, float_type", [("fp32", "TYPE_FP32"), ("fp16", "TYPE_FP16")])
def test_onnx_config_matches_the_graph_and_parses_as_a_model_config(export_dir, variant, float_type):
    onnx_path = os.path.join(export_dir, "onnx", variant, "model.onnx")
    signature = repo.onnx_signature(onnx_path)
    config = repo.onnx_config("posttrain_onnx", [3], signature, instance_kind="gpu")
    text = repo.config_text(config)

    # structurally: the names, types and dims of the graph, batch axis included (max_batch_size 0)
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 0
    assert [i["name"] for i in config["input"]] == [i.name for i in session.get_inputs()]
    assert [o["name"] for o in config["output"]] == [o.name for o in session.get_outputs()]
    for entry, actual in zip(config["input"] + config["output"], session.get_inputs() + session.get_outputs()):
        assert entry["dims"] == [d if isinstance(d, int) else -1 for d in actual.shape]
        expected = {"tensor(int64)": "TYPE_INT64", "tensor(float)": "TYPE_FP32", "tensor(float16)": "TYPE_FP16"}
        assert entry["data_type"] == expected[actual.type]
    cache = [entry["data_type"] for entry in config["input"] + config["output"] if ".key" in entry["name"]]
    assert set(cache) == {float_type} and config["output"][0]["data_type"] == "TYPE_FP32"  # logits
    assert repo.served_versions(text) == [3]

    parsed = _parse(text)
    assert parsed.platform == "onnxruntime_onnx" and parsed.name == "posttrain_onnx"
    assert list(parsed.version_policy.specific.versions) == [3]
    assert parsed.instance_group[0].kind == parsed.instance_group[0].KIND_GPU
    assert not parsed.HasField("optimization")  # TensorRT runs in the generate model, not here
    assert [i.name for i in parsed.input] == [i["name"] for i in config["input"]]
    assert list(parsed.output[0].dims) == config["output"][0]["dims"]
    from tritonclient.grpc.model_config_pb2 import DataType

    assert [DataType.Name(i.data_type) for i in parsed.input] == [i["data_type"] for i in config["input"]]


def test_generate_config_has_the_generate_extension_names():
    text = repo.config_text(repo.generate_config("chat", [1, 2], max_batch_size=4, execution_env="/envs/triton.tar.gz"))
    assert repo.served_versions(text) == [1, 2]
    parsed = _parse(text)
    assert parsed.backend == "python" and parsed.max_batch_size == 4
    assert parsed.HasField("dynamic_batching")
    inputs = {i.name: i for i in parsed.input}
    assert list(inputs) == ["text_input", "max_tokens", "temperature"]
    from tritonclient.grpc.model_config_pb2 import DataType

    assert DataType.Name(inputs["text_input"].data_type) == "TYPE_STRING" and not inputs["text_input"].optional
    assert DataType.Name(inputs["max_tokens"].data_type) == "TYPE_INT32"
    assert DataType.Name(inputs["temperature"].data_type) == "TYPE_FP32"
    assert inputs["max_tokens"].optional and inputs["temperature"].optional
    assert [o.name for o in parsed.output] == ["text_output"]
    assert parsed.parameters["EXECUTION_ENV_PATH"].string_value == "/envs/triton.tar.gz"


def test_a_gpu_version_of_the_fp16_export(export_dir, tmp_path):
    """config.pbtxt places the instances on GPUs; the version holds the fp16 graph and the TensorRT section."""
    config = repo.generate_config("chat", [4], max_batch_size=2, instance_kind="gpu", instance_count=2)
    parsed = _parse(repo.config_text(config))
    (group,) = parsed.instance_group
    assert group.kind == group.KIND_GPU and group.count == 2 and parsed.backend == "python"

    version_dir = tmp_path / "chat" / "4"
    signature = repo.variant_signature(export_dir, "fp16")
    tensorrt = {"max_context": 64, "cache_dir": "", "profile": repo.tensorrt_profile(signature, 2, 64)}
    settings = repo.write_generate_version(export_dir, str(version_dir), "fp16", tensorrt=tensorrt)
    assert settings["variant"] == "fp16" and settings["tensorrt"] == tensorrt
    assert json.loads((version_dir / "generate.json").read_text())["tensorrt"]["profile"]["max"].startswith(
        "input_ids:2x64,attention_mask:2x127,"
    )
    assert sorted(os.listdir(os.path.join(export_dir, "onnx", "fp16"))) == ["model.onnx", "model.onnx.data"]
    assert {"model.py", "ort_generate.py", "model.onnx", "model.onnx.data", "tokenizer"} <= set(os.listdir(version_dir))
    import onnxruntime as ort

    session = ort.InferenceSession(str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()} | {o.name: o.type for o in session.get_outputs()}
    assert types["past_key_values.0.key"] == types["present.1.value"] == "tensor(float16)"
    assert types["logits"] == "tensor(float)"  # as the export writes fp16: every variant's logits alike


def test_an_export_without_the_variant_says_which_it_has(export_dir, tmp_path):
    partial = tmp_path / "export"
    shutil.copytree(export_dir, partial)
    summary = json.loads((partial / "export.json").read_text())
    summary["models"].pop("fp16")
    (partial / "export.json").write_text(json.dumps(summary))
    with pytest.raises(UserError, match=r"has no fp16 model \(it has fp32, int8\)"):
        repo.write_generate_version(str(partial), str(tmp_path / "repo" / "m" / "1"), "fp16")
    assert not (tmp_path / "repo").exists()


def test_version_dir_holds_a_self_contained_generate_model(export_dir, tiny_model_dir, tmp_path):
    """model.py + its loop + model.onnx + tokenizer answer like PyTorch, here in-process (no Triton)."""
    version_dir = str(tmp_path / "repo" / "m" / "1")
    settings = repo.write_generate_version(export_dir, version_dir, "fp32")
    files = set(os.listdir(version_dir))
    assert {"model.py", "ort_generate.py", "model.onnx", "generate.json", "tokenizer"} <= files
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert settings["eos_token_ids"] == [tokenizer.eos_token_id]  # from export.json
    assert settings["pad_token_id"] == tokenizer.pad_token_id
    without_summary = tmp_path / "export"
    shutil.copytree(export_dir, without_summary, ignore=shutil.ignore_patterns("export.json", "onnx"))
    (without_summary / "onnx" / "fp32").mkdir(parents=True)
    (without_summary / "onnx" / "fp32" / "model.onnx").write_bytes(b"")
    fallback = repo.write_generate_version(str(without_summary), str(tmp_path / "other"), "fp32")
    assert (fallback["eos_token_ids"], fallback["pad_token_id"]) == ([tokenizer.eos_token_id], tokenizer.pad_token_id)
    assert json.loads((tmp_path / "repo" / "m" / "1" / "generate.json").read_text())["variant"] == "fp32"

    sys.path.insert(0, version_dir)  # as Triton's stub does
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("copied_model", os.path.join(version_dir, "model.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        generator = module.Generator(version_dir)
        prompts = ["What is two plus two?", "Say hello."]
        texts = generator.generate(prompts, [10, 10], [0.0, 0.0])
    finally:
        sys.path.remove(version_dir)
        sys.modules.pop("ort_generate", None)
    assert texts == [torch_greedy(tiny_model_dir, p, 10) for p in prompts]


def test_missing_export_files_name_the_path(tmp_path):
    (tmp_path / "export" / "tokenizer").mkdir(parents=True)
    with pytest.raises(UserError, match="onnx/int8/model.onnx is missing"):
        repo.write_generate_version(str(tmp_path / "export"), str(tmp_path / "repo" / "m" / "1"), "int8")


@pytest.mark.parametrize(
    "override, key",
    [
        ({"repository": "r"}, "export.path"),
        ({"export": {"path": "e"}}, "repository"),
        ({"export": {"path": "e"}, "repository": "r", "variant": "bf16"}, "variant"),
        ({"export": {"path": "e"}, "repository": "r", "triton": {"url": "triton:8000"}}, "triton.url"),
        ({"export": {"path": "e"}, "repository": "r", "model_name": "a/b"}, "model_name"),
        ({"export": {"path": "e"}, "repository": "r", "instance_kind": "tpu"}, "instance_kind"),
        ({"export": {"path": "e"}, "repository": "r", "tensorrt": {"max_context": 0}}, "tensorrt.max_context"),
    ],
)
def test_deploy_config_errors_name_the_key(override, key):
    from trainer_lib.stages.lifecycle import deploy

    with pytest.raises(ConfigError, match=f"^{key}:"):
        load_config(deploy.CONFIG, None, override)


@pytest.mark.parametrize(
    "variant, kind, resolved, tensorrt",
    [
        ("fp16", "auto", "gpu", True),  # fp16 is for GPUs
        ("fp32", "auto", "cpu", False),
        ("int8", "auto", "cpu", False),
        ("fp32", "gpu", "gpu", True),
        ("int8", "gpu", "gpu", False),  # TensorRT has no dynamic-quantization ops: CUDA serves int8
        ("int4", "auto", "cpu", False),
        ("int4", "gpu", "gpu", False),  # MatMulNBits: onnxruntime's own kernels, not TensorRT's
        ("fp16", "cpu", "cpu", False),  # runs, slower (deploy says so)
    ],
)
def test_the_instance_kind_follows_the_variant(variant, kind, resolved, tensorrt):
    from trainer_lib.stages.lifecycle import deploy

    cfg = load_config(
        deploy.CONFIG, None, {"export": {"path": "e"}, "repository": "r", "variant": variant, "instance_kind": kind}
    )
    assert cfg.kind == resolved
    assert (cfg.tensorrt_settings() is not None) == tensorrt
    cfg.tensorrt.enabled = False
    assert cfg.tensorrt_settings() is None
