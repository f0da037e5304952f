"""``posttrain serve`` in the foreground, as a user runs it: endpoint printed, generate works, Ctrl-C stops."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import clean_env
from trainer_lib.config import load_config
from trainer_lib.config.layers import nest
from trainer_lib.stages.lifecycle import deploy

SERVE = "import sys; from trainer_lib.cli import main; sys.exit(main(['serve', *sys.argv[1:]]))"


def deployed_tiny(export_dir: str, repository: str) -> str:
    """The tiny export published as model ``tiny`` (FP32) into ``repository``."""
    deploy.run(
        load_config(
            deploy.CONFIG,
            None,
            nest({"export.path": export_dir, "repository": repository, "model_name": "tiny", "variant": "fp32"}),
        )
    )
    return repository


def _serve(log, *args: str) -> subprocess.Popen:
    """The server's stderr (its own log and Triton's) goes to the file ``log``: a pipe nobody reads
    would block the server once Triton had logged 64 KiB."""
    return subprocess.Popen(
        [sys.executable, "-c", SERVE, *args], stdout=subprocess.PIPE, stderr=log, text=True, env=clean_env()
    )


def test_serve_and_deploy_as_a_user_runs_them_on_an_s3_repository(
    s3_bucket, export_dir, tiny_model_dir, triton_env, tmp_path
):
    """`posttrain serve --repo s3://...` in the foreground, then `posttrain deploy ... triton.url=...`: the
    new FP32 version answers `text_input` over HTTP with PyTorch's greedy text; Ctrl-C stops the server."""
    from tests.serving.helpers import torch_greedy
    from trainer_lib import storage

    export, repository = f"s3://{s3_bucket}/export", f"s3://{s3_bucket}/triton"
    storage.copy(export_dir, export)
    deploy.run(
        load_config(deploy.CONFIG, None, nest({"export.path": export, "repository": repository, "model_name": "tiny"}))
    )  # version 1: publish only
    log = open(tmp_path / "serve.log", "w+", encoding="utf-8")
    proc = _serve(
        log,
        "--repo",
        repository,
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--env",
        triton_env,
        "--timeout",
        "60",
    )
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            pytest.skip(f"tritonserver cannot start: {(tmp_path / 'serve.log').read_text()[-2000:]}")
        endpoint = json.loads(line)
        assert endpoint["http"].startswith("http://127.0.0.1:")
        assert {"name": "tiny", "version": "1", "state": "READY"} in endpoint["models"]

        deployed = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer_lib.cli",
                "deploy",
                f"export.path={export}",
                f"repository={repository}",
                f"triton.url={endpoint['http']}",
                "model_name=tiny",
                "variant=fp32",
            ],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=300,
        )
        assert deployed.returncode == 0, deployed.stderr[-2000:]
        summary = json.loads(deployed.stdout)
        assert summary["version"] == 2 and summary["loaded"]

        prompt = "What is two plus two?"
        req = urllib.request.Request(
            f"{endpoint['http']}/v2/models/tiny/generate",
            method="POST",
            data=json.dumps({"text_input": prompt, "max_tokens": 12}).encode(),
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.loads(resp.read())
        assert body["model_name"] == "tiny" and body["model_version"] == "2"
        assert body["text_output"] == torch_greedy(tiny_model_dir, prompt, 12) != ""
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        log.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "/nonexistent"], "make triton-env"),
        (["--load", "m"], "is empty or missing"),
    ],
)
def test_serve_errors_say_what_to_do(tmp_path, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    repo = str(empty) if "--load" in args else str(tmp_path)
    if "--env" in args:
        (tmp_path / "m").mkdir()  # not empty, so the environment is what fails
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "--repo", repo, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_serve_ask_prints_the_served_answer_next_to_pytorch(export_dir, tiny_model_dir, triton_env, tmp_path):
    """`posttrain serve --ask TEXT --chat --compare MODEL` (what `make demo` ends with): one request, both answers."""
    repository = deployed_tiny(export_dir, str(tmp_path / "repo"))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVE,
            "--repo",
            repository,
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--env",
            triton_env,
            "--ask",
            "Say hello.",
            "--max-tokens",
            "8",
            "--chat",
            "--compare",
            tiny_model_dir,
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    if proc.returncode == 1 and "tritonserver" in proc.stderr:
        pytest.skip(f"tritonserver cannot start: {proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["model"] == "tiny" and answer["prompt"].endswith("\n") and "Say hello." in answer["prompt"]
    assert answer["text_output"] == answer["pytorch"] != ""
    assert "served (tiny v1)" in proc.stderr and "PyTorch (" in proc.stderr


def test_serve_url_asks_a_server_started_elsewhere(export_dir, triton_env, tmp_path):
    """`posttrain serve --url URL --ask TEXT` (make demo-containers: Triton in its own container): no server of
    its own, the answer of the one running at URL."""
    from trainer_lib.serving.server import TritonServer, free_port

    repository = deployed_tiny(export_dir, str(tmp_path / "repo"))
    with TritonServer(repository, load=["tiny"], env=triton_env) as server:
        proc = subprocess.run(
            [sys.executable, "-c", SERVE, "--url", server.url, "--ask", "Say hello.", "--max-tokens", "8"],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        assert answer["model"] == "tiny" and answer["model_version"] == "1" and answer["text_output"]
    port = free_port()  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "--url", f"http://127.0.0.1:{port}", "--ask", "x", "--timeout", "2"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 1 and f"no ready Triton server at http://127.0.0.1:{port}" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "--url", server.url], capture_output=True, text=True, env=clean_env()
    )
    assert proc.returncode == 2 and "--url: only with --ask" in proc.stderr
