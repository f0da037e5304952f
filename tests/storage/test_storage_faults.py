"""Object-store faults against the real local S3 server: a server that dies mid-upload or restarts
between (and inside) steps, wrong credentials, a missing bucket, a corrupted object.

Outages come from :class:`tests.tcp_proxy.FlakyProxy` between the client and the moto server
(connections reset, then refused; the data behind survives, as a restarted MinIO's does). Wrong
credentials need a server that checks them: a second moto server with authentication on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import boto3
import pytest

from tests.conftest import REPO, _free_port, clean_env
from tests.tcp_proxy import FlakyProxy
from trainer_lib import storage
from trainer_lib.storage import StorageError

MiB = 1024 * 1024


@pytest.fixture
def proxy(s3_server, s3_bucket):
    """storage pointed at the bucket through a proxy that can be taken down."""
    flaky = FlakyProxy(s3_server.port)
    storage.configure(endpoint_url=flaky.endpoint_url, multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    yield flaky
    flaky.close()


def _secrets_absent(text: str) -> None:
    for secret in (os.environ["AWS_SECRET_ACCESS_KEY"], os.environ["AWS_ACCESS_KEY_ID"]):
        assert secret not in text


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_server_dying_mid_upload_fails_after_bounded_retries_and_leaves_no_object(
    proxy, s3_bucket, s3_server, tmp_path
):
    storage.configure(max_attempts=2)
    big = tmp_path / "weights.bin"
    big.write_bytes(os.urandom(12 * MiB))  # three parts
    uri = f"s3://{s3_bucket}/run/weights.bin"
    proxy.trip(after_upload=6 * MiB)  # in the second part, and it stays down
    start = time.monotonic()
    with pytest.raises(StorageError) as exc:
        storage.upload_file(str(big), uri)
    assert time.monotonic() - start < 30
    message = str(exc.value)
    assert uri in message and "after 2 attempts" in message, message
    _secrets_absent(message)
    with pytest.raises(StorageError, match="marker.txt"):  # still down: small writes fail the same way
        storage.write_text(f"s3://{s3_bucket}/run/marker.txt", "x")
    assert proxy.outages == 1

    proxy.up()  # the server is back, with whatever it had
    assert not storage.exists(uri)  # a multipart upload that never completed is no object at all
    direct = boto3.client("s3", endpoint_url=s3_server.endpoint_url)
    assert "Contents" not in direct.list_objects_v2(Bucket=s3_bucket, Prefix="run/")


def test_a_restart_during_an_upload_or_a_read_is_ridden_out(proxy, s3_bucket):
    uri = f"s3://{s3_bucket}/run/state.bin"
    data = os.urandom(3 * MiB)
    proxy.trip(pattern=b"/run/state.bin", seconds=0.5)  # the first request for it kills the server
    storage.write_bytes(uri, data)
    assert proxy.outages == 1 and storage.read_bytes(uri) == data

    proxy.trip(after_download=MiB, seconds=0.3)  # the connection drops while the body streams
    assert storage.read_bytes(uri) == data and proxy.outages == 2

    proxy.down(seconds=0.5)  # down between two operations
    local = storage.localize(uri)
    assert open(local, "rb").read() == data


def test_training_survives_a_restart_while_it_saves_a_checkpoint(
    proxy, s3_bucket, tiny_model_dir, chat_jsonl, tmp_path
):
    """The store restarts as the step-4 checkpoint's marker is uploaded: the run goes on and ends
    with the weights of an undisturbed run."""
    from safetensors.torch import load_file

    from tests.stages.training.rl_helpers import one_thread
    from trainer_lib.cli import main

    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        "batch_size=2",
        "data.max_length=64",
        "max_steps=6",
        "save_steps=2",
        "seed=1",
    ]
    ckpt = f"s3://{s3_bucket}/checkpoints/sft"
    with one_thread():
        assert main([*args, f"output_dir={tmp_path / 'plain'}"]) == 0
        proxy.trip(pattern=b"/checkpoints/sft/step-00000004/COMPLETE", seconds=0.5)
        assert main([*args, f"output_dir={tmp_path / 'flaky'}", f"checkpoint_dir={ckpt}"]) == 0
    assert proxy.outages == 1
    plain = load_file(tmp_path / "plain" / "model.safetensors")
    flaky = load_file(tmp_path / "flaky" / "model.safetensors")
    assert all((plain[k] == flaky[k]).all() for k in plain)
    assert storage.listdir(ckpt) == ["step-00000004", "step-00000006"]
    assert storage.exists(f"{ckpt}/step-00000004/COMPLETE")


def test_a_corrupted_checkpoint_object_is_skipped_for_the_previous_checkpoint(
    s3_bucket, s3_server, tiny_model_dir, chat_jsonl, tmp_path, capsys
):
    """The newest checkpoint's object fails its stored checksum on download: one warning names its key and
    the retry resumes from the previous complete checkpoint; with that one corrupted too, one error line."""
    from tests.stages.training.rl_helpers import one_thread
    from trainer_lib.cli import main

    ckpt = f"s3://{s3_bucket}/checkpoints/sft"
    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        "batch_size=2",
        "data.max_length=64",
        "max_steps=4",
        "save_steps=2",
        "seed=1",
        f"checkpoint_dir={ckpt}",
    ]
    with one_thread():
        assert main([*args, f"output_dir={tmp_path / 'first'}"]) == 0
    direct = boto3.client("s3", endpoint_url=s3_server.endpoint_url)

    def corrupt(key: str) -> None:
        head = direct.head_object(Bucket=s3_bucket, Key=key)
        body = bytearray(direct.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF  # one flipped bit-pattern, same size, same metadata
        direct.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body), Metadata=head["Metadata"])

    key = "checkpoints/sft/step-00000004/mp_rank_00_model_states.pt"
    corrupt(key)
    capsys.readouterr()
    with one_thread():
        code = main([*args, f"output_dir={tmp_path / 'retry'}"])
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning: checkpoint")]
    assert code == 0 and "Traceback" not in captured.err and len(warnings) == 1, captured.err
    assert f"s3://{s3_bucket}/{key}" in warnings[0] and "checksum mismatch" in warnings[0]
    assert "resuming at step 2" in captured.out
    _secrets_absent(captured.err)
    assert os.path.exists(tmp_path / "retry" / "model.safetensors")

    corrupt(key)  # (the retry wrote step 4 anew)
    corrupt("checkpoints/sft/step-00000002/mp_rank_00_model_states.pt")
    with one_thread():
        code = main([*args, f"output_dir={tmp_path / 'again'}"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and last.startswith(f"error: no usable checkpoint in {ckpt}")
    assert "step-00000004/mp_rank_00_model_states.pt: checksum mismatch" in last and "step-00000002/" in last
    _secrets_absent(err)
    assert not os.path.exists(tmp_path / "again" / "model.safetensors")


# --------------------------------------------------------------------------- credentials and buckets


def test_a_training_stage_with_a_missing_bucket_stops_before_training(
    s3_bucket, tiny_model_dir, chat_jsonl, tmp_path, capsys
):
    from trainer_lib.cli import main

    for where in ("output_dir", "checkpoint_dir"):
        target = f"{where}=s3://no-such-bucket-{s3_bucket}/run"
        other = [] if where == "output_dir" else [f"output_dir={tmp_path / 'out'}"]
        code = main(["sft", f"model.path={tiny_model_dir}", f"data.path={chat_jsonl}", "max_steps=2", target, *other])
        captured = capsys.readouterr()
        assert code == 2 and "sft:" not in captured.out  # no banner: not a single step ran
        assert f"bucket 'no-such-bucket-{s3_bucket}' does not exist" in captured.err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def auth_server():
    """A second moto server that checks credentials; one IAM user with full access and a bucket."""
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "4"}  # the four setup calls below
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                import socket

                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        anyone = dict(
            endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup"
        )
        iam = boto3.client("iam", **anyone)
        iam.create_user(UserName="trainer")
        iam.put_user_policy(
            UserName="trainer",
            PolicyName="all",
            PolicyDocument=(
                '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
            ),
        )
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        boto3.client("s3", **anyone).create_bucket(Bucket="guarded")
        yield {"endpoint": endpoint, "key_id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.serial  # timed against a wall-clock bound: run alone
@pytest.mark.parametrize("wrong", ["unknown key", "wrong secret"])
def test_wrong_credentials_fail_at_once_naming_the_key_not_the_secret(auth_server, monkeypatch, tmp_path, wrong):
    right_id, right_secret = auth_server["key_id"], auth_server["secret"]
    key_id, secret = (
        ("AKIAWRONGWRONGWRONG0", "canary-wrong-secret-1")
        if wrong == "unknown key"
        else (right_id, "canary-wrong-secret-2")
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", right_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", right_secret)
    storage.configure(reset=True, endpoint_url=auth_server["endpoint"], cache_dir=str(tmp_path / "cache"))
    try:
        storage.write_text("s3://guarded/ok.txt", "the right credentials work")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        storage.configure()  # new clients, new credentials
        for op in (
            lambda: storage.read_text("s3://guarded/ok.txt"),
            lambda: storage.write_text("s3://guarded/new.txt", "x"),
            lambda: storage.download_file("s3://guarded/ok.txt", str(tmp_path / "ok.txt")),
        ):
            start = time.monotonic()
            with pytest.raises(StorageError) as exc:
                op()
            message = str(exc.value)
            assert time.monotonic() - start < 5  # a refusal is not retried
            assert "s3://guarded/" in message and "check credentials" in message, message
            for text in (secret, right_secret, key_id):
                assert text not in message
        assert not (tmp_path / "ok.txt").exists()
    finally:
        storage.configure(reset=True)


def test_stage_with_bad_store_settings_prints_one_line_without_secrets(s3_server, s3_bucket, auth_server, tmp_path):
    """Through the real CLI: a missing bucket (exit 2) and wrong credentials (exit 1) each give one
    error line naming the location; neither the key id nor the secret is printed anywhere."""
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    env = clean_env()
    env.update(PYTHONPATH=REPO, POSTTRAIN_CACHE=str(tmp_path / "cache"))
    runs = {
        "missing bucket": (
            {},
            [f"data.path=s3://no-such-bucket-{s3_bucket}/d.jsonl", f"output_dir={tmp_path}/o1"],
            2,
            f"s3://no-such-bucket-{s3_bucket}/d.jsonl",
        ),
        "missing output bucket": (
            {},
            [f"data.path={tmp_path}/d.jsonl", f"output_dir=s3://no-such-bucket-{s3_bucket}/o"],
            2,
            f"no-such-bucket-{s3_bucket}",
        ),
        "wrong credentials": (
            {
                "AWS_ENDPOINT_URL": auth_server["endpoint"],
                "AWS_ACCESS_KEY_ID": auth_server["key_id"],
                "AWS_SECRET_ACCESS_KEY": "canary-wrong-secret-3",
            },
            ["data.path=s3://guarded/ok.txt", f"output_dir={tmp_path}/o3"],
            1,
            "s3://guarded/ok.txt",
        ),
    }
    for name, (extra_env, args, code, where) in runs.items():
        run_env = {**env, **extra_env}
        done = subprocess.run(
            [sys.executable, "-m", "trainer_lib.cli", "prepare", *args],
            cwd=REPO,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and lines[-1].startswith("error: ") and where in lines[-1], (name, done.stderr)
        assert "Traceback" not in done.stderr, (name, done.stderr)
        for secret in (run_env["AWS_SECRET_ACCESS_KEY"], run_env["AWS_ACCESS_KEY_ID"]):
            assert secret not in done.stdout + done.stderr, name
