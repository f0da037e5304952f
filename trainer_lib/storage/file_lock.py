"""Exclusive file locks between processes on one machine that never wait in silence.

A process that waits for a lock another one holds says so after :data:`SAY_AFTER_S` seconds, naming
the lock file and its holder (pid, host and what it is doing, written into the lock file by the
holder), and gives up with one error line after ``$POSTTRAIN_LOCK_WAIT_S`` seconds (default an hour:
tokenizing or downloading a large corpus takes long). ``flock`` locks are released by the kernel when
their holder dies, so a killed process never leaves a lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl  # POSIX only, like the training images
import logging
import os
import socket
import time

from trainer_lib.errors import UserError

log = logging.getLogger(__name__)

SAY_AFTER_S = 5.0
LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT_S = "POSTTRAIN_LOCK_WAIT_S", 3600.0


def lock_wait_s() -> float:
    """Seconds a wait on another process's lock lasts before it gives up (``$POSTTRAIN_LOCK_WAIT_S``)."""
    from trainer_lib.values import env_seconds

    return env_seconds(LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT_S)


def holder(path: str) -> str:
    """Who holds the lock at ``path``, as its holder wrote it there (``pid N on HOST, WHAT``)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()[:300] or "another process"
    except OSError:
        return "another process"


@contextlib.contextmanager
def exclusive(path: str, what: str, label: str):
    """Hold the lock at ``path`` while ``what`` is done (``label`` starts the messages, e.g. ``data cache``)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a+") as fh:
        _acquire(fh, path, label)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {socket.gethostname()}, {what}\n")
            fh.flush()
            yield
        finally:
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)


def _acquire(fh, path: str, label: str) -> None:
    """flock ``fh`` exclusively; after SAY_AFTER_S one line says who holds it, after lock_wait_s() a UserError."""
    bound, start, said = lock_wait_s(), time.monotonic(), False
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - start
        if waited >= bound:
            raise UserError(
                f"{label}: gave up after {waited:.0f} s waiting for the lock {path}, held by {holder(path)}; "
                f"let that process finish or stop it, or wait longer with ${LOCK_WAIT_ENV}"
            )
        if not said and waited >= min(SAY_AFTER_S, bound / 2):
            log.warning(
                "%s: waiting for the lock %s, held by %s (giving up after %g s, $%s)",
                label,
                path,
                holder(path),
                bound,
                LOCK_WAIT_ENV,
            )
            said = True
        time.sleep(0.1)


def is_held(path: str) -> bool:
    """Whether another process holds the lock at ``path`` now."""
    try:
        with open(path, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        pass
    return False
