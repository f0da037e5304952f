"""Two ``posttrain deploy`` of one model to one repository at once: each publishes its own version, and a
deploy that finds the model's lock held waits, says so, and gives up with one error line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tests.conftest import REPO, clean_env
from trainer_lib import storage
from trainer_lib.errors import UserError
from trainer_lib.serving import repository as repo

MODEL = "chat"


@pytest.fixture(params=["local", "s3"])
def repository(request, tmp_path):
    """A local model repository, or one on the moto S3 server."""
    if request.param == "local":
        yield str(tmp_path / "triton")
        return
    import boto3

    server = request.getfixturevalue("s3_server")
    bucket = f"race-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=bucket)
    storage.configure(reset=True, endpoint_url=server.endpoint_url, cache_dir=str(tmp_path / "cache"))
    yield f"s3://{bucket}/triton"
    storage.configure(reset=True)


def _deploy(export_dir: str, repository: str, *extra: str) -> subprocess.Popen:
    argv = ["deploy", f"export.path={export_dir}", f"repository={repository}", f"model_name={MODEL}", *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "trainer_lib.cli", *argv],
        cwd=REPO,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_two_concurrent_deploys_publish_two_versions(export_dir, repository):
    procs = [_deploy(export_dir, repository, "keep_versions=0") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    versions = sorted(json.loads(out)["version"] for out, _ in outs)
    assert versions == [1, 2]
    model_dir = storage.join(repository, MODEL)
    history = json.loads(storage.read_text(storage.join(model_dir, "deploy.json")))
    assert [e["version"] for e in history["versions"]] == [1, 2] and history["serving"] == 2
    assert [e["status"] for e in history["versions"]] == ["published", "published"]
    assert repo.served_versions(repo.read_config(model_dir)) == [2]
    assert repo.versions(model_dir) == [1, 2]
    for version in (1, 2):  # each version complete
        names = storage.listdir(storage.join(model_dir, str(version)))
        assert {"model.onnx", "model.py", "generate.json", "tokenizer"} <= set(names), names
    assert not storage.exists(storage.join(model_dir, repo.LOCK)) or not repository.startswith("s3://")


HOLDER = textwrap.dedent("""
    import sys, time
    from trainer_lib import storage
    from trainer_lib.serving import repository as repo

    storage.configure(endpoint_url=sys.argv[2] or None)
    with repo.deploy_lock(sys.argv[1], "a test holding the lock", 10, print):
        print("held", flush=True)
        time.sleep(120)
""")


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_a_deploy_waits_for_the_lock_then_gives_up_in_one_line(export_dir, repository):
    model_dir = storage.join(repository, MODEL)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "") if repository.startswith("s3://") else ""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, model_dir, endpoint],
        cwd=REPO,
        env=clean_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        loser = _deploy(export_dir, repository, "lock_wait_s=1")
        out, err = loser.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert loser.returncode == 2 and out == "", err
    lines = [line for line in err.splitlines() if line.startswith(("deploy:", "error:"))]
    holder_text = rf"pid {holder.pid} on \S+ \(a test holding the lock, since \d\d:\d\d:\d\d UTC\)"
    lock = re.escape(storage.join(model_dir, repo.LOCK))
    assert len(lines) == 2, err
    assert re.fullmatch(
        rf"deploy: waiting for another deploy of this model: {holder_text} holds {lock} \(up to 1 s\)", lines[0]
    ), lines[0]
    assert re.fullmatch(
        rf"error: gave up after 1 s waiting for another deploy of this model to finish \({holder_text} holds {lock}\); "
        r"run it again when that one is done, or raise lock_wait_s",
        lines[1],
    ), lines[1]
    assert took < 60
    assert repo.versions(model_dir) == [] and not storage.exists(storage.join(model_dir, "deploy.json"))
    # the holder died (SIGKILL): a local lock goes with it; an S3 lock object stays until it is stale
    if not repository.startswith("s3://"):
        after = _deploy(export_dir, repository)
        out, err = after.communicate(timeout=120)
        assert after.returncode == 0 and json.loads(out)["version"] == 1, err


def test_an_s3_lock_left_by_a_dead_deploy_is_taken_over_once_stale(s3_bucket):
    model_dir = f"s3://{s3_bucket}/triton/{MODEL}"
    lock = storage.join(model_dir, repo.LOCK)
    storage.write_text(lock, '{"holder": "pid 1 on gone", "what": "deploying x", "since": 0}')
    lines = []
    with pytest.raises(
        UserError, match=r"gave up after \d s waiting .*\(pid 1 on gone \(deploying x, since 00:00:00 UTC"
    ):
        with repo.deploy_lock(model_dir, "second", 0.5, lines.append):
            pass
    assert lines and lines[0].startswith("waiting for another deploy of this model: pid 1 on gone")
    with repo.deploy_lock(model_dir, "third", 5, lines.append, stale_s=0):  # older than stale_s: removed
        assert '"what": "third"' in storage.read_text(lock)
        storage.write_text(lock, "taken over meanwhile")  # (as a waiter would after stale_s)
    assert storage.read_text(lock) == "taken over meanwhile"  # a lock no longer ours is never deleted
