"""Behavioural tests for trainer_lib.storage against a real moto S3 server."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time

import boto3
import pytest

from trainer_lib import storage
from trainer_lib.storage import StorageError

MiB = 1024 * 1024


@pytest.fixture
def s3(s3_server):
    return boto3.client("s3", endpoint_url=s3_server.endpoint_url)


def _tree(root):
    return {rel: open(os.path.join(root, rel), "rb").read() for rel in storage.list_files(root)}


def test_roundtrip_bytes_text_and_listing(s3_bucket):
    base = f"s3://{s3_bucket}/run1"
    storage.write_bytes(storage.join(base, "a.bin"), b"\x00\x01binary")
    storage.write_text(storage.join(base, "sub", "b.txt"), "héllo")
    assert storage.read_bytes(f"{base}/a.bin") == b"\x00\x01binary"
    assert storage.read_text(f"{base}/sub/b.txt") == "héllo"
    assert storage.exists(f"{base}/a.bin") and storage.exists(base) and storage.exists(f"s3://{s3_bucket}")
    assert storage.isdir(base) and storage.isdir(f"{base}/sub/") and not storage.isdir(f"{base}/a.bin")
    assert not storage.exists(f"{base}/nope") and not storage.exists(f"s3://{s3_bucket}/run")
    assert storage.listdir(base) == ["a.bin", "sub"]
    assert storage.listdir(f"s3://{s3_bucket}") == ["run1"]
    assert storage.list_files(base) == ["a.bin", "sub/b.txt"]
    assert storage.join("s3://b/x/", "/y/", "z") == "s3://b/x/y/z"
    storage.makedirs(f"{base}/anything")  # no-op for s3


def test_upload_download_copy_delete_tree(s3_bucket, tmp_path):
    src = tmp_path / "src"
    files = {"config.json": b"{}", "shards/0.bin": os.urandom(1000), "shards/deep/1.bin": b"x" * 10}
    for rel, data in files.items():
        storage.write_bytes(str(src / rel), data)
    base = f"s3://{s3_bucket}/ckpt"
    storage.upload_dir(str(src), base)
    storage.write_text(f"s3://{s3_bucket}/ckpt10/keep.txt", "sibling")
    assert storage.list_files(base) == sorted(files)

    storage.download_dir(base, str(tmp_path / "dl"))
    assert _tree(tmp_path / "dl") == files
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # temp dir renamed away

    storage.copy(base, f"s3://{s3_bucket}/copy")  # s3 -> s3 keeps the sha256 metadata
    storage.copy(f"s3://{s3_bucket}/copy", str(tmp_path / "dl2"))
    assert _tree(tmp_path / "dl2") == files
    storage.copy(str(tmp_path / "dl2"), str(tmp_path / "dl3"))
    assert _tree(tmp_path / "dl3") == files

    storage.delete(base)
    assert not storage.exists(base)
    assert storage.read_text(f"s3://{s3_bucket}/ckpt10/keep.txt") == "sibling"
    storage.delete(base)  # missing is fine by default
    with pytest.raises(FileNotFoundError):
        storage.delete(base, missing_ok=False)


def test_multipart_upload_with_checksums(s3_bucket, s3, tmp_path):
    storage.configure(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    data = os.urandom(12 * MiB)
    (tmp_path / "big.bin").write_bytes(data)
    storage.upload_file(str(tmp_path / "big.bin"), f"s3://{s3_bucket}/big.bin")

    head = s3.head_object(Bucket=s3_bucket, Key="big.bin", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3")  # really multipart, 3 parts
    assert head["Metadata"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert head.get("ChecksumSHA256")  # S3's own (composite) flexible checksum was requested too

    storage.download_file(f"s3://{s3_bucket}/big.bin", str(tmp_path / "out.bin"))
    assert (tmp_path / "out.bin").read_bytes() == data
    assert storage.read_bytes(f"s3://{s3_bucket}/big.bin") == data  # composite checksum is not misread

    storage.copy(f"s3://{s3_bucket}/big.bin", f"s3://{s3_bucket}/copy/big.bin")  # multipart server-side copy
    assert s3.head_object(Bucket=s3_bucket, Key="copy/big.bin")["Metadata"] == head["Metadata"]


def test_checksum_mismatch_is_detected(s3_bucket, s3, tmp_path):
    uri = f"s3://{s3_bucket}/w.bin"
    storage.write_bytes(uri, b"good weights")
    meta = s3.head_object(Bucket=s3_bucket, Key="w.bin")["Metadata"]
    s3.put_object(Bucket=s3_bucket, Key="w.bin", Body=b"evil weights", Metadata=meta)

    out = tmp_path / "dl" / "w.bin"
    with pytest.raises(StorageError, match="checksum mismatch") as exc:
        storage.download_file(uri, str(out))
    assert uri in str(exc.value)
    assert not out.exists() and os.listdir(out.parent) == []  # no partial or temp file
    with pytest.raises(StorageError, match="checksum mismatch"):
        storage.read_bytes(uri)
    with pytest.raises(StorageError, match="checksum mismatch"):
        storage.localize(uri)
    assert not os.path.exists(os.path.join(str(tmp_path / "cache"), "s3", s3_bucket, "w.bin"))


def test_localize_caches_and_notices_changes(s3_bucket, monkeypatch):
    uri = f"s3://{s3_bucket}/models/tok.json"
    storage.write_text(uri, "v1")
    local = storage.localize(uri)
    assert local.startswith(storage.cache_root()) and open(local).read() == "v1"
    manifest = os.path.join(os.path.dirname(local), ".tok.json.manifest.json")
    assert json.load(open(manifest))["sha256"] == hashlib.sha256(b"v1").hexdigest()
    mtime = os.stat(local).st_mtime_ns

    real_download = storage.download_file
    monkeypatch.setattr(storage, "download_file", lambda *a, **k: pytest.fail("re-downloaded"))
    assert storage.localize(uri) == local and os.stat(local).st_mtime_ns == mtime
    monkeypatch.setattr(storage, "download_file", real_download)

    time.sleep(0.01)
    storage.write_text(uri, "v2")
    assert storage.localize(uri) == local and open(local).read() == "v2"

    d = f"s3://{s3_bucket}/models"
    storage.write_text(f"{d}/cfg/a.txt", "a")
    ldir = storage.localize(d, kind="dir")
    assert sorted(storage.list_files(ldir)) == ["cfg/a.txt", "tok.json"]
    assert storage.localize(d) == ldir  # auto detects the prefix, cache hit
    storage.write_text(f"{d}/cfg/b.txt", "b")
    assert storage.list_files(storage.localize(d)) == ["cfg/a.txt", "cfg/b.txt", "tok.json"]
    assert storage.localize("~/x") == os.path.expanduser("~/x")


def test_missing_objects_raise_file_not_found(s3_bucket, tmp_path):
    for uri in (f"s3://{s3_bucket}/missing.bin", f"s3://no-such-bucket-{s3_bucket}/x"):
        with pytest.raises(FileNotFoundError, match=uri):
            storage.read_bytes(uri)
        with pytest.raises(FileNotFoundError, match=uri):
            storage.download_file(uri, str(tmp_path / "x"))
        with pytest.raises(FileNotFoundError, match=uri):
            storage.localize(uri)
    with pytest.raises(FileNotFoundError, match="no-such-bucket"):
        storage.upload_file(__file__, f"s3://no-such-bucket-{s3_bucket}/x")
    with pytest.raises(FileNotFoundError):
        storage.listdir(f"s3://{s3_bucket}/nothing")
    assert not (tmp_path / "x").exists()


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_unreachable_endpoint_fails_fast_without_secrets(s3_bucket, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    storage.configure(endpoint_url=f"http://127.0.0.1:{port}", max_attempts=2)
    uri = f"s3://{s3_bucket}/x.bin"
    start = time.monotonic()
    for op in (
        lambda: storage.read_bytes(uri),
        lambda: storage.write_bytes(uri, b"x"),
        lambda: storage.download_file(uri, str(tmp_path / "x.bin")),
    ):
        with pytest.raises(StorageError) as exc:
            op()
        msg = str(exc.value)
        assert uri in msg and "after 2 attempts" in msg, msg
        assert "testing-secret" not in msg and exc.value.__cause__ is None
    assert time.monotonic() - start < 15
    assert not (tmp_path / "x.bin").exists()


def test_local_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a" / "b" / "out.json"
    storage.write_text(str(target), "first")
    assert target.read_text() == "first" and os.listdir(target.parent) == ["out.json"]
    with pytest.raises(TypeError):
        storage.write_bytes(str(target), "not bytes")  # fails mid-write
    assert target.read_text() == "first" and os.listdir(target.parent) == ["out.json"]
    storage.copy(str(target), str(tmp_path / "c" / "copy.json"))
    assert (tmp_path / "c" / "copy.json").read_text() == "first"
    assert storage.list_files(str(tmp_path)) == ["a/b/out.json", "c/copy.json"]
    assert storage.listdir(str(tmp_path)) == ["a", "c"]


def test_bad_paths_give_clear_errors():
    for bad in ("s3://", "s3:///key", "s3://Bad_Bucket/x", "s3://ab/x"):
        with pytest.raises(ValueError, match="bucket"):
            storage.split_s3(bad)
    with pytest.raises(ValueError, match="not an s3"):
        storage.split_s3("/tmp/x")
    with pytest.raises(ValueError, match="unsupported path scheme nosuch://"):
        storage.read_bytes("nosuch://bucket/x")
    if importlib.util.find_spec("gcsfs") is None:  # a known scheme whose package is missing says which
        with pytest.raises(ValueError, match=r"gs://bucket/x.*gcsfs"):
            storage.read_bytes("gs://bucket/x")
    with pytest.raises(ValueError, match="kind"):
        storage.localize("s3://bucket/x", kind="weird")
    assert storage.split_s3("s3://my-bucket/a/b/") == ("my-bucket", "a/b/")
    assert storage.is_remote("s3://b/x") and not storage.is_remote("/s3://x")


def test_redact(monkeypatch):
    secret, key_id = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AKIAIOSFODNN7EXAMPLE"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    text = storage.redact(
        f"id={key_id} secret {secret} other AKIAABCDEFGHIJKLMNOP "
        f"aws_secret_access_key = s3cr3t http://user:pw@minio:9000/b"
    )
    for leaked in (secret, key_id, "AKIAABCDEFGHIJKLMNOP", "s3cr3t", "user:pw"):
        assert leaked not in text, text
    assert "http://***@minio:9000/b" in text
    assert storage.redact("nothing to hide") == "nothing to hide"


def test_fingerprint_changes_with_the_content_behind_a_location(s3_bucket, tmp_path):
    from trainer_lib import storage

    prefix = f"s3://{s3_bucket}/data"
    storage.write_text(f"{prefix}/train.jsonl", '{"text": "a"}\n')
    first = storage.fingerprint(prefix)
    assert storage.fingerprint(prefix) == first  # nothing changed: the same key for the cache
    storage.write_text(f"{prefix}/train.jsonl", '{"text": "b"}\n')  # same name, new data
    assert storage.fingerprint(prefix) != first
    assert storage.fingerprint(f"{prefix}/train.jsonl") != storage.fingerprint(prefix)  # one object vs a prefix

    local = tmp_path / "data"
    local.mkdir()
    (local / "train.jsonl").write_text("x\n")
    before = storage.fingerprint(str(local))
    (local / "train.jsonl").write_text("xy\n")
    assert storage.fingerprint(str(local)) != before
    # a hub id that cannot be asked here (no network): never equal twice, so never answered from the cache
    assert storage.fingerprint("no-such-org/no-such-model") != storage.fingerprint("no-such-org/no-such-model")
