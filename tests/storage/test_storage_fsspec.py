"""trainer_lib.storage on URLs that go through fsspec (memory://, file://, a flaky test filesystem):
the same guarantees as s3:// (tests/storage/test_storage.py) without any code that knows the scheme."""

from __future__ import annotations

import hashlib
import os
import posixpath
import uuid

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from trainer_lib import storage
from trainer_lib.storage import StorageError


@pytest.fixture(autouse=True)
def _cache(tmp_path):
    storage.configure(reset=True, cache_dir=str(tmp_path / "cache"), max_attempts=3)
    yield
    storage.configure(reset=True)


@pytest.fixture(params=["memory", "file"])
def base(request, tmp_path):
    """A fresh, empty location on an fsspec-only scheme."""
    if request.param == "memory":
        url = f"memory://posttrain-tests/{uuid.uuid4().hex}"
        yield url
        storage.delete(url)
    else:
        yield f"file://{tmp_path / 'store'}"


def _tree(root) -> dict[str, bytes]:
    return {rel: open(os.path.join(root, rel), "rb").read() for rel in storage.list_files(root)}


def _raw(url: str) -> dict[str, bytes]:
    """Every object under ``url`` as fsspec itself lists it (sidecars and temp files included)."""
    fs, path = fsspec.core.url_to_fs(url)
    return {p[len(path.rstrip("/")) + 1 :]: fs.cat_file(p) for p in fs.find(path)} if fs.exists(path) else {}


def test_roundtrip_and_listing_hide_the_checksum_sidecars(base):
    storage.write_bytes(storage.join(base, "a.bin"), b"\x00\x01binary")
    storage.write_text(storage.join(base, "sub", "b.txt"), "héllo")
    assert storage.read_bytes(f"{base}/a.bin") == b"\x00\x01binary"
    assert storage.read_text(f"{base}/sub/b.txt") == "héllo"
    assert storage.is_remote(base) and storage.exists(f"{base}/a.bin") and storage.exists(base)
    assert storage.isdir(base) and storage.isdir(f"{base}/sub") and not storage.isdir(f"{base}/a.bin")
    assert not storage.exists(f"{base}/nope")
    assert storage.listdir(base) == ["a.bin", "sub"]
    assert storage.list_files(base) == ["a.bin", "sub/b.txt"]
    raw = _raw(base)  # beside each file its sha256, which downloads are checked against
    assert raw[".a.bin.sha256"].decode() == hashlib.sha256(b"\x00\x01binary").hexdigest()
    assert sorted(raw) == [".a.bin.sha256", "a.bin", "sub/.b.txt.sha256", "sub/b.txt"]  # no temp file left
    storage.write_text(f"{base}/sub/b.txt", "v2")  # an overwrite records the new checksum
    assert storage.read_text(f"{base}/sub/b.txt") == "v2"


def test_model_dir_up_down_copy_and_delete(base, tmp_path):
    src = tmp_path / "model"
    files = {"config.json": b"{}", "model.safetensors": os.urandom(3000), "tok/tokenizer.json": b"[1]"}
    for rel, data in files.items():
        storage.write_bytes(str(src / rel), data)
    model = f"{base}/models/tiny"
    storage.upload_dir(str(src), model)
    storage.write_text(f"{base}/models/tiny10/keep.txt", "sibling")
    assert storage.list_files(model) == sorted(files)

    storage.download_dir(model, str(tmp_path / "dl"))
    assert _tree(tmp_path / "dl") == files
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # temp dir renamed away

    storage.copy(model, f"{base}/copy")  # inside one filesystem
    storage.copy(f"{base}/copy", str(tmp_path / "dl2"))  # down to a local directory
    assert _tree(tmp_path / "dl2") == files
    other = (
        f"memory://posttrain-tests/{uuid.uuid4().hex}/x" if base.startswith("file") else f"file://{tmp_path / 'other'}"
    )
    storage.copy(f"{base}/copy", other)  # between two filesystems, through this machine
    assert storage.list_files(other) == sorted(files)
    assert storage.read_bytes(f"{other}/model.safetensors") == files["model.safetensors"]

    storage.delete(model)
    assert not storage.exists(model)
    assert storage.read_text(f"{base}/models/tiny10/keep.txt") == "sibling"  # tiny10 is not under tiny
    storage.delete(model)  # missing is fine by default
    with pytest.raises(FileNotFoundError, match="tiny"):
        storage.delete(model, missing_ok=False)
    storage.delete(other)


def test_a_changed_object_fails_its_checksum(base, tmp_path):
    url = f"{base}/w.bin"
    storage.write_bytes(url, b"good weights")
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, b"evil weights")  # changed behind our back, the recorded sha256 kept

    out = tmp_path / "dl" / "w.bin"
    with pytest.raises(StorageError, match="checksum mismatch") as exc:
        storage.download_file(url, str(out))
    assert url in str(exc.value)
    assert not out.exists() and os.listdir(out.parent) == []  # no partial or temp file
    with pytest.raises(StorageError, match="checksum mismatch"):
        storage.read_bytes(url)
    if base.startswith("memory"):  # (a file:// URL is read in place, not downloaded)
        with pytest.raises(StorageError, match="checksum mismatch"):
            storage.localize(url)
    fs.rm_file(
        posixpath.join(posixpath.dirname(path), ".w.bin.sha256")
    )  # a file another tool wrote: no checksum to check
    assert storage.read_bytes(url) == b"evil weights"


def test_missing_paths_name_the_url(base, tmp_path):
    url = f"{base}/missing.bin"
    for op in (
        lambda: storage.read_bytes(url),
        lambda: storage.download_file(url, str(tmp_path / "x")),
        lambda: storage.localize(url),
        lambda: storage.listdir(url),
        lambda: storage.download_dir(url, str(tmp_path / "d")),
        lambda: storage.copy(url, str(tmp_path / "c")),
    ):
        with pytest.raises(FileNotFoundError, match=url):
            op()
    assert not (tmp_path / "x").exists() and not (tmp_path / "d").exists()


def test_localize_caches_memory_urls_and_notices_changes(monkeypatch):
    base = f"memory://posttrain-tests/{uuid.uuid4().hex}"
    storage.write_text(f"{base}/m/tok.json", "v1")
    local = storage.localize(f"{base}/m/tok.json")
    assert local.startswith(os.path.join(storage.cache_root(), "memory")) and open(local).read() == "v1"
    real_download = storage.download_file
    monkeypatch.setattr(storage, "download_file", lambda *a, **k: pytest.fail("re-downloaded"))
    assert storage.localize(f"{base}/m/tok.json") == local  # unchanged: answered from the cache
    monkeypatch.setattr(storage, "download_file", real_download)
    storage.write_text(f"{base}/m/tok.json", "v2")
    assert open(storage.localize(f"{base}/m/tok.json")).read() == "v2"

    storage.write_text(f"{base}/m/cfg/a.txt", "a")
    ldir = storage.localize(f"{base}/m")
    assert storage.list_files(ldir) == ["cfg/a.txt", "tok.json"]  # no sidecars in the copy
    first = storage.fingerprint(f"{base}/m")
    storage.write_text(f"{base}/m/cfg/b.txt", "b")
    assert storage.list_files(storage.localize(f"{base}/m")) == ["cfg/a.txt", "cfg/b.txt", "tok.json"]
    assert storage.fingerprint(f"{base}/m") != first
    storage.delete(base)


def test_file_urls_are_read_in_place(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert storage.localize(f"file://{tmp_path / 'm'}") == str(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="nothing"):
        storage.localize(f"file://{tmp_path / 'nothing'}")


def test_schemes_and_clear_errors():
    assert storage.is_shared("gs://b/x") and storage.is_shared("s3://b/x") and storage.is_shared("hf://org/m")
    assert not storage.is_shared("memory://x") and not storage.is_shared("file:///x")
    assert not storage.is_shared("/data/x") and not storage.is_remote("/data/x")
    assert storage.join("memory://a/", "/b/", "c") == "memory://a/b/c"
    with pytest.raises(ValueError, match="unsupported path scheme nosuch://"):
        storage.exists("nosuch://bucket/x")
    with pytest.raises(ValueError, match="refusing"):
        storage.delete("memory://")


# --------------------------------------------------------------------------- a filesystem that fails


class FlakyFileSystem(MemoryFileSystem):
    """An fsspec filesystem whose uploads fail: ``failures`` times with a dropped connection (after
    writing half the bytes), and with a message holding a credential."""

    protocol = "flaky"
    store: dict = {}
    pseudo_dirs = [""]
    failures = 0

    def put_file(self, lpath, rpath, **kwargs):
        if FlakyFileSystem.failures > 0:
            FlakyFileSystem.failures -= 1
            data = open(lpath, "rb").read()
            self.pipe_file(rpath, data[: len(data) // 2])  # a half-written object
            raise ConnectionResetError(f"connection reset by peer (token={os.environ['HF_TOKEN']})")
        return super().put_file(lpath, rpath, **kwargs)


@pytest.fixture
def flaky(monkeypatch):
    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    monkeypatch.setenv("HF_TOKEN", "hf_canaryCANARYcanaryCANARY0123")
    FlakyFileSystem.store.clear()
    yield FlakyFileSystem
    FlakyFileSystem.failures = 0


def test_a_dropped_connection_is_retried(flaky, tmp_path):
    (tmp_path / "w.bin").write_bytes(b"x" * 1000)
    flaky.failures = 2  # max_attempts is 3
    storage.upload_file(str(tmp_path / "w.bin"), "flaky://b/run/w.bin")
    assert storage.read_bytes("flaky://b/run/w.bin") == b"x" * 1000
    assert sorted(_raw("flaky://b/run")) == [".w.bin.sha256", "w.bin"]  # the half-written attempts are gone


def test_a_failed_upload_is_never_visible_and_its_error_is_redacted(flaky, tmp_path):
    (tmp_path / "w.bin").write_bytes(b"x" * 1000)
    flaky.failures = 10
    with pytest.raises(StorageError) as exc:
        storage.upload_file(str(tmp_path / "w.bin"), "flaky://b/run/w.bin")
    msg = str(exc.value)
    assert "flaky://b/run/w.bin" in msg and "after 3 attempts" in msg and "connection reset" in msg, msg
    assert "canary" not in msg.lower() and exc.value.__cause__ is None
    assert not storage.exists("flaky://b/run/w.bin") and _raw("flaky://b") == {}  # nothing, not half a file


def test_a_checkpoint_counts_only_with_its_complete_marker():
    from trainer_lib.engine.checkpoint import MARKER, CheckpointManager

    class Rank0:
        local_rank, rank, world_size, is_rank_0 = 0, 0, 1, True

    root = f"memory://posttrain-tests/{uuid.uuid4().hex}/ckpt"
    storage.write_text(f"{root}/step-00000002/model.pt", "weights")
    storage.write_text(f"{root}/step-00000002/{MARKER}", "{}")
    storage.write_text(f"{root}/step-00000004/model.pt", "half")  # killed before its marker
    manager = CheckpointManager(f"memory://posttrain-tests/{uuid.uuid4().hex}/out", Rank0(), checkpoint_dir=root)
    assert manager.complete_steps() == [2]
    storage.delete(root)
