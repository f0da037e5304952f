"""What every storage backend shares: settings, errors, secret redaction, checksums, atomic local files.

Nothing here knows a URL scheme; :mod:`trainer_lib.storage` picks the backend.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import random
import re
import tempfile
import threading
import time

MiB = 1024 * 1024
SHA_KEY = "sha256"  # the checksum's name: S3 object metadata key, and the suffix of fsspec sidecars
_settings: dict = {}
#: S3 sessions and clients by (endpoint, region, attempts); :func:`redact` reads their credentials.
CLIENTS: dict = {}
CLIENTS_LOCK = threading.Lock()
_UMASK = os.umask(0o022)
os.umask(_UMASK)
#: environment variables that hold credentials of the stores (and the hub) this package talks to.
SECRET_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "MINIO_ACCESS_KEY",
    "MINIO_SECRET_KEY",
    "MINIO_ROOT_USER",
    "MINIO_ROOT_PASSWORD",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)


class StorageError(RuntimeError):
    """The object store failed or returned bad data; the message names the path."""


def configure(
    endpoint_url: str | None = None,
    region: str | None = None,
    cache_dir: str | None = None,
    max_attempts: int | None = None,
    multipart_threshold: int | None = None,
    multipart_chunksize: int | None = None,
    reset: bool = False,
) -> None:
    """Set process-wide options. ``None`` keeps the current value and ``reset``
    first drops them all; unset options are read from the environment at use
    time, so environment changes made after import still count."""
    if reset:
        _settings.clear()
    given = dict(
        endpoint_url=endpoint_url,
        region=region,
        cache_dir=cache_dir,
        max_attempts=max_attempts,
        multipart_threshold=multipart_threshold,
        multipart_chunksize=multipart_chunksize,
    )
    _settings.update({k: v for k, v in given.items() if v is not None})
    with CLIENTS_LOCK:
        CLIENTS.clear()


def option(name: str):
    """A setting from :func:`configure`, else from the environment, else its default."""
    if _settings.get(name) is not None:
        return _settings[name]
    env = os.environ.get
    return {
        "endpoint_url": env("AWS_ENDPOINT_URL") or env("AWS_ENDPOINT_URL_S3") or env("S3_ENDPOINT_URL") or None,
        "region": env("AWS_DEFAULT_REGION") or env("AWS_REGION") or "us-east-1",
        "cache_dir": env("POSTTRAIN_CACHE") or os.path.join("~", ".cache", "posttrain"),
        "max_attempts": 5,
        "multipart_threshold": 64 * MiB,
        "multipart_chunksize": 16 * MiB,
    }[name]


def cache_root() -> str:
    """Where remote downloads are cached; other modules stage their own files under it."""
    return os.path.abspath(os.path.expanduser(option("cache_dir")))


def redact(text: str) -> str:
    """Blank out credentials known to this process (environment and boto3's resolved chain),
    access-key-shaped and Hugging Face tokens, ``secret_key=...``, Azure account keys and SAS
    signatures, and URL userinfo."""
    text, secrets = str(text), {os.environ.get(k, "") for k in SECRET_ENV}
    for session, _ in list(CLIENTS.values()):
        with contextlib.suppress(Exception):
            creds = session.get_credentials().get_frozen_credentials()
            secrets |= {creds.access_key or "", creds.secret_key or "", creds.token or ""}
    for s in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(s, "***")
    text = re.sub(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b", "***", text)
    text = re.sub(r"\bhf_[A-Za-z0-9]{20,}\b", "***", text)
    text = re.sub(
        r"(?i)(secret[_-]?(access[_-]?)?key|session[_-]?token|account[_-]?key|sig|token)(\s*[=:]\s*)"
        r"[^\s;&'\"]+",
        r"\1\3***",
        text,
    )
    return re.sub(r"(://)[^/@\s:]+:[^/@\s]+@", r"\1***@", text)


def retry_delay(attempt: int) -> float:
    """Seconds to wait before attempt ``attempt + 1``: exponential with jitter, at most 10."""
    return min(0.2 * 2**attempt, 10) * random.uniform(0.5, 1.0)


def sleep_before_retry(attempt: int) -> None:
    time.sleep(retry_delay(attempt))


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 * MiB), b""):
            h.update(block)
    return h.hexdigest()


def verify(uri: str, expected: str | None, actual: str) -> None:
    """A StorageError when a stored checksum exists and differs (objects written by other tools have none)."""
    if expected and expected != actual:
        raise StorageError(f"{uri}: checksum mismatch (stored sha256 {expected}, downloaded {actual})")


@contextlib.contextmanager
def atomic_path(dest: str):
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


def parallel(fn, items) -> None:
    """``fn(*item)`` for every item on 8 threads; the first failure is raised."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for fut in [pool.submit(fn, *it) for it in items]:
            fut.result()
