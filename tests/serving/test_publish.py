"""``posttrain deploy`` without a server: the repository it publishes, version after version."""

from __future__ import annotations

import json
import os

import pytest

from trainer_lib.config import load_config
from trainer_lib.config.layers import nest
from trainer_lib.serving import repository as repo
from trainer_lib.stages.lifecycle import deploy


def test_publish_only_writes_both_models_and_keeps_the_last_versions(export_dir, tmp_path):
    root = str(tmp_path / "repo")
    values = {
        "export.path": export_dir,
        "repository": root,
        "model_name": "m",
        "variant": "fp16",  # instance_kind=auto: on GPUs, with TensorRT
        "keep_versions": 2,
        "publish_onnx": True,
        "max_batch_size": 4,
        "tensorrt.max_context": 256,
        "execution_env": "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
    }
    results = [deploy.run(load_config(deploy.CONFIG, None, nest(values))) for _ in range(3)]
    assert [r["version"] for r in results] == [1, 2, 3]
    assert [r["previous_version"] for r in results] == [None, 1, 2]
    assert all(not r["loaded"] and r["endpoint"] is None for r in results)
    assert all(r["instance_kind"] == "gpu" and r["tensorrt"] and r["variant"] == "fp16" for r in results)

    assert sorted(os.listdir(root)) == ["m", "m_onnx"]
    assert repo.versions(os.path.join(root, "m")) == [2, 3] == repo.versions(os.path.join(root, "m_onnx"))
    assert {"model.py", "ort_generate.py", "model.onnx", "model.onnx.data", "tokenizer", "generate.json"} <= set(
        os.listdir(os.path.join(root, "m", "3"))
    )
    assert sorted(os.listdir(os.path.join(root, "m_onnx", "3"))) == ["model.onnx", "model.onnx.data"]
    generate_config = repo.read_config(os.path.join(root, "m"))
    onnx_config = repo.read_config(os.path.join(root, "m_onnx"))
    assert repo.served_versions(generate_config) == [3] == repo.served_versions(onnx_config)
    assert 'backend: "python"' in generate_config and "KIND_GPU" in generate_config
    assert 'string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz"' in generate_config
    assert 'platform: "onnxruntime_onnx"' in onnx_config and "KIND_GPU" in onnx_config
    assert "TYPE_FP16" in onnx_config and "optimization" not in onnx_config
    settings = json.loads((tmp_path / "repo" / "m" / "3" / "generate.json").read_text())
    assert settings["variant"] == "fp16" and settings["tensorrt"]["max_context"] == 256
    assert settings["tensorrt"]["cache_dir"] == ""
    assert settings["tensorrt"]["profile"]["max"].startswith("input_ids:4x256,attention_mask:4x511,")
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        pass
    else:
        for text in (generate_config, onnx_config):
            text_format.Parse(text, model_config_pb2.ModelConfig())
    history = json.loads((tmp_path / "repo" / "m" / "deploy.json").read_text())
    assert history["serving"] == 3 and [e["status"] for e in history["versions"]] == ["published"] * 3
    assert {e["instance_kind"] for e in history["versions"]} == {"gpu"}


@pytest.mark.parametrize(
    "values, kind",
    [
        ({"variant": "fp16", "instance_kind": "cpu"}, "KIND_CPU"),
        ({"variant": "int8", "instance_kind": "gpu"}, "KIND_GPU"),
        ({"variant": "fp32", "instance_kind": "gpu", "tensorrt.enabled": False}, "KIND_GPU"),
    ],
)
def test_only_fp16_and_fp32_on_gpus_get_tensorrt(export_dir, tmp_path, capsys, values, kind):
    root = tmp_path / "repo"
    values = {"export.path": export_dir, "repository": str(root), "model_name": "m", **values}
    result = deploy.run(load_config(deploy.CONFIG, None, nest(values)))
    assert not result["tensorrt"] and kind in repo.read_config(str(root / "m"))
    assert "tensorrt" not in json.loads((root / "m" / "1" / "generate.json").read_text())
    slow = "fp16 on CPU instances runs, but slower than fp32" in capsys.readouterr().err
    assert slow == (kind == "KIND_CPU")
