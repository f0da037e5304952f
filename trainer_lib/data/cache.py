"""Build once, reuse by fingerprint: data sets cached as memory-mapped Arrow under ``<cache root>/data``.

An entry is a directory ``<kind>-<key>``, the key a sha256 of everything its content depends on (the
data's content fingerprint, the tokenizer, ``data.max_length``, the source code of the function that
made it, ...), so a rerun, a resumed run or a ``prepare`` into another output dir finds it again and
any change misses it. An entry is built in a temp dir next to it and renamed into place once complete
(``manifest.json`` written last), so a build killed half way never leaves a half entry under the final
name; the next build of that key removes such left-overs.

Within a job only the local main process (``LOCAL_RANK`` 0) builds an entry, holding a file lock (two
jobs on one machine never build the same entry twice); the other local ranks wait until it appears and
memory-map it. The cache root is ``POSTTRAIN_CACHE`` (default ``~/.cache/posttrain``); clear it with
``rm -rf <cache root>/data``.

No silent waits: a process that waits for the lock (or for local rank 0's build) says so after
:data:`trainer_lib.storage.file_lock.SAY_AFTER_S` seconds, naming the lock file and the process
that holds it (its pid, host and entry, written into the lock file), and gives up with one error
line after ``$POSTTRAIN_LOCK_WAIT_S`` seconds (default an hour: a large corpus takes long to
tokenize). The kernel releases a lock when its holder dies, so a wait is always on a live process.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from trainer_lib.errors import UserError
from trainer_lib.storage import file_lock

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
#: how long a waiting rank tolerates that nobody builds an entry it waits for (seconds).
WAIT_WITHOUT_BUILDER_S = 900.0


def digest(value) -> str:
    """sha256 of a JSON-able value (keys sorted)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def code_version(*modules: str) -> str:
    """sha256 of the source files of ``modules`` (dotted names): any edit to them makes new keys."""
    h = hashlib.sha256()
    for name in modules:
        __import__(name)
        with open(sys.modules[name].__file__, "rb") as fh:
            h.update(name.encode() + b"\0" + fh.read())
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """What makes a tokenizer split text the way it does: its full serialized state (vocab, merges,
    normalizer, pre-tokenizer, added tokens) for a fast tokenizer, else its vocab; plus the chat
    template and the special tokens."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)  # set by each call's truncation/padding arguments, not the tokenizer's
        state.pop("padding", None)
        h.update(json.dumps(state, sort_keys=True).encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    extra = {
        "chat_template": getattr(tokenizer, "chat_template", None),
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "padding_side": getattr(tokenizer, "padding_side", None),
        "add_bos": getattr(tokenizer, "add_bos_token", None),
        "add_eos": getattr(tokenizer, "add_eos_token", None),
    }
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()


def source_fingerprint(path: str | None) -> str | None:
    """What identifies the content behind ``path``: sha256 of its files' bytes for a local path, the
    storage fingerprint (sizes, ETags) for a URL; None for a hub id (not known without asking the hub)."""
    from trainer_lib import storage

    if not path:
        return ""
    if storage.is_remote(path):
        return storage.fingerprint(path)
    local = os.path.expanduser(path)
    if not os.path.exists(local):
        return None
    files = (
        [local]
        if os.path.isfile(local)
        else sorted(os.path.join(d, f) for d, dirs, names in os.walk(local) for f in names)
    )
    h = hashlib.sha256()
    for name in files:
        h.update(os.path.relpath(name, local).encode() + b"\0")
        with open(name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def data_cache_dir() -> str:
    from trainer_lib.storage import cache_root

    return os.path.join(cache_root(), "data")


def entry_path(kind: str, parts: dict) -> str:
    return os.path.join(data_cache_dir(), f"{kind}-{digest(parts)[:32]}")


def is_complete(entry: str) -> bool:
    return os.path.isfile(os.path.join(entry, MANIFEST))


def read_manifest(entry: str) -> dict:
    with open(os.path.join(entry, MANIFEST), encoding="utf-8") as fh:
        return json.load(fh)


@contextlib.contextmanager
def quiet():
    """No datasets progress bars while a cache entry is built (we log one line per entry instead)."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _remove_leftovers(entry: str) -> None:
    """Temp dirs of killed builds of this entry, and an entry without its manifest (not ours: ours are
    renamed complete), so they are never mistaken for a complete entry."""
    parent, name = os.path.split(entry)
    for other in os.listdir(parent):
        if other.startswith(f".{name}.tmp-"):
            shutil.rmtree(os.path.join(parent, other), ignore_errors=True)
    if os.path.isdir(entry) and not is_complete(entry):
        log.warning("data cache: %s is incomplete (no %s); rebuilding it", entry, MANIFEST)
        shutil.rmtree(entry, ignore_errors=True)


