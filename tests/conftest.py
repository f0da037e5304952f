"""Shared pytest fixtures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

# The DAG module first, while this process holds a few hundred modules: kfp's task methods call
# inspect.stack() as the pipelines are built at import, and each frame of an import resolves its module by
# scanning sys.modules, so the same import after torch, transformers and deepspeed took 40 s of collection.
import pipelines.dag  # noqa: F401

#: The repository root (tests in sub-folders find the examples, the README and the test data from here).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """A real moto S3 server in a subprocess; tests talk HTTP to it, nothing is mocked."""
    port = _free_port()
    exe = Path(sys.executable).with_name("moto_server")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer means it is up
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"moto_server did not start on {endpoint}:\n{log.read().decode(errors='replace')}")
                time.sleep(0.1)
        with pytest.MonkeyPatch.context() as mp:
            for var in (
                "AWS_SESSION_TOKEN",
                "AWS_SECURITY_TOKEN",
                "AWS_PROFILE",
                "AWS_ENDPOINT_URL_S3",
                "S3_ENDPOINT_URL",
                "AWS_REGION",
            ):
                mp.delenv(var, raising=False)
            mp.setenv("AWS_ACCESS_KEY_ID", "testing")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
            mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
            mp.setenv("AWS_ENDPOINT_URL", endpoint)
            # keep a developer's ~/.aws out of the tests
            mp.setenv("AWS_CONFIG_FILE", os.devnull)
            mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
            yield types.SimpleNamespace(endpoint_url=endpoint, port=port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def s3_bucket(s3_server, tmp_path):
    """A fresh bucket on the moto server, with trainer_lib.storage pointed at it."""
    import boto3

    from trainer_lib import storage

    name = f"test-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=name)
    storage.configure(reset=True, endpoint_url=s3_server.endpoint_url, cache_dir=str(tmp_path / "cache"))
    yield name
    storage.configure(reset=True)


# --------------------------------------------------------------------------- tiny models and data

CHAT_ROWS = [
    ("What is two plus two?", "Four."),
    ("Name a color.", "Blue."),
    ("Say hello.", "Hello there!"),
    ("Write a Python function add_one(x).", "def add_one(x):\n    return x + 1"),
    ("Write a Python function double(x).", "def double(x):\n    return x * 2"),
    ("Is the sky green?", "No, the sky is blue."),
]


@pytest.fixture(scope="module")
def single_thread():
    """torch on one thread for a whole test module, its module fixtures included (a module asks for it with
    ``pytestmark = pytest.mark.usefixtures("single_thread")``): a tiny model's ops are too small to split,
    and on a busy 2-core machine a second thread's spin-waits make them several times slower."""
    from tests.stages.training.rl_helpers import one_thread

    with one_thread():
        yield


@pytest.fixture(scope="session")
def chat_jsonl(tmp_path_factory) -> str:
    """A small conversational SFT dataset (JSONL of messages), repeated so a model can fit it."""
    import json

    path = tmp_path_factory.mktemp("data") / "chat.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(48):
            q, a = CHAT_ROWS[i % len(CHAT_ROWS)]
            fh.write(
                json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
            )
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer Llama with a BPE tokenizer trained on the test corpus, in HF format."""
    from trainer_lib.demo.tiny_model import make_tiny_model

    texts = [q + " " + a for q, a in CHAT_ROWS] * 20
    out = tmp_path_factory.mktemp("models") / "tiny"
    return make_tiny_model(str(out), texts, vocab_size=300, num_layers=2, hidden_size=64, seed=0)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> str:
    """The bundled demo datasets at small sizes."""
    from trainer_lib.demo.demo_spec import DemoSpec
    from trainer_lib.demo.generator import generate_demo_data

    out = tmp_path_factory.mktemp("demo")
    generate_demo_data(str(out), DemoSpec(n_code_train=200, n_code_eval=20, n_safety_train=60, n_safety_eval=20))
    return str(out)


def clean_env() -> dict:
    """Environment for a child process that must start its own process group (no RANK etc.)."""
    from trainer_lib.engine.process_group import own_group_env

    return {**own_group_env(), "POSTTRAIN_NO_PROGRESS": "1"}


def repeatable(record: dict) -> dict:
    """A metrics.jsonl record without what differs from one run to the next on the same data: wall times,
    throughput and memory."""
    return {k: v for k, v in record.items() if not ("time" in k or k.endswith("_per_s") or k == "memory_gb")}
