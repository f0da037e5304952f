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


def poll_until(attempt, bound: float, waiting, gave_up, interval: float = 0.2):
    """``attempt()`` until it returns something true, which is returned: ``waiting()`` is called once after
    :data:`SAY_AFTER_S` (or half of ``bound``, if less), and ``gave_up(seconds waited)``, an exception, is
    raised after ``bound`` seconds. The one wait loop of the locks and caches that never wait in silence."""
    start, said = time.monotonic(), False
    while True:
        got = attempt()
        if got:
            return got
        waited = time.monotonic() - start
        if waited >= bound:
            raise gave_up(waited)
        if not said and waited >= min(SAY_AFTER_S, bound / 2):
            waiting()
            said = True
        time.sleep(interval)


def _acquire(fh, path: str, label: str) -> None:
    """flock ``fh`` exclusively; after SAY_AFTER_S one line says who holds it, after lock_wait_s() a UserError."""
    bound = lock_wait_s()

    def waiting() -> None:
        log.warning(
            "%s: waiting for the lock %s, held by %s (giving up after %g s, $%s)",
            label,
            path,
            holder(path),
            bound,
            LOCK_WAIT_ENV,
        )

    def gave_up(waited: float) -> UserError:
        return UserError(
            f"{label}: gave up after {waited:.0f} s waiting for the lock {path}, held by {holder(path)}; "
            f"let that process finish or stop it, or wait longer with ${LOCK_WAIT_ENV}"
        )

    poll_until(lambda: try_lock(fh), bound, waiting, gave_up, interval=0.1)


def try_lock(fh) -> bool:
    """Whether a non-blocking exclusive flock of the open file ``fh`` was taken."""
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


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
