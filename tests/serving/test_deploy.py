"""``posttrain deploy`` against a real tritonserver whose model repository lives on the local S3 server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
import urllib.error
import urllib.request
import uuid

import pytest

from tests.conftest import clean_env
from tests.serving.helpers import start_server, torch_greedy
from trainer_lib import storage
from trainer_lib.config import load_config
from trainer_lib.config.layers import nest
from trainer_lib.errors import UserError
from trainer_lib.serving import repository as repo
from trainer_lib.serving.client import connected, generate
from trainer_lib.stages.lifecycle import deploy

MODEL = "chat"
PROMPT = "What is two plus two?"


def _deploy(**values) -> dict:
    return deploy.run(load_config(deploy.CONFIG, None, nest({"model_name": MODEL, **values})))


@pytest.fixture(scope="module")
def served(s3_server, export_dir, triton_env, tmp_path_factory):
    """Version 1 (int8) published to s3://<bucket>/triton before the server starts, then served."""
    import boto3

    bucket = f"serving-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    storage.configure(reset=True, endpoint_url=s3_server.endpoint_url, cache_dir=str(tmp_path_factory.mktemp("cache")))
    export = f"s3://{bucket}/export"
    storage.copy(export_dir, export)
    repository = f"s3://{bucket}/triton"
    first = _deploy(**{"export.path": export, "repository": repository, "variant": "int8"})
    assert first["version"] == 1 and not first["loaded"]
    server = start_server(repository, load=[MODEL], env=triton_env)
    try:
        yield types.SimpleNamespace(
            server=server, url=server.url, repository=repository, export=export, model_dir=f"{repository}/{MODEL}"
        )
    finally:
        server.stop()
        storage.configure(reset=True)


def _serving(served) -> int:
    return repo.served_versions(repo.read_config(served.model_dir))[-1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_deploy_fp32_serves_pytorch_greedy_text(served, tiny_model_dir):
    before = _serving(served)
    result = _deploy(
        **{"export.path": served.export, "repository": served.repository, "variant": "fp32", "triton.url": served.url}
    )
    assert result["version"] == before + 1 and result["previous_version"] == before and result["loaded"]
    assert result["endpoint"] == served.url and result["smoke"]["model_version"] == str(result["version"])
    assert repo.served_versions(repo.read_config(served.model_dir)) == [result["version"]]

    expected = torch_greedy(tiny_model_dir, PROMPT, 12)
    assert expected  # a random tiny model rarely stops at once; an empty string would prove little
    with connected(served.url) as client:
        answer = generate(client, MODEL, PROMPT, max_tokens=12)
        assert answer == {"text_output": expected, "model_version": str(result["version"])}
        # temperature > 0 samples; it still answers with text
        assert isinstance(generate(client, MODEL, PROMPT, max_tokens=5, temperature=0.8)["text_output"], str)
    # Triton's generate extension maps the JSON fields onto the same inputs
    body = _post(result["generate_url"], {"text_input": PROMPT, "max_tokens": 12})
    assert body["text_output"] == expected and body["model_version"] == str(result["version"])
    # without max_tokens the default applies (64 here), still stopping at eos
    assert _post(result["generate_url"], {"text_input": PROMPT})["text_output"].startswith(expected)
    # a bad request is answered with its reason, and only that request fails
    with pytest.raises(urllib.error.HTTPError) as failed:
        _post(result["generate_url"], {"text_input": ""})
    assert failed.value.code == 400 and "text_input: empty prompt" in failed.value.read().decode()


def test_broken_version_fails_its_load_and_the_old_one_keeps_serving(served, export_dir, tmp_path):
    before = _serving(served)
    with connected(served.url) as client:
        reference = generate(client, MODEL, PROMPT, max_tokens=6)
    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    (broken / "onnx" / "int8" / "model.onnx").write_bytes(b"this is not an onnx model")
    # through the command line: the error is printed and the exit code is not 0
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_lib.cli",
            "deploy",
            f"export.path={broken}",
            f"repository={served.repository}",
            f"triton.url={served.url}",
            f"model_name={MODEL}",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    failed = before + 1
    assert f"version {failed} failed its load" in proc.stderr and f"version {before} still serves" in proc.stderr

    assert repo.served_versions(repo.read_config(served.model_dir)) == [before]
    assert failed not in repo.versions(served.model_dir)
    history = json.loads(storage.read_text(f"{served.model_dir}/deploy.json"))
    assert history["versions"][-1]["version"] == failed and history["versions"][-1]["status"] == "failed"
    with connected(served.url) as client:
        assert generate(client, MODEL, PROMPT, max_tokens=6) == reference
    # version numbers are never reused, so a cache or a log never confuses the failed one with the next
    ok = _deploy(**{"export.path": served.export, "repository": served.repository, "triton.url": served.url})
    assert ok["version"] == failed + 1


def test_version_that_loads_but_fails_the_smoke_test_is_rolled_back(served):
    before = _serving(served)
    with connected(served.url) as client:
        reference = generate(client, MODEL, PROMPT, max_tokens=6)
    # max_tokens above the model's limit (generate.json) makes the smoke request fail after a good load
    with pytest.raises(UserError, match=f"version {before + 1} failed its smoke test .*max_tokens"):
        _deploy(
            **{
                "export.path": served.export,
                "repository": served.repository,
                "triton.url": served.url,
                "smoke_max_tokens": 10**6,
            }
        )
    assert repo.served_versions(repo.read_config(served.model_dir)) == [before]
    with connected(served.url) as client:
        assert generate(client, MODEL, PROMPT, max_tokens=6) == reference
    states = {(m["version"], m.get("state")) for m in served.server.model_states() if m["name"] == MODEL}
    assert (str(before), "READY") in states and (str(before + 1), "READY") not in states


def test_unreachable_server_publishes_nothing(served):
    versions = repo.versions(served.model_dir)
    with pytest.raises(UserError, match="triton.url: no Triton server answers"):
        _deploy(
            **{
                "export.path": served.export,
                "repository": served.repository,
                "triton.url": "http://127.0.0.1:9",
                "timeout_s": 5,
            }
        )
    assert repo.versions(served.model_dir) == versions


def test_concurrent_requests_each_get_their_own_answer(served):
    """The dynamic batcher hands model.py several requests at once (mixed max_tokens, some with an
    explicit temperature=0 input and some without): each still gets the text it gets alone."""
    import concurrent.futures

    prompts = [
        ("What is two plus two?", 8, None),
        ("Say hello.", 5, 0.0),
        ("Name a color.", 8, None),
        ("Is the sky green?", 3, 0.0),
    ] * 3

    def ask(item):
        with connected(served.url) as client:
            return generate(client, MODEL, item[0], max_tokens=item[1], temperature=item[2])["text_output"]

    alone = [ask(item) for item in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone
