"""One path interface for local files, ``s3://`` objects and every other fsspec URL.

Stages get their paths from pipeline parameters: S3/MinIO in the cluster, GCS or Azure Blob in
another cloud, the Hugging Face Hub, local disk on a laptop. Routing all I/O through here keeps
them ignorant of which. Three backends answer the same operations:

    local paths        plain files (a ``~`` is expanded)
    s3://bucket/key    boto3 (:mod:`.s3`): MinIO endpoints, multipart uploads, sha256 in metadata
    any other URL      fsspec (:mod:`.fs`): gs://, az://, hf://, file://, memory://, ...

What holds for all of them:

* Nothing half-written is left behind: local files go to a temp file in the same directory and
  are ``os.replace``-d, directories are assembled in a temp directory and renamed, remote objects
  appear whole or not at all.
* Downloads are checked against the sha256 recorded when the file was written here.
* Errors name the path; credentials are redacted from them (:func:`redact`). A path that does
  not exist is a ``FileNotFoundError`` naming it; an unknown scheme a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time

from trainer_lib.storage import file_lock
from trainer_lib.storage import fs as _fsspec
from trainer_lib.storage import s3 as _s3
from trainer_lib.storage.base import StorageError, atomic_path, cache_root, configure, parallel, redact  # noqa: F401
from trainer_lib.storage.s3 import split_s3  # noqa: F401 - part of the interface

log = logging.getLogger(__name__)

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def scheme(path) -> str:
    """``"s3"``, ``"gs"``, ``"memory"``... for a URL; ``""`` for a local path."""
    return path.split("://", 1)[0].lower() if isinstance(path, str) and _URL.match(path) else ""


def is_remote(path) -> bool:
    """Whether ``path`` is a URL (``s3://``, ``gs://``, ``file://``...), which this module reads and
    writes for the caller, rather than a path on this machine's disk."""
    return bool(scheme(path))


def is_shared(path) -> bool:
    """Whether every node of a cluster sees ``path``: a URL of an object store or the hub, not a
    local path, ``file://`` or ``memory://``."""
    return is_remote(path) and (scheme(path) == "s3" or _fsspec.shared(path))


def _backend(path):
    """The module that handles a URL: s3 for ``s3://``, fsspec for every other scheme."""
    return _s3 if scheme(path) == "s3" else _fsspec


def _local(path) -> str:
    return os.path.expanduser(os.fspath(path))


def join(base, *parts) -> str:
    if not is_remote(base):
        return os.path.join(_local(base), *map(str, parts))
    return "/".join([base.rstrip("/"), *(p for p in (str(p).strip("/") for p in parts) if p)])


# --------------------------------------------------------------------------- what is there


def require_bucket(path) -> None:
    """Before any work that ends in writing to ``path``: fail when its ``s3://`` bucket does not
    exist or refuses these credentials (other locations are checked when first written)."""
    if scheme(path) == "s3":
        _s3.require_bucket(path)


def exists(path) -> bool:
    return _backend(path).exists(path) if is_remote(path) else os.path.exists(_local(path))


def isdir(path) -> bool:
    return _backend(path).isdir(path) if is_remote(path) else os.path.isdir(_local(path))


def listdir(path) -> list[str]:
    return _backend(path).listdir(path) if is_remote(path) else sorted(os.listdir(_local(path)))


def list_files(path) -> list[str]:
    """Every file under a directory or prefix, as sorted relative paths with ``/``."""
    if is_remote(path):
        return _backend(path).list_files(path)
    root = _local(path)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: no such directory")
    return sorted(
        os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for d, _, files in os.walk(root) for f in files
    )


def fingerprint(path) -> str:
    """What identifies the content behind a location, cheaply: sizes and ETags (or listing entries)
    of the objects under a URL, sizes and modification times of local files, the revision of a hub
    repo (or, when the hub cannot be asked, the time: never equal twice). Equal fingerprints: same
    content."""
    if is_remote(path):
        entries = _backend(path).fingerprint_entries(path)
    elif os.path.exists(_local(path)):
        root = _local(path)
        files = (
            [root]
            if os.path.isfile(root)
            else sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
        )
        entries = [(os.path.relpath(f, root), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
    else:
        entries = [("hub", path, _hub_revision(path))]
    return hashlib.sha256(json.dumps(entries, default=str).encode()).hexdigest()


def _hub_revision(repo_id: str) -> str:
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        for info in (api.model_info, api.dataset_info):
            with contextlib.suppress(Exception):
                return info(repo_id, timeout=10).sha
    except ImportError:
        pass
    return f"unknown@{time.time_ns()}"  # not knowable: never the same, so never answered from a cache


# --------------------------------------------------------------------------- files


def read_bytes(path) -> bytes:
    if is_remote(path):
        return _backend(path).read_bytes(path)
    with open(_local(path), "rb") as f:
        return f.read()


def read_text(path, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


def write_bytes(path, data: bytes) -> None:
    if is_remote(path):
        return _backend(path).write_bytes(path, data)
    with atomic_path(_local(path)) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return None


def write_text(path, text: str, encoding: str = "utf-8") -> None:
    write_bytes(path, text.encode(encoding))


def upload_file(local_path, dest: str) -> None:
    src = _local(local_path)
    if not is_remote(dest):
        raise ValueError(f"{dest!r}: upload_file needs a URL such as s3://bucket/key (use copy for local paths)")
    if not os.path.isfile(src):
        raise FileNotFoundError(f"{src}: no such file")
    _backend(dest).upload_file(src, dest)


def download_file(src: str, local_path) -> None:
    if not is_remote(src):
        raise ValueError(f"{src!r}: download_file needs a URL such as s3://bucket/key (use copy for local paths)")
    _backend(src).download_file(src, _local(local_path))


# --------------------------------------------------------------------------- trees


def upload_dir(local_dir, dest_prefix: str) -> None:
    root = _local(local_dir)
    parallel(upload_file, [(os.path.join(root, rel), join(dest_prefix, rel)) for rel in list_files(root)])


def download_dir(src_prefix: str, local_dir) -> None:
    """Files already in ``local_dir`` but not under the prefix are left alone."""
    files = list_files(src_prefix)
    if not files:
        raise FileNotFoundError(f"{src_prefix}: no object or prefix with this name")
    _download_tree(src_prefix, _local(local_dir), files)


def _download_tree(src_prefix: str, dest: str, files: list[str]) -> None:
    """Fill a temp dir, then rename it into place (or, when ``dest`` exists,
    os.replace file by file) so a failure never leaves a partial tree."""
    dest = os.path.abspath(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(dest), prefix=f".{os.path.basename(dest)}.tmp-")
    try:
        parallel(download_file, [(join(src_prefix, rel), os.path.join(tmp, rel)) for rel in files])
        if not os.path.exists(dest):
            return os.rename(tmp, dest)
        for rel in files:
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            os.replace(os.path.join(tmp, rel), os.path.join(dest, rel))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_file(path) -> bool:
    if not is_remote(path):
        return os.path.isfile(_local(path))
    return exists(path) and not isdir(path) if scheme(path) != "s3" else _s3.head(path) is not None


def copy(src, dest) -> None:
    """Copy a file or a whole directory/prefix between any two kinds of path."""
    if not _is_file(src):
        files = list_files(src)
        if is_remote(src) and not files:
            raise FileNotFoundError(f"{src}: no object or prefix with this name")
        if is_remote(src) and not is_remote(dest):
            return _download_tree(src, _local(dest), files)
        return parallel(copy, [(join(src, rel), join(dest, rel)) for rel in files])
    if not is_remote(src) and not is_remote(dest):
        with atomic_path(_local(dest)) as tmp:
            shutil.copyfile(_local(src), tmp)
        return None
    if not is_remote(src):
        return upload_file(src, dest)
    if not is_remote(dest):
        return download_file(src, dest)
    if scheme(src) == scheme(dest) == "s3":
        return _s3.copy_object(src, dest)  # server-side
    if scheme(src) != "s3" and scheme(dest) != "s3" and _fsspec.copy_object(src, dest):
        return None
    staged = os.path.join(cache_root(), "copies", hashlib.sha1(f"{src}->{dest}".encode()).hexdigest()[:16])
    try:  # between two stores: through this machine, checked on the way down
        download_file(src, staged)
        upload_file(staged, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(staged)
    return None


def delete(path, missing_ok: bool = True) -> None:
    """Remove a file or a whole tree/prefix (``s3://b/run1`` never touches ``run10/``)."""
    if is_remote(path):
        return _backend(path).delete(path, missing_ok)
    p = _local(path)
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p) or not missing_ok:
        os.remove(p)
    return None


def makedirs(path) -> None:
    """Object stores have no directories, so this only matters on a disk."""
    if not is_remote(path):
        os.makedirs(_local(path), exist_ok=True)
    elif scheme(path) != "s3":
        _fsspec.makedirs(path)


# --------------------------------------------------------------------------- the download cache


def _cache_location(path: str) -> str:
    """``<cache>/<scheme>/<bucket or host>/<key>``: one place per URL."""
    rest = path.split("://", 1)[1]
    return os.path.join(cache_root(), scheme(path), *[p for p in rest.split("/") if p not in ("", ".", "..")])


def localize(path, kind: str = "auto") -> str:
    """Return a local path for ``path``, downloading remote files into the cache.

    A manifest of what identifies the remote content (ETags/sizes, listing entries, sha256) beside
    the cached copy lets repeat calls skip the download while the remote side is unchanged. A
    ``file://`` URL is its own local path."""
    if kind not in ("auto", "file", "dir"):
        raise ValueError(f"kind must be 'auto', 'file' or 'dir', not {kind!r}")
    if not is_remote(path):
        return _local(path)
    if scheme(path) != "s3" and _fsspec.local_path(path) is not None:
        local = _fsspec.local_path(path)
        if not os.path.exists(local) or (kind == "file" and not os.path.isfile(local)):
            raise FileNotFoundError(f"{path}: not found")
        return local
    state = _backend(path).cache_state(path, kind)
    local = _cache_location(path)
    parent, name = os.path.split(local)
    manifest = os.path.join(parent, f".{name}.manifest.json")
    # one download per cache entry at a time (e.g. all ranks on a node); a wait says who holds it, and is bounded
    with file_lock.exclusive(os.path.join(parent, f".{name}.lock"), f"downloading {redact(path)}", "storage cache"):
        with contextlib.suppress(OSError, ValueError), open(manifest) as f:
            if json.load(f) == state and os.path.exists(local):
                log.debug("cache hit for %s", path)
                return local
        log.info("downloading %s into the cache at %s", path, local)
        delete(manifest)
        delete(local)  # a stale copy, or a file where a directory now goes
        if state["kind"] == "file":
            download_file(path, local)
        else:
            _download_tree(path, local, sorted(state["objects"]))
        write_text(manifest, json.dumps(state, sort_keys=True))
    return local
