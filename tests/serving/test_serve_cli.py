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
from trainer_lib.stage_api import nest
from trainer_lib.stages import deploy

SERVE = "import sys; from trainer_lib.cli import main; sys.exit(main(['serve', *sys.argv[1:]]))"


def _serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env())


def test_serve_prints_the_endpoint_answers_generate_and_stops_on_ctrl_c(export_dir, triton_env, tmp_path):
    repository = str(tmp_path / "repo")
    deploy.run(load_config(deploy.CONFIG, None, nest({"export.path": export_dir, "repository": repository,
                                                      "model_name": "tiny"})))
    proc = _serve("--repo", repository, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                  "--env", triton_env, "--timeout", "60")
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            pytest.skip(f"tritonserver cannot start: {proc.stderr.read()[-2000:]}")
        endpoint = json.loads(line)
        assert endpoint["http"].startswith("http://127.0.0.1:")
        assert {"name": "tiny", "version": "1", "state": "READY"} in endpoint["models"]
        req = urllib.request.Request(f"{endpoint['http']}/v2/models/tiny/generate", method="POST",
                                     data=json.dumps({"text_input": "Say hello.", "max_tokens": 3}).encode())
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.loads(resp.read())
        assert body["model_name"] == "tiny" and isinstance(body["text_output"], str)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("args, message", [
    (["--env", "/nonexistent"], "make triton-env"),
    (["--load", "m"], "is empty or missing"),
])
def test_serve_errors_say_what_to_do(tmp_path, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    repo = str(empty) if "--load" in args else str(tmp_path)
    if "--env" in args:
        (tmp_path / "m").mkdir()  # not empty, so the environment is what fails
    proc = subprocess.run([sys.executable, "-c", SERVE, "--repo", repo, *args], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
