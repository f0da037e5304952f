"""Images in dataset rows: the ``images`` column, checked when rows are read, decoded only when used.

A row of any format may carry an ``images`` column: a list (a single value is taken as a list of one,
a string holding a JSON list, as a CSV cell does, as that list) whose items are

* a local path; a relative one resolves against the folder of the dataset file the row came from (as
  LLaMA-Factory resolves it against ``dataset_dir``), then against the current directory;
* a storage URL (``s3://``, ``gs://``, ...), read through :mod:`trainer_lib.storage`;
* a hub dataset's image feature: a dict with ``bytes`` and/or ``path``, as ``datasets`` stores it,
  or the decoded ``PIL.Image`` that ``datasets`` hands out for it.

Every image is read, hashed and decoded once when its row is normalized; a file that is missing,
unreadable, not an image, or larger than :data:`MAX_SIDE` pixels a side is a :class:`DataError`
naming ``FILE:ROW`` and the field (``images[1]``). The normalized row keeps references, not pixels:
each item becomes ``{"bytes", "path", "sha256"}`` (``bytes`` only for images that have no file of
their own; ``path`` absolute or a URL; ``sha256`` of the encoded file, which :func:`load_image`
checks again and caches may key on).

``<image>`` placeholders (:data:`PLACEHOLDER`) in the row's text say where each image goes, as in
LLaMA-Factory's ``mllm_demo``: when the text has any, their count must equal the number of images.
A row with images and no placeholder leaves the placement to the model's processor. Rows without an
``images`` column are not looked at.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from trainer_lib.errors import DataError, UserError

#: the column that holds a row's images.
IMAGES = "images"
#: where an image goes in the text (LLaMA-Factory's and LLaVA's marker).
PLACEHOLDER = "<image>"
#: the largest width or height accepted, in pixels (far above what vision encoders take in; they resize).
MAX_SIDE = 8192

_POSITION = re.compile(r":(\d+|row \d+)$")  # FILE:LINE or SOURCE:row N, as data.sources writes locations
_SPLIT = re.compile(r"\[[^\]/]*\]$")  # SOURCE[split]
_IN_MEMORY = re.compile(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>")  # PIL names the buffer, not the file


def content_hash(data: bytes) -> str:
    """sha256 (hex) of an image's encoded bytes: what caches of image-derived data key on."""
    return hashlib.sha256(data).hexdigest()


def row_folder(location: str) -> str:
    """The folder relative image paths of the row at ``location`` (``FILE:LINE``, ``DIR:row N``,
    ``DIR[split]:row N``) resolve against: the file's folder, a dataset directory itself, or a URL's
    parent prefix."""
    from trainer_lib import storage

    source = _SPLIT.sub("", _POSITION.sub("", location))
    if storage.is_remote(source):
        return source.rsplit("/", 1)[0]
    source = os.path.expanduser(source)
    return source if os.path.isdir(source) else os.path.dirname(source)


def count_placeholders(row: Mapping[str, Any], fields: tuple[str, ...]) -> int:
    """``<image>`` markers in the text fields of a normalized row (strings or conversations)."""
    total = 0
    for name in fields:
        value = row.get(name)
        if isinstance(value, str):
            total += value.count(PLACEHOLDER)
        elif isinstance(value, list):
            total += sum(m.get("content", "").count(PLACEHOLDER) for m in value if isinstance(m, Mapping))
    return total


def normalize_images(row: Mapping[str, Any], fields: tuple[str, ...], location: str) -> list[dict]:
    """The row's ``images`` as checked references (see the module doc); ``fields`` are the text columns
    of its format, whose ``<image>`` markers must match the images when there are any."""
    value = row.get(IMAGES)
    if isinstance(value, str) and value.startswith("["):  # a CSV cell holding a JSON list of paths
        try:
            value = json.loads(value)
        except ValueError:
            pass
    items = [] if value is None else value if isinstance(value, (list, tuple)) else [value]
    refs = [_reference(item, f"{IMAGES}[{i}]", location) for i, item in enumerate(items)]
    marks = count_placeholders(row, fields)
    if marks and marks != len(refs):
        text = ", ".join(f for f in fields if f != "label")
        raise DataError(
            location, IMAGES, f"{marks} images, one per {PLACEHOLDER} placeholder in the text ({text})", value
        )
    return refs


