"""Every other URL through fsspec: ``gs://``, ``az://``/``abfs://``, ``hf://``, ``file://``, ``memory://``...

fsspec finds the filesystem for the scheme (gcsfs, adlfs, huggingface_hub's HfFileSystem, ...;
a missing package is named in the error) and reads its credentials the way it always does
(environment, ``~/.config/fsspec``, the cloud SDK's default chain). The guarantees of the
``s3://`` backend hold here too, built from operations every fsspec filesystem has:

* Atomic objects: a file is written under a hidden temp name (``.NAME.tmp-<hex>``) next to its
  destination and moved into place, so a reader sees the whole file or none of it; a failed
  transfer removes its temp file.
* Checksums: the sha256 of every file written here goes into a hidden sidecar ``.NAME.sha256``
  (fsspec has no portable object metadata), and every download is checked against it. Sidecars
  and temp files never appear in listings.
* Retries: an ``OSError`` that is not "not found"/"permission denied" (a dropped connection, a
  timeout) is retried ``max_attempts`` times with backoff; every error names the URL and is redacted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import uuid

from trainer_lib.storage import base
from trainer_lib.storage.base import StorageError

_INTERNAL = re.compile(r"^\..+\.(sha256|tmp-[0-9a-f]{8,})$")
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


def filesystem(url: str):
    """``(filesystem, path inside it)`` for a URL; a ValueError naming the URL when no fsspec
    filesystem handles its scheme or the package that does is not installed."""
    import fsspec

    scheme = url.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise ValueError(
            f"{url!r}: the {scheme}:// scheme needs a package that is not installed ({' '.join(str(exc).split())})"
        ) from None
    except ValueError as exc:
        if "protocol not known" in str(exc).lower():
            raise ValueError(
                f"{url!r}: unsupported path scheme {scheme}:// (no fsspec filesystem has this "
                f"name; use a local path, s3://, gs://, az://, hf://, file://, ...)"
            ) from None
        raise ValueError(base.redact(f"{url!r}: {exc}")) from None


def is_local(fs) -> bool:
    """``file://``: a filesystem on this machine's disk."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


def shared(url: str) -> bool:
    """Whether other machines see what is written at ``url`` (not ``file://`` or ``memory://``)."""
    return url.split("://", 1)[0] not in ("file", "local", "memory")


def _call(op: str, url: str, fn):
    """``fn()``, its failures as FileNotFoundError / StorageError naming ``url``; transient ones retried."""
    attempts = int(base.option("max_attempts"))
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: not found") from None
        except PermissionError as e:
            raise StorageError(
                base.redact(f"{url}: could not {op}: permission denied ({e}); check the credentials of this store")
            ) from None
        except (StorageError, ValueError, TypeError, *_PERMANENT):
            raise
        except OSError as e:  # connection reset, timeout, a 5xx turned into OSError by the filesystem
            reason = e
            if attempt < attempts:
                base.sleep_before_retry(attempt)
        except Exception as e:
            raise StorageError(base.redact(f"{url}: could not {op}: {type(e).__name__}: {e}")) from None
    raise StorageError(base.redact(f"{url}: could not {op} after {attempts} attempts: {reason}")) from None


def _sidecar(path: str) -> str:
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.{base.SHA_KEY}")


def _temp(path: str) -> str:
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:12]}")


def _visible(rel: str) -> bool:
    return not _INTERNAL.match(posixpath.basename(rel))


def _stored_sha(fs, path: str) -> str | None:
    try:
        return fs.cat_file(_sidecar(path)).decode().strip() or None
    except FileNotFoundError:
        return None  # written by another tool


def _commit(fs, url: str, path: str, write, sha: str) -> None:
    """``write(temp path)``, then move it to ``path`` and record its sha256; the temp file is
    removed whatever happens."""
    tmp = _temp(path)
    if is_local(fs):
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
    try:
        _call("write", url, lambda: write(tmp))
        if fs.exists(_sidecar(path)):  # an overwrite: the old checksum must not meet the new bytes
            _call("write", url, lambda: fs.rm_file(_sidecar(path)))
        _call("write", url, lambda: fs.mv(tmp, path))
        _call("write", url, lambda: fs.pipe_file(_sidecar(path), sha.encode()))
    finally:
        with contextlib.suppress(Exception):  # cleanup must not hide why the write failed
            if fs.exists(tmp):
                fs.rm_file(tmp)


# --------------------------------------------------------------------------- the storage operations


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return bool(_call("stat", url, lambda: fs.exists(path)))


def isdir(url: str) -> bool:
    fs, path = filesystem(url)
    return bool(_call("stat", url, lambda: fs.isdir(path)))


def listdir(url: str) -> list[str]:
    fs, path = filesystem(url)
    if not isdir(url):
        raise FileNotFoundError(f"{url}: no such directory")
    names = {posixpath.basename(p.rstrip("/")) for p in _call("list", url, lambda: fs.ls(path, detail=False))}
    return sorted(n for n in names if n and _visible(n))


