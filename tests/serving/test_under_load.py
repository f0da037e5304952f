"""Bursts of concurrent generate requests against a locally served model (benchmarks/load_test.py): every
request answered with the text the same prompt gets alone (nothing lost or crossed), also while a
broken new version is deployed to the same server."""

from __future__ import annotations

import shutil
import threading

import pytest

from benchmarks.load_test import PROMPTS, request, run_load
from tests.serving.helpers import start_server
from trainer_lib.config import load_config
from trainer_lib.config.layers import nest
from trainer_lib.errors import UserError
from trainer_lib.stages.lifecycle import deploy


def _deploy(**values) -> dict:
    return deploy.run(load_config(deploy.CONFIG, None, nest({"model_name": "tiny", "variant": "int8", **values})))


def test_bursts_are_all_answered_also_while_a_broken_version_deploys(export_dir, triton_env, tmp_path):
    repository = str(tmp_path / "repository")
    _deploy(**{"export.path": export_dir, "repository": repository})
    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    (broken / "onnx" / "int8" / "model.onnx").write_bytes(b"this is not an onnx model")
    server = start_server(repository, load=["tiny"], env=triton_env)
    bursts, stop = [], threading.Event()

    def keep_loading():
        while not stop.is_set():
            bursts.append(run_load(server.url, "tiny", requests=20, concurrency=4, max_tokens=8))

    try:
        alone = [request(server.url, "tiny", prompt, 8, 60.0) for prompt in PROMPTS]  # (greedy: deterministic)
        assert all(not error for _, _, error in alone), alone
        bursts.append(run_load(server.url, "tiny", requests=20, concurrency=4, max_tokens=8))
        loader = threading.Thread(target=keep_loading)
        loader.start()
        try:
            with pytest.raises(UserError, match="version 2 failed its load"):
                _deploy(**{"export.path": str(broken), "repository": repository, "triton.url": server.url})
        finally:
            stop.set()
            loader.join(timeout=120)
    finally:
        server.stop()
    assert len(bursts) >= 2  # at least one burst ran while the deploy did
    for figures in bursts:
        assert figures["errors"] == 0, figures["error_examples"]
        assert [text for _, text in figures["answers"]] == [alone[i][1] for i, _ in figures["answers"]]
        assert figures["requests_per_s"] > 0 and 0 < figures["latency_p50_ms"] <= figures["latency_p99_ms"]
