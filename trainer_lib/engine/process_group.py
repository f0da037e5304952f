"""The process around a rank: what a launcher puts in its environment, and how a worker leaves.

A rank is started by torchrun (``--nproc``), by a training operator (a TrainJob's nodes) or as one plain
process; :func:`launched` tells them apart, and :func:`own_group_env` gives a child process the environment
of a group of its own. :func:`leave_process_group` and :func:`exit_worker` end a finished worker without the
aborts that C++ destructors cause. Nothing here imports torch at module top.
"""

from __future__ import annotations

import os
import socket
import sys


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: What torchrun, a training operator or a one-process run here (:meth:`DeepSpeedStrategy.setup_distributed`)
#: puts in the environment, besides ``TORCHELASTIC_*``.
LAUNCHER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "POSTTRAIN_SOLO_PID",
)


def own_group_env(env=None) -> dict[str, str]:
    """``env`` (default: this process's) for a child that starts a process group of its own: without
    :data:`LAUNCHER_ENV` and ``TORCHELASTIC_*``. Another trainer (TRL's, through accelerate) would otherwise
    join the parent's group address, whose port the parent holds."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in LAUNCHER_ENV and not k.startswith("TORCHELASTIC_")}


def planned_world_size() -> int:
    """Processes in the job, known before the process group is set up (1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1")) if launched() else 1


def leave_process_group() -> None:
    """Destroy this worker's process group before it exits. A rank that exits with its group alive can
    abort in the C++ destructors ("terminate called without an active exception", SIGABRT): CI saw it
    on an evaluate rank that finished generating while rank 0 went on scoring."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_worker(code: int) -> None:
    """End a finished torchrun worker: Python's exit handlers run and its streams are flushed, but C++
    static destructors do not. DeepSpeed's CPU shared-memory comm op can abort in them ("terminate called
    without an active exception", SIGABRT) on a rank that exits while another still works, even after
    :func:`leave_process_group` (seen on 1 in 3 two-rank ZeRO-3 evaluations, 2026-12-02)."""
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launched() -> bool:
    """Started by torchrun or a training operator (which set RANK), or already set up here.

    A child of a one-process run (e.g. a kfp.local task started from it) inherits RANK and
    MASTER_PORT but must not join its parent's group: POSTTRAIN_SOLO_PID tells them apart.
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    solo = os.environ.get("POSTTRAIN_SOLO_PID")
    if solo is not None:
        return solo == str(os.getpid())
    return "RANK" in os.environ