def _reference(item: Any, field: str, location: str) -> dict:
    """One image item -> ``{"bytes", "path", "sha256"}``, read and decoded once to check it."""
    if _nonempty(item):
        path = _resolve(item, location)
        data = _read(path, field, location, item)
        ref = {"bytes": None, "path": path}
    elif isinstance(item, Mapping) and (isinstance(item.get("bytes"), bytes) or _nonempty(item.get("path"))):
        data = item.get("bytes")
        path = item.get("path") or None
        if data is None:
            path = _resolve(path, location)
            data = _read(path, field, location, item)
        ref = {"bytes": item.get("bytes"), "path": path}
    elif hasattr(item, "save") and hasattr(item, "size"):  # a PIL image, as datasets decodes an Image feature
        buffer = io.BytesIO()
        item.save(buffer, format=getattr(item, "format", None) or "PNG")
        data = buffer.getvalue()
        ref = {"bytes": data, "path": None}
    else:
        expected = 'an image: a path, a storage URL, or {"bytes": ..., "path": ...} as datasets stores one'
        raise DataError(location, field, expected, item)
    _check_decodes(data, field, location, item)
    return {**ref, "sha256": content_hash(data)}


def _nonempty(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _resolve(path: str, location: str) -> str:
    """A relative local path against the row's folder, else (LLaMA-Factory's fallback) as given."""
    from trainer_lib import storage

    if storage.is_remote(path) or os.path.isabs(os.path.expanduser(path)):
        return path if storage.is_remote(path) else os.path.expanduser(path)
    folder = row_folder(location)
    if storage.is_remote(folder):
        return storage.join(folder, path)
    beside = os.path.abspath(os.path.join(folder, path))
    if os.path.exists(beside) or not os.path.exists(path):
        return beside
    return os.path.abspath(path)


def _read(path: str, field: str, location: str, given: Any) -> bytes:
    from trainer_lib import storage

    try:
        return storage.read_bytes(path)
    except FileNotFoundError:
        raise DataError(location, field, f"an image file that exists (looked for {path})", given) from None
    except IsADirectoryError:
        raise DataError(location, field, f"an image file, not a directory ({path})", given) from None
    except (OSError, ValueError, storage.StorageError) as exc:
        raise DataError(location, field, f"a readable image file ({path}: {exc})", given) from None


def _check_decodes(data: bytes, field: str, location: str, given: Any) -> None:
    """Decode the whole image (a truncated file fails here, not in training) and check its size."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked below
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if max(width, height) > MAX_SIDE:
                    raise DataError(
                        location,
                        field,
                        f"an image of at most {MAX_SIDE} pixels a side (this one is {width}x{height})",
                        given,
                    )
                image.load()
    except DataError:
        raise
    except Image.DecompressionBombError:
        raise DataError(location, field, f"an image of at most {MAX_SIDE} pixels a side", given) from None
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError... for bad data
        reason = " ".join(_IN_MEMORY.sub("", str(exc)).split())[:120] or type(exc).__name__
        raise DataError(location, field, f"an image that decodes (PIL: {reason})", given) from None


# --------------------------------------------------------------------------- loading, lazily


def image_bytes(ref: Mapping[str, Any]) -> bytes:
    """The encoded image of a normalized reference: its bytes, or its file read now."""
    from trainer_lib import storage

    if ref.get("bytes") is not None:
        return ref["bytes"]
    try:
        return storage.read_bytes(ref["path"])
    except (OSError, ValueError, storage.StorageError) as exc:
        raise UserError(f"image {ref['path']}: could not be read ({exc})") from None


def load_image(ref: Mapping[str, Any]):
    """A normalized reference as an RGB ``PIL.Image``; a file that changed since its row was read
    (another sha256) is a :class:`UserError`: the normalized rows are cached by the dataset file's
    content, which an image beside it is not part of, so the message says which cache to clear."""
    from PIL import Image

    data = image_bytes(ref)
    if ref.get("sha256") and content_hash(data) != ref["sha256"]:
        from trainer_lib.data.cache import data_cache_dir

        raise UserError(
            f"image {ref.get('path') or '(embedded bytes)'}: changed since its dataset was read (sha256 "
            f"{content_hash(data)[:12]}..., expected {ref['sha256'][:12]}...); delete posttrain's data cache "
            f"({data_cache_dir()}) or prepare the data again with the images as they are now"
        )
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")
