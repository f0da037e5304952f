"""Waiting on the other ranks: how long a collective waits, what a rank says while it waits, and the one
line a rank prints when a collective broke because another rank is gone.

On one node torchrun stops every rank as soon as one dies (:mod:`trainer_lib.engine.launch`); a rank on
another node notices at its next collective, which fails at once when the peer's connection resets, or
after the process group's timeout when the peer's machine is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

#: Seconds a collective (all-reduce, barrier) waits for the other ranks before it fails. A rank on another
#: node that died is noticed here (on this node torchrun stops the job at once, trainer_lib.engine.launch);
#: saving a large checkpoint to an object store keeps the others waiting at a barrier, so it is generous.
COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S = "POSTTRAIN_COLLECTIVE_TIMEOUT_S", 600.0


def collective_timeout():
    """The process group's timeout: ``$POSTTRAIN_COLLECTIVE_TIMEOUT_S`` seconds, default 600 (10 minutes)."""
    import datetime

    from trainer_lib.values import env_seconds

    return datetime.timedelta(seconds=env_seconds(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S))


def say_after() -> float:
    """Seconds after which a wait on the other ranks says what it waits for: 10, or an eighth of the
    collective timeout when that is shorter."""
    return min(10.0, collective_timeout().total_seconds() / 8)


def say(line: str) -> None:
    """Print ``line`` on stderr in one write: the ranks of a job share one log, and a line printed in two
    writes (text, then newline; as ``print`` does when stderr is unbuffered) merges with another rank's."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def said_if_slow(what: str):
    """Run the body; if it takes longer than :func:`say_after`, one line on stderr says that this rank is
    still ``what`` and when the wait gives up (no silent waits on the other ranks)."""
    limit = collective_timeout().total_seconds()
    rank = os.environ.get("RANK", "0")
    line = f"rank {rank}: still {what} (a collective gives up after {limit:g} s, ${COLLECTIVE_TIMEOUT_ENV})"
    timer = threading.Timer(say_after(), say, args=(line,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


#: A worker's exit status when a collective failed because another rank is gone (sysexits' EX_UNAVAILABLE):
#: the launcher then names the other rank as the cause (trainer_lib.engine.launch).
LOST_PEER_EXIT = 69


def lost_peer_line(exc: BaseException) -> str | None:
    """One line for a collective that failed because another rank is gone (its connection reset, or no
    answer within :func:`collective_timeout`), None for any other error (a bug keeps its traceback)."""
    import torch.distributed as dist

    text = " ".join(str(exc).split())
    if not (isinstance(exc, dist.DistError) or re.search(r"gloo|NCCL|c10d", text)):
        return None
    reason = re.sub(r"^\[[^\]]*\] ", "", text).split(". This is typically")[0][:200]
    return (
        f"rank {os.environ.get('RANK', '0')}: a collective with the other ranks failed ({reason}); another rank "
        f"has died (its own log says why) or did not answer within {collective_timeout().total_seconds():g} s "
        f"(${COLLECTIVE_TIMEOUT_ENV})"
    )
