"""One path interface for local files and ``s3://bucket/prefix`` objects.

Stages get their paths from pipeline parameters: S3/MinIO in the cluster, local
disk on a laptop. Routing all I/O through here keeps them ignorant of which.

* boto3 is imported lazily, so purely local runs never need it.
* Credentials come only from boto3's own chain; nothing here stores or logs
  them, and error messages pass through :func:`redact`.
* Nothing half-written is left behind: local files go to a temp file in the
  same directory and are ``os.replace``-d, directories are assembled in a temp
  directory and renamed, and boto3 aborts failed multipart uploads.
* Downloads are checked against a sha256 we keep in the object's metadata,
  because S3's own checksums of multipart objects are per part, not per file.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import logging
import os
import random
import re
import shutil
import tempfile
import threading
import time

log = logging.getLogger(__name__)

MiB = 1024 * 1024
_SHA_KEY = "sha256"  # sent as x-amz-meta-sha256
_settings: dict = {}
_clients: dict = {}  # (endpoint, region, attempts) -> (session, client)
_clients_lock = threading.Lock()
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
               "MINIO_ACCESS_KEY", "MINIO_SECRET_KEY", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD")


#: Error codes of a request refused for its credentials (not retried: another try cannot help).
_REFUSED = ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken")


class StorageError(RuntimeError):
    """The object store failed or returned bad data; the message names the path."""


def configure(endpoint_url: str | None = None, region: str | None = None, cache_dir: str | None = None,
              max_attempts: int | None = None, multipart_threshold: int | None = None,
              multipart_chunksize: int | None = None, reset: bool = False) -> None:
    """Set process-wide options. ``None`` keeps the current value and ``reset``
    first drops them all; unset options are read from the environment at use
    time, so environment changes made after import still count."""
    if reset:
        _settings.clear()
    given = dict(endpoint_url=endpoint_url, region=region, cache_dir=cache_dir, max_attempts=max_attempts,
                 multipart_threshold=multipart_threshold, multipart_chunksize=multipart_chunksize)
    _settings.update({k: v for k, v in given.items() if v is not None})
    with _clients_lock:
        _clients.clear()


def _opt(name: str):
    if _settings.get(name) is not None:
        return _settings[name]
    env = os.environ.get
    return {
        "endpoint_url": env("AWS_ENDPOINT_URL") or env("AWS_ENDPOINT_URL_S3") or env("S3_ENDPOINT_URL") or None,
        "region": env("AWS_DEFAULT_REGION") or env("AWS_REGION") or "us-east-1",
        "cache_dir": env("POSTTRAIN_CACHE") or os.path.join("~", ".cache", "posttrain"),
        "max_attempts": 5, "multipart_threshold": 64 * MiB, "multipart_chunksize": 16 * MiB,
    }[name]


def cache_root() -> str:
    """Where s3 downloads are cached; other modules stage their own files under it."""
    return os.path.abspath(os.path.expanduser(_opt("cache_dir")))


def _client():
    import boto3
    from botocore.config import Config
    endpoint, region, attempts = _opt("endpoint_url"), _opt("region"), int(_opt("max_attempts"))
    with _clients_lock:
        if (endpoint, region, attempts) not in _clients:
            session = boto3.session.Session(region_name=region)
            cfg = Config(retries={"max_attempts": attempts, "mode": "standard"}, connect_timeout=10,
                         read_timeout=120, max_pool_connections=64,
                         s3={"addressing_style": "path"} if endpoint else None)  # MinIO wants path style
            _clients[endpoint, region, attempts] = (session, session.client("s3", endpoint_url=endpoint, config=cfg))
        return _clients[endpoint, region, attempts][1]


def _transfer_config():
    from boto3.s3.transfer import TransferConfig
    return TransferConfig(multipart_threshold=int(_opt("multipart_threshold")),
                          multipart_chunksize=int(_opt("multipart_chunksize")),
                          num_download_attempts=int(_opt("max_attempts")))


def redact(text: str) -> str:
    """Blank out credentials known to this process (environment and boto3's
    resolved chain), access-key-shaped tokens, ``secret_key=...`` and URL userinfo."""
    text, secrets = str(text), {os.environ.get(k, "") for k in _SECRET_ENV}
    for session, _ in list(_clients.values()):
        with contextlib.suppress(Exception):
            creds = session.get_credentials().get_frozen_credentials()
            secrets |= {creds.access_key or "", creds.secret_key or "", creds.token or ""}
    for s in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(s, "***")
    text = re.sub(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b", "***", text)
    text = re.sub(r"(?i)(secret[_-]?(access[_-]?)?key|session[_-]?token)(\s*[=:]\s*)\S+", r"\1\3***", text)
    return re.sub(r"(://)[^/@\s:]+:[^/@\s]+@", r"\1***@", text)


def is_remote(path) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def _local(path) -> str:
    """Reject other URL schemes loudly instead of creating a directory called 'gs:'."""
    path = os.fspath(path)
    if _SCHEME.match(path):
        raise ValueError(f"{path!r}: unsupported path scheme (use a local path or s3://bucket/key)")
    return os.path.expanduser(path)


def split_s3(uri: str) -> tuple[str, str]:
    if not is_remote(uri):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"{uri!r}: invalid bucket name {bucket!r} (expected s3://bucket/key)")
    return bucket, key


def join(base, *parts) -> str:
    if not is_remote(base):
        return os.path.join(_local(base), *map(str, parts))
    return "/".join([base.rstrip("/"), *(p for p in (str(p).strip("/") for p in parts) if p)])


def _prefix(key: str) -> str:
    return key.rstrip("/") + "/" if key.strip("/") else ""


def _call(op: str, uri: str, fn):
    """Run ``fn``, turning boto failures into FileNotFoundError / StorageError.

    botocore has already retried each request ``max_attempts`` times with
    backoff; we only retry what it cannot see: a connection dropping while a
    response body streams."""
    from boto3.exceptions import Boto3Error, S3UploadFailedError
    from botocore.exceptions import (BotoCoreError, ClientError, IncompleteReadError,
                                     NoCredentialsError, ResponseStreamingError)
    attempts = int(_opt("max_attempts"))
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (IncompleteReadError, ResponseStreamingError) as e:
            reason = e
            if attempt < attempts:
                time.sleep(min(0.2 * 2 ** attempt, 10) * random.uniform(0.5, 1.0))
        except NoCredentialsError:
            raise StorageError(f"{uri}: could not {op}: no S3 credentials found "
                               "(set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or use a role)") from None
        except (ClientError, S3UploadFailedError) as e:
            err = e if isinstance(e, ClientError) else e.__context__  # boto3 drops the ClientError
            code = err.response.get("Error", {}).get("Code", "") if isinstance(err, ClientError) else ""
            if code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound"):
                raise FileNotFoundError(f"{uri}: not found ({code})") from None
            hint = " (check credentials and bucket policy)" if code in _REFUSED else ""
            raise StorageError(redact(f"{uri}: could not {op}: {err or e}{hint}")) from None
        except (BotoCoreError, Boto3Error, ConnectionError, TimeoutError) as e:
            reason = e
            break
    raise StorageError(redact(f"{uri}: could not {op} after {attempts} attempts: {reason}")) from None


def _head(bucket: str, key: str) -> dict | None:
    """Object metadata, or None when there is no object at exactly this key."""
    if not key or key.endswith("/"):
        return None
    with contextlib.suppress(FileNotFoundError):
        return _call("stat", f"s3://{bucket}/{key}", lambda: _client().head_object(Bucket=bucket, Key=key))
    return None


def _list(bucket: str, prefix: str, delimiter: str = "") -> list[dict]:
    """All list_objects_v2 pages (prefixes can hold more than 1000 objects)."""
    kw = dict(Bucket=bucket, Prefix=prefix, **({"Delimiter": delimiter} if delimiter else {}))
    return _call("list", f"s3://{bucket}/{prefix}",
                 lambda: list(_client().get_paginator("list_objects_v2").paginate(**kw)))


def _objects(uri: str, required: bool = False) -> dict[str, dict]:
    """Relative path -> listing entry for every object under the prefix ``uri``/."""
    bucket, key = split_s3(uri)
    prefix = _prefix(key)
    objs = {o["Key"][len(prefix):]: o for page in _list(bucket, prefix)
            for o in page.get("Contents", []) if not o["Key"].endswith("/")}
    if required and not objs:
        raise FileNotFoundError(f"{uri}: no object or prefix with this name")
    return objs


def fingerprint(path) -> str:
    """What identifies the content behind a location, cheaply: sizes and ETags of the objects under an
    ``s3://`` key or prefix, sizes and modification times of local files, the revision of a hub repo
    (or, when the hub cannot be asked, the time: never equal twice). Equal fingerprints: same content."""
    if is_remote(path):
        bucket, key = split_s3(path)
        head = _head(bucket, key)
        entries = ([("", head["ContentLength"], head["ETag"])] if head else
                   sorted((rel, o["Size"], o["ETag"]) for rel, o in _objects(path).items()))
    elif os.path.exists(_local(path)):
        root = _local(path)
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
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


def require_bucket(path) -> None:
    """Before any work that ends in writing to ``path``: fail when its bucket does not exist or
    refuses these credentials (nothing to check for a local path)."""
    if not is_remote(path):
        return
    bucket, _ = split_s3(path)
    try:
        _call("reach its bucket", path, lambda: _client().head_bucket(Bucket=bucket))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: bucket '{bucket}' does not exist") from None


def exists(path) -> bool:
    if not is_remote(path):
        return os.path.exists(_local(path))
    bucket, key = split_s3(path)
    return _head(bucket, key) is not None or isdir(path)


def isdir(path) -> bool:
    if not is_remote(path):
        return os.path.isdir(_local(path))
    bucket, key = split_s3(path)
    with contextlib.suppress(FileNotFoundError):
        return any(p.get("KeyCount", 0) for p in _list(bucket, _prefix(key))) or not key.strip("/")
    return False


def listdir(path) -> list[str]:
    if not is_remote(path):
        return sorted(os.listdir(_local(path)))
    bucket, key = split_s3(path)
    prefix, names = _prefix(key), set()
    for page in _list(bucket, prefix, delimiter="/"):
        names |= {p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])}
        names |= {o["Key"][len(prefix):] for o in page.get("Contents", [])}
    names.discard("")
    if not names and prefix:
        raise FileNotFoundError(f"{path}: no such prefix")
    return sorted(names)


def list_files(path) -> list[str]:
    if is_remote(path):
        return sorted(_objects(path))
    root = _local(path)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: no such directory")
    return sorted(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                  for d, _, files in os.walk(root) for f in files)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 * MiB), b""):
            h.update(block)
    return h.hexdigest()


def _verify(uri: str, metadata: dict, actual: str) -> None:
    expected = metadata.get(_SHA_KEY)  # absent for objects written by other tools
    if expected and expected != actual:
        raise StorageError(f"{uri}: checksum mismatch (metadata sha256 {expected}, downloaded {actual})")


@contextlib.contextmanager
def _atomic_path(dest: str):
    """Yield a temp path next to ``dest``; it replaces ``dest`` only on success."""
    dest = os.path.abspath(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=f".{os.path.basename(dest)}.tmp-")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp's 0600 would surprise other readers
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def read_bytes(path) -> bytes:
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            return f.read()
    bucket, key = split_s3(path)

    def get():
        resp = _client().get_object(Bucket=bucket, Key=key)
        return resp, resp["Body"].read()
    resp, data = _call("read", path, get)
    _verify(path, resp.get("Metadata", {}), hashlib.sha256(data).hexdigest())
    return data


def read_text(path, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


def write_bytes(path, data: bytes) -> None:
    if not is_remote(path):
        with _atomic_path(_local(path)) as tmp, open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return
    bucket, key = split_s3(path)
    extra = {"Metadata": {_SHA_KEY: hashlib.sha256(data).hexdigest()}, "ChecksumAlgorithm": "SHA256"}
    _call("write", path, lambda: _client().upload_fileobj(io.BytesIO(data), bucket, key, ExtraArgs=extra,
                                                          Config=_transfer_config()))


def write_text(path, text: str, encoding: str = "utf-8") -> None:
    write_bytes(path, text.encode(encoding))


def upload_file(local_path, dest: str) -> None:
    src = _local(local_path)
    bucket, key = split_s3(dest)
    if not os.path.isfile(src):
        raise FileNotFoundError(f"{src}: no such file")
    extra = {"Metadata": {_SHA_KEY: _sha256_file(src)}, "ChecksumAlgorithm": "SHA256"}
    _call("upload", dest, lambda: _client().upload_file(src, bucket, key, ExtraArgs=extra,
                                                        Config=_transfer_config()))


def download_file(src: str, local_path, _head_info: dict | None = None) -> None:
    bucket, key = split_s3(src)
    head = _head_info or _head(bucket, key)
    if head is None:
        raise FileNotFoundError(f"{src}: not found")
    with _atomic_path(_local(local_path)) as tmp:
        _call("download", src, lambda: _client().download_file(bucket, key, tmp, Config=_transfer_config()))
        _verify(src, head.get("Metadata", {}), _sha256_file(tmp))


def _parallel(fn, items) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for fut in [pool.submit(fn, *it) for it in items]:
            fut.result()


def upload_dir(local_dir, dest_prefix: str) -> None:
    root = _local(local_dir)
    _parallel(upload_file, [(os.path.join(root, rel), join(dest_prefix, rel)) for rel in list_files(root)])


def download_dir(src_prefix: str, local_dir) -> None:
    """Files already in ``local_dir`` but not under the prefix are left alone."""
    _download_tree(src_prefix, _local(local_dir), _objects(src_prefix, required=True))


def _download_tree(src_prefix: str, dest: str, objects: dict) -> None:
    """Fill a temp dir, then rename it into place (or, when ``dest`` exists,
    os.replace file by file) so a failure never leaves a partial tree."""
    dest = os.path.abspath(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(dest), prefix=f".{os.path.basename(dest)}.tmp-")
    try:
        _parallel(download_file, [(join(src_prefix, rel), os.path.join(tmp, rel)) for rel in objects])
        if not os.path.exists(dest):
            return os.rename(tmp, dest)
        for rel in objects:
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            os.replace(os.path.join(tmp, rel), os.path.join(dest, rel))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy(src, dest) -> None:
    """Copy a file or a whole directory/prefix between any two kinds of path."""
    if not is_remote(src):
        local = _local(src)
        if os.path.isdir(local):
            return _parallel(copy, [(os.path.join(local, r), join(dest, r)) for r in list_files(local)])
        if is_remote(dest):
            return upload_file(local, dest)
        with _atomic_path(_local(dest)) as tmp:
            shutil.copyfile(local, tmp)
        return None
    bucket, key = split_s3(src)
    head = _head(bucket, key)
    if head is None and not is_remote(dest):
        return _download_tree(src, _local(dest), _objects(src, required=True))
    if head is None:
        return _parallel(copy, [(join(src, r), join(dest, r)) for r in _objects(src, required=True)])
    if not is_remote(dest):
        return download_file(src, dest, head)
    dest_bucket, dest_key = split_s3(dest)  # server-side; metadata (our sha256) is copied along
    return _call("copy", dest, lambda: _client().copy({"Bucket": bucket, "Key": key}, dest_bucket, dest_key,
                                                      Config=_transfer_config()))


def delete(path, missing_ok: bool = True) -> None:
    """Remove a file or a whole tree/prefix (``s3://b/run1`` never touches ``run10/``)."""
    if not is_remote(path):
        p = _local(path)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p) or not missing_ok:
            os.remove(p)
        return
    bucket, key = split_s3(path)
    if not key.strip("/"):
        raise ValueError(f"{path}: refusing to delete a whole bucket")
    keys = ([key] if _head(bucket, key) else []) + [_prefix(key) + rel for rel in _objects(path)]
    if not keys and not missing_ok:
        raise FileNotFoundError(f"{path}: not found")
    for i in range(0, len(keys), 1000):
        batch = {"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True}
        errors = _call("delete", path, lambda: _client().delete_objects(Bucket=bucket, Delete=batch)).get("Errors")
        if errors:
            raise StorageError(f"{path}: could not delete {len(errors)} objects, "
                               f"e.g. {errors[0].get('Key')}: {errors[0].get('Code')}")


def makedirs(path) -> None:
    """S3 has no directories, so this only matters locally."""
    if not is_remote(path):
        os.makedirs(_local(path), exist_ok=True)


@contextlib.contextmanager
def _lock(lock_path: str):
    """Serialise cache fills across processes (e.g. all ranks on one node)."""
    import fcntl  # POSIX only, like the training images
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


def localize(path, kind: str = "auto") -> str:
    """Return a local path for ``path``, downloading s3 objects into the cache.

    A manifest of ETag/size/sha256 beside the cached copy lets repeat calls
    skip the download while the remote side is unchanged."""
    if kind not in ("auto", "file", "dir"):
        raise ValueError(f"kind must be 'auto', 'file' or 'dir', not {kind!r}")
    if not is_remote(path):
        return _local(path)
    bucket, key = split_s3(path)
    head = _head(bucket, key) if kind != "dir" else None
    if head is None and kind == "file":
        raise FileNotFoundError(f"{path}: not found")
    if head is not None:
        state = {"kind": "file", "etag": head["ETag"], "size": head["ContentLength"],
                 "sha256": head.get("Metadata", {}).get(_SHA_KEY)}
    else:
        objs = _objects(path, required=True)
        state = {"kind": "dir", "objects": {r: [o["ETag"], o["Size"]] for r, o in sorted(objs.items())}}
    local = os.path.join(cache_root(), "s3", bucket, *[p for p in key.split("/") if p])
    parent, name = os.path.split(local)
    manifest = os.path.join(parent, f".{name}.manifest.json")
    with _lock(os.path.join(parent, f".{name}.lock")):
        with contextlib.suppress(OSError, ValueError), open(manifest) as f:
            if json.load(f) == state and os.path.exists(local):
                log.debug("cache hit for %s", path)
                return local
        log.info("downloading %s into the cache at %s", path, local)
        delete(manifest)
        delete(local)  # a stale copy, or a file where a directory now goes
        if head is not None:
            download_file(path, local, head)
        else:
            _download_tree(path, local, objs)
        write_text(manifest, json.dumps(state, sort_keys=True))
    return local