def _found(url: str) -> dict[str, dict]:
    """Relative path -> fsspec info of every file under the directory ``url``."""
    fs, path = filesystem(url)
    if not isdir(url):
        raise FileNotFoundError(f"{url}: no such directory")
    root = path.rstrip("/")
    found = _call("list", url, lambda: fs.find(root, detail=True))
    out = {posixpath.relpath(p, root): info for p, info in found.items()}
    return {rel: info for rel, info in out.items() if rel != "." and _visible(rel)}


def list_files(url: str) -> list[str]:
    return sorted(_found(url))


def _key(info: dict) -> str:
    """What tells one version of a file from the next: its listing entry (size, mtime/ETag/commit)."""
    return hashlib.sha256(str(sorted(info.items(), key=lambda kv: kv[0])).encode()).hexdigest()


def fingerprint_entries(url: str) -> list:
    fs, path = filesystem(url)
    if _call("stat", url, lambda: fs.isfile(path)):
        info = _call("stat", url, lambda: fs.info(path))
        return [("", info.get("size"), _key(info))]
    if not isdir(url):
        return []  # nothing there (yet): like an empty S3 prefix
    return sorted((rel, info.get("size"), _key(info)) for rel, info in _found(url).items())


def cache_state(url: str, kind: str) -> dict:
    """What identifies the content for :func:`trainer_lib.storage.localize`'s cache."""
    fs, path = filesystem(url)
    if kind != "dir" and _call("stat", url, lambda: fs.isfile(path)):
        info = _call("stat", url, lambda: fs.info(path))
        return {"kind": "file", "key": _key(info), "sha256": _stored_sha(fs, path)}
    if kind == "file" or not isdir(url):
        raise FileNotFoundError(f"{url}: not found")
    found = _found(url)
    if not found:
        raise FileNotFoundError(f"{url}: no files under this directory")
    return {"kind": "dir", "objects": {rel: _key(info) for rel, info in sorted(found.items())}}


def local_path(url: str) -> str | None:
    """The path on this machine of a ``file://`` URL (None for other schemes)."""
    fs, path = filesystem(url)
    return path if is_local(fs) else None


def read_bytes(url: str) -> bytes:
    fs, path = filesystem(url)
    data = _call("read", url, lambda: fs.cat_file(path))
    base.verify(url, _stored_sha(fs, path), hashlib.sha256(data).hexdigest())
    return data


def write_bytes(url: str, data: bytes) -> None:
    fs, path = filesystem(url)
    sha = hashlib.sha256(data).hexdigest()
    _commit(fs, url, path, lambda tmp: fs.pipe_file(tmp, data), sha)


def upload_file(src: str, url: str) -> None:
    """Upload the local file ``src`` (already checked to exist)."""
    fs, path = filesystem(url)
    _commit(fs, url, path, lambda tmp: fs.put_file(src, tmp), base.sha256_file(src))


def download_file(url: str, local: str) -> None:
    fs, path = filesystem(url)
    if not _call("stat", url, lambda: fs.isfile(path)):
        raise FileNotFoundError(f"{url}: not found")
    expected = _stored_sha(fs, path)
    with base.atomic_path(local) as tmp:
        _call("download", url, lambda: fs.get_file(path, tmp))
        base.verify(url, expected, base.sha256_file(tmp))


def copy_object(src: str, dest: str) -> bool:
    """A copy inside one filesystem without the bytes passing through here; False when ``src`` and
    ``dest`` live on different filesystems (the caller then downloads and uploads)."""
    fs, path = filesystem(src)
    dest_fs, dest_path = filesystem(dest)
    if dest_fs is not fs:
        return False
    sha = _stored_sha(fs, path)
    if sha is None:  # written by another tool: read it once to record a checksum for the copy
        return False
    _commit(fs, dest, dest_path, lambda tmp: fs.cp_file(path, tmp), sha)
    return True


def delete(url: str, missing_ok: bool = True) -> None:
    """Remove a file (and its sidecar) or a whole directory."""
    fs, path = filesystem(url)
    key = path.strip("/")
    if not key or (not is_local(fs) and url.split("://", 1)[0] != "memory" and "/" not in key):
        raise ValueError(f"{url}: refusing to delete a whole bucket or filesystem root")
    if not _call("stat", url, lambda: fs.exists(path)):
        if not missing_ok:
            raise FileNotFoundError(f"{url}: not found")
        return
    if _call("stat", url, lambda: fs.isdir(path)):
        _call("delete", url, lambda: fs.rm(path, recursive=True))
        return
    _call("delete", url, lambda: fs.rm_file(path))
    if fs.exists(_sidecar(path)):
        _call("delete", url, lambda: fs.rm_file(_sidecar(path)))


def makedirs(url: str) -> None:
    """Object stores have no directories; a ``file://`` URL gets them."""
    fs, path = filesystem(url)
    if is_local(fs):
        os.makedirs(path, exist_ok=True)
