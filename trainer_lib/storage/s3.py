"""``s3://bucket/key`` through boto3 (AWS S3, MinIO, any S3-compatible endpoint).

* boto3 is imported lazily, so purely local runs never need it.
* Credentials come only from boto3's own chain; nothing here stores or logs them, and error
  messages pass through :func:`~trainer_lib.storage.base.redact`.
* Uploads are atomic per object (boto3 aborts failed multipart uploads) and carry a sha256 in the
  object's metadata, checked on download, because S3's own checksums of multipart objects are
  per part, not per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re

from trainer_lib.storage.base import (
    CLIENTS,
    CLIENTS_LOCK,
    SHA_KEY,
    StorageError,
    atomic_path,
    option,
    redact,
    sha256_file,
    sleep_before_retry,
    verify,
)

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
#: Error codes of a request refused for its credentials (not retried: another try cannot help).
_REFUSED = ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken")


def split_s3(uri: str) -> tuple[str, str]:
    if not (isinstance(uri, str) and uri.startswith("s3://")):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not _BUCKET.match(bucket):
        raise ValueError(f"{uri!r}: invalid bucket name {bucket!r} (expected s3://bucket/key)")
    return bucket, key


def _client():
    import boto3
    from botocore.config import Config

    endpoint, region, attempts = option("endpoint_url"), option("region"), int(option("max_attempts"))
    with CLIENTS_LOCK:
        if (endpoint, region, attempts) not in CLIENTS:
            session = boto3.session.Session(region_name=region)
            cfg = Config(
                retries={"max_attempts": attempts, "mode": "standard"},
                connect_timeout=10,
                read_timeout=120,
                max_pool_connections=64,
                s3={"addressing_style": "path"} if endpoint else None,
            )  # MinIO wants path style
            CLIENTS[endpoint, region, attempts] = (session, session.client("s3", endpoint_url=endpoint, config=cfg))
        return CLIENTS[endpoint, region, attempts][1]


def _transfer_config():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=int(option("multipart_threshold")),
        multipart_chunksize=int(option("multipart_chunksize")),
        num_download_attempts=int(option("max_attempts")),
    )


def _prefix(key: str) -> str:
    return key.rstrip("/") + "/" if key.strip("/") else ""


def _call(op: str, uri: str, fn):
    """Run ``fn``, turning boto failures into FileNotFoundError / StorageError.

    botocore has already retried each request ``max_attempts`` times with
    (jittered, sometimes very short) backoff; we retry, with our own backoff
    (at least ~3 s in all), what it cannot see or gave up on too early: a
    connection dropping while a response body streams, and a server that
    refuses or drops connections for a moment (a restart)."""
    from boto3.exceptions import Boto3Error, S3UploadFailedError
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        IncompleteReadError,
        NoCredentialsError,
        ResponseStreamingError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    attempts = int(option("max_attempts"))
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (IncompleteReadError, ResponseStreamingError, BotoConnectionError, HTTPClientError) as e:
            reason = e
            if attempt < attempts:
                sleep_before_retry(attempt)
        except NoCredentialsError:
            raise StorageError(
                f"{uri}: could not {op}: no S3 credentials found "
                "(set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or use a role)"
            ) from None
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


def require_bucket(uri: str) -> None:
    """Fail when the bucket of ``uri`` does not exist or refuses these credentials."""
    bucket, _ = split_s3(uri)
    try:
        _call("reach its bucket", uri, lambda: _client().head_bucket(Bucket=bucket))
    except FileNotFoundError:
        raise FileNotFoundError(f"{uri}: bucket '{bucket}' does not exist") from None


def head(uri: str) -> dict | None:
    """Object metadata, or None when there is no object at exactly this key."""
    bucket, key = split_s3(uri)
    if not key or key.endswith("/"):
        return None
    with contextlib.suppress(FileNotFoundError):
        return _call("stat", uri, lambda: _client().head_object(Bucket=bucket, Key=key))
    return None


def _list(bucket: str, prefix: str, delimiter: str = "") -> list[dict]:
    """All list_objects_v2 pages (prefixes can hold more than 1000 objects)."""
    kw = dict(Bucket=bucket, Prefix=prefix, **({"Delimiter": delimiter} if delimiter else {}))
    return _call(
        "list", f"s3://{bucket}/{prefix}", lambda: list(_client().get_paginator("list_objects_v2").paginate(**kw))
    )


def objects(uri: str, required: bool = False) -> dict[str, dict]:
    """Relative path -> listing entry for every object under the prefix ``uri``/."""
    bucket, key = split_s3(uri)
    prefix = _prefix(key)
    objs = {
        o["Key"][len(prefix) :]: o
        for page in _list(bucket, prefix)
        for o in page.get("Contents", [])
        if not o["Key"].endswith("/")
    }
    if required and not objs:
        raise FileNotFoundError(f"{uri}: no object or prefix with this name")
    return objs


def fingerprint_entries(uri: str) -> list:
    """(relative path, size, ETag) of the object or of every object under the prefix."""
    found = head(uri)
    if found:
        return [("", found["ContentLength"], found["ETag"])]
    return sorted((rel, o["Size"], o["ETag"]) for rel, o in objects(uri).items())


def cache_state(uri: str, kind: str) -> dict:
    """What identifies the content for :func:`trainer_lib.storage.localize`'s cache: one object's
    ETag/size/sha256, or every object's ETag and size under the prefix (``objects``)."""
    found = head(uri) if kind != "dir" else None
    if found is None and kind == "file":
        raise FileNotFoundError(f"{uri}: not found")
    if found is not None:
        return {
            "kind": "file",
            "etag": found["ETag"],
            "size": found["ContentLength"],
            "sha256": found.get("Metadata", {}).get(SHA_KEY),
        }
    objs = objects(uri, required=True)
    return {"kind": "dir", "objects": {r: [o["ETag"], o["Size"]] for r, o in sorted(objs.items())}}


