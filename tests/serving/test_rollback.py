"""``posttrain deploy rollback`` against a real tritonserver: the previous (or a given) version serves again,
and a version that does not load is never switched to."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from tests.conftest import REPO, clean_env
from tests.serving.helpers import start_server
from trainer_lib import storage
from trainer_lib.config import load_config
from trainer_lib.config.layers import nest
from trainer_lib.errors import UserError
from trainer_lib.serving import repository as repo
from trainer_lib.serving.client import connected, generate
from trainer_lib.stages.lifecycle import deploy, rollback

MODEL = "chat"
PROMPT = "What is two plus two?"


def _run(module, **values) -> dict:
    return module.run(load_config(module.CONFIG, None, nest({"model_name": MODEL, **values})))


def _answer(url: str) -> dict:
    with connected(url) as client:
        return generate(client, MODEL, PROMPT, max_tokens=8)


@pytest.fixture(scope="module")
def served(export_dir, triton_env, tmp_path_factory):
    """Version 1 (int8) published before the server starts, then version 2 (fp32) deployed on it."""
    repository = str(tmp_path_factory.mktemp("rollback") / "triton")
    assert _run(deploy, **{"export.path": export_dir, "repository": repository, "variant": "int8"})["version"] == 1
    server = start_server(repository, load=[MODEL], env=triton_env)
    try:
        first = _answer(server.url)
        values = {"export.path": export_dir, "repository": repository, "variant": "fp32", "triton.url": server.url}
        assert _run(deploy, **values)["version"] == 2
        yield types.SimpleNamespace(
            url=server.url,
            repository=repository,
            model_dir=f"{repository}/{MODEL}",
            first=first,
            second=_answer(server.url),
        )
    finally:
        server.stop()


def _history(served) -> dict:
    return json.loads(storage.read_text(f"{served.model_dir}/deploy.json"))


def test_rollback_serves_the_previous_version_then_returns(served):
    assert served.second["model_version"] == "2"
    argv = ["deploy", "rollback", f"repository={served.repository}", f"model_name={MODEL}", f"triton.url={served.url}"]
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", *argv],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["version"], summary["previous_version"], summary["loaded"]) == (1, 2, True)
    assert summary["smoke"]["model_version"] == "1"
    assert "rolling chat back from version 2 to version 1" in proc.stderr
    assert _answer(served.url) == served.first  # version 1's own answer, from version 1
    assert repo.served_versions(repo.read_config(served.model_dir)) == [1]
    history = _history(served)
    assert history["serving"] == 1 and history["versions"][-1]["status"] == "rolled back to"
    assert history["versions"][-1]["from"] == 2
    # the previous one of version 1 is now version 2: a second rollback undoes the first
    again = _run(rollback, repository=served.repository, **{"triton.url": served.url})
    assert (again["version"], again["previous_version"]) == (2, 1)
    assert _answer(served.url) == served.second
    assert repo.versions(served.model_dir) == [1, 2]  # nothing removed


def test_rollback_to_a_version_that_fails_to_load_keeps_the_current_one(served, tmp_path):
    current = repo.served_versions(repo.read_config(served.model_dir))[-1]
    other = 3 - current
    onnx = f"{served.model_dir}/{other}/model.onnx"
    kept = storage.read_bytes(onnx)
    storage.write_bytes(onnx, b"this is not an onnx model")
    try:
        with pytest.raises(UserError, match=f"version {other} failed its load .*; version {current} still serves"):
            _run(rollback, repository=served.repository, to_version=other, **{"triton.url": served.url})
    finally:
        storage.write_bytes(onnx, kept)
    assert repo.served_versions(repo.read_config(served.model_dir)) == [current]
    assert _answer(served.url)["model_version"] == str(current)
    assert _history(served)["versions"][-1]["status"] == "rollback failed"
    assert _history(served)["serving"] == current
    with pytest.raises(UserError, match=r"to_version: version 7 is not in the repository \(it keeps 1, 2;"):
        _run(rollback, repository=served.repository, to_version=7, **{"triton.url": served.url})
    with pytest.raises(UserError, match=f"version {current} is already the serving one"):
        _run(rollback, repository=served.repository, to_version=current)


def test_the_target_is_the_newest_earlier_version_still_kept():
    history = {
        "versions": [
            {"version": 1, "status": "served"},
            {"version": 2, "status": "served"},
            {"version": 3, "status": "failed"},
            {"version": 4, "status": "served"},
        ]
    }
    assert rollback.target_version(history, 4, [2, 4], 0) == 2  # 3 failed; 1 was pruned
    with pytest.raises(
        UserError, match="no earlier version to roll back to: version 4 serves and the repository keeps 4"
    ):
        rollback.target_version(history, 4, [4], 0)