def cached(kind: str, parts: dict, build: Callable[[str], dict], what: str = "data") -> tuple[str, dict]:
    """``(entry dir, manifest)`` of the complete entry for ``parts``; missing, the local main process
    builds it with ``build(tmp_dir)`` (which writes its files there and returns the manifest's extra
    fields) while the other local ranks wait for it."""
    entry = entry_path(kind, parts)
    if is_complete(entry):
        log.info("data cache: reusing %s for %s", entry, what)
        return entry, read_manifest(entry)
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    lock = entry + ".lock"
    if local_rank() != 0:
        _wait_for(entry, lock, what)
        return entry, read_manifest(entry)
    with file_lock.exclusive(lock, f"building {what}", "data cache"):
        if is_complete(entry):  # another job on this machine built it while we waited for the lock
            log.info("data cache: reusing %s for %s", entry, what)
            return entry, read_manifest(entry)
        _remove_leftovers(entry)
        start = time.monotonic()
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(entry)}.tmp-", dir=os.path.dirname(entry))
        try:
            with quiet():
                manifest = {**(build(tmp) or {}), "kind": kind, "parts": parts}
            with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
                json.dump(manifest, fh, indent=1, sort_keys=True, default=str)
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, entry)
            except OSError:
                if not is_complete(entry):  # else another node built it meanwhile (a shared cache dir)
                    raise
                manifest = read_manifest(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("data cache: built %s for %s in %.1fs", entry, what, time.monotonic() - start)
    return entry, manifest


def build_once(kind: str, parts: dict | None, build: Callable[[str], dict], what: str = "data") -> tuple[str, dict]:
    """:func:`cached`, or with ``parts`` None (content not identifiable, e.g. a hub dataset without a known
    revision) a private scratch dir of this process, removed when it exits."""
    if parts is not None:
        return cached(kind, parts, build, what)
    scratch = os.path.join(data_cache_dir(), "scratch")
    os.makedirs(scratch, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}-", dir=scratch)
    atexit.register(shutil.rmtree, tmp, True)
    with quiet():
        return tmp, {**(build(tmp) or {}), "kind": kind}


def _wait_for(entry: str, lock: str, what: str) -> None:
    """Poll until ``entry`` is complete; fail if nobody holds its lock for WAIT_WITHOUT_BUILDER_S (the
    main process died, or it runs on another node without a shared cache dir), or after lock_wait_s()."""
    log.info("data cache: local rank %d waits for local rank 0 to build %s (%s)", local_rank(), what, entry)
    bound = file_lock.lock_wait_s()
    idle_since = time.monotonic()

    def built() -> bool:
        nonlocal idle_since
        if is_complete(entry):
            return True
        now = time.monotonic()
        if file_lock.is_held(lock):
            idle_since = now
        elif now - idle_since > min(WAIT_WITHOUT_BUILDER_S, bound):
            raise UserError(
                f"data: local rank {local_rank()} waited {now - idle_since:.0f}s for local rank 0 "
                f"to build the data cache {entry}, and nobody is building it"
            )
        return False

    def waiting() -> None:
        log.warning("data cache: still waiting for %s to finish %s (lock %s)", file_lock.holder(lock), entry, lock)

    def gave_up(waited: float) -> UserError:
        return UserError(
            f"data: local rank {local_rank()} gave up after {waited:.0f} s waiting for "
            f"{file_lock.holder(lock)} to finish the data cache {entry} (lock {lock}); "
            f"wait longer with ${file_lock.LOCK_WAIT_ENV}"
        )

    file_lock.poll_until(built, bound, waiting, gave_up)


# --------------------------------------------------------------------------- Arrow files of an entry


def load_arrow(entry: str, manifest: dict, name: str):
    """The ``datasets.Dataset`` of the Arrow files listed under ``name`` in the manifest, memory-mapped."""
    import datasets

    files = manifest[name]["files"]
    if not files:
        features = datasets.Features.from_dict(manifest[name]["features"])
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    parts = [datasets.Dataset.from_file(os.path.join(entry, f)) for f in files]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