def exists(uri: str) -> bool:
    return head(uri) is not None or isdir(uri)


def isdir(uri: str) -> bool:
    bucket, key = split_s3(uri)
    with contextlib.suppress(FileNotFoundError):
        return any(p.get("KeyCount", 0) for p in _list(bucket, _prefix(key))) or not key.strip("/")
    return False


def listdir(uri: str) -> list[str]:
    bucket, key = split_s3(uri)
    prefix, names = _prefix(key), set()
    for page in _list(bucket, prefix, delimiter="/"):
        names |= {p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])}
        names |= {o["Key"][len(prefix) :] for o in page.get("Contents", [])}
    names.discard("")
    if not names and prefix:
        raise FileNotFoundError(f"{uri}: no such prefix")
    return sorted(names)


def list_files(uri: str) -> list[str]:
    return sorted(objects(uri))


def read_bytes(uri: str) -> bytes:
    bucket, key = split_s3(uri)

    def get():
        resp = _client().get_object(Bucket=bucket, Key=key)
        return resp, resp["Body"].read()

    resp, data = _call("read", uri, get)
    verify(uri, resp.get("Metadata", {}).get(SHA_KEY), hashlib.sha256(data).hexdigest())
    return data


def write_bytes(uri: str, data: bytes) -> None:
    bucket, key = split_s3(uri)
    extra = {"Metadata": {SHA_KEY: hashlib.sha256(data).hexdigest()}, "ChecksumAlgorithm": "SHA256"}
    _call(
        "write",
        uri,
        lambda: _client().upload_fileobj(io.BytesIO(data), bucket, key, ExtraArgs=extra, Config=_transfer_config()),
    )


def upload_file(src: str, uri: str) -> None:
    """Upload the local file ``src`` (already checked to exist)."""
    bucket, key = split_s3(uri)
    extra = {"Metadata": {SHA_KEY: sha256_file(src)}, "ChecksumAlgorithm": "SHA256"}
    _call("upload", uri, lambda: _client().upload_file(src, bucket, key, ExtraArgs=extra, Config=_transfer_config()))


def download_file(uri: str, local_path: str) -> None:
    bucket, key = split_s3(uri)
    found = head(uri)
    if found is None:
        raise FileNotFoundError(f"{uri}: not found")
    with atomic_path(local_path) as tmp:
        _call("download", uri, lambda: _client().download_file(bucket, key, tmp, Config=_transfer_config()))
        verify(uri, found.get("Metadata", {}).get(SHA_KEY), sha256_file(tmp))


def copy_object(src: str, dest: str) -> None:
    """Server-side copy of one object; its metadata (our sha256) is copied along."""
    bucket, key = split_s3(src)
    dest_bucket, dest_key = split_s3(dest)
    _call(
        "copy",
        dest,
        lambda: _client().copy({"Bucket": bucket, "Key": key}, dest_bucket, dest_key, Config=_transfer_config()),
    )


def delete(uri: str, missing_ok: bool = True) -> None:
    """Remove an object or a whole prefix (``s3://b/run1`` never touches ``run10/``)."""
    bucket, key = split_s3(uri)
    if not key.strip("/"):
        raise ValueError(f"{uri}: refusing to delete a whole bucket")
    keys = ([key] if head(uri) else []) + [_prefix(key) + rel for rel in objects(uri)]
    if not keys and not missing_ok:
        raise FileNotFoundError(f"{uri}: not found")
    for i in range(0, len(keys), 1000):
        batch = {"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True}
        errors = _call("delete", uri, lambda batch=batch: _client().delete_objects(Bucket=bucket, Delete=batch)).get(
            "Errors"
        )
        if errors:
            raise StorageError(
                f"{uri}: could not delete {len(errors)} objects, e.g. {errors[0].get('Key')}: {errors[0].get('Code')}"
            )
