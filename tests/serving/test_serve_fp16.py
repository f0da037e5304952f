"""The fp16 export served by a real tritonserver. These machines have no GPU, so on CPU instances
(``instance_kind=cpu``, which deploy warns is slow): the float16 KV cache and logits pass through model.py
and the shared generation loop, and the server log names the providers the session got."""

from __future__ import annotations

import sys

from tests.serving.helpers import start_server
from trainer_lib.config import load_config
from trainer_lib.config.layers import nest
from trainer_lib.serving import triton_generate_model as model
from trainer_lib.serving.client import connected, generate
from trainer_lib.stages.lifecycle import deploy

PROMPTS = ["What is two plus two?", "Say hello."]


def _in_process(version_dir: str, prompts: list[str], max_tokens: int) -> list[str]:
    """The same version's generate model without Triton (as the stub imports it: its dir on sys.path)."""
    sys.path.insert(0, version_dir)
    try:
        return model.Generator(version_dir).generate(prompts, [max_tokens] * len(prompts), [0.0] * len(prompts))
    finally:
        sys.path.remove(version_dir)
        sys.modules.pop("ort_generate", None)


def test_fp16_serves_on_cpu_instances_what_it_generates_in_process(export_dir, triton_env, tmp_path):
    repository = tmp_path / "repository"
    values = {"export.path": export_dir, "repository": str(repository), "model_name": "half", "variant": "fp16"}
    published = deploy.run(load_config(deploy.CONFIG, None, nest({**values, "instance_kind": "cpu"})))
    assert published["instance_kind"] == "cpu" and not published["tensorrt"]
    version_dir = str(repository / "half" / "1")
    expected = _in_process(version_dir, PROMPTS, 10)
    assert all(expected)  # a tiny random model rarely stops at once; empty strings would prove little

    server = start_server(str(repository), load=["half"], env=triton_env)
    try:
        with connected(server.url) as client:
            answers = [generate(client, "half", prompt, max_tokens=10) for prompt in PROMPTS]
        log = server.log_tail(100_000)
    finally:
        server.stop()
    assert [a["text_output"] for a in answers] == expected and {a["model_version"] for a in answers} == {"1"}
    assert "half version 1 on CPU 0: asked onnxruntime for ['CPUExecutionProvider']" in log
    assert "the session runs on ['CPUExecutionProvider']" in log
