"""``--nproc N``: start N local worker processes with torchrun (``torch.distributed.run``).

On a multi-node Kubeflow job, torchrun also reads ``PET_NNODES``, ``PET_NODE_RANK`` and
``PET_MASTER_ADDR``/``PET_MASTER_PORT`` from the environment, which the Kubeflow Trainer sets.

A rank that dies (killed, out of memory, an error) ends the job: torchrun notices within a fraction
of a second, stops the other ranks on this node and exits; this module runs torchrun (as
``python -m trainer_lib.engine.launch``) so that the end is one line naming the rank and how it died
instead of torchrun's traceback. Ranks on other nodes stop at their next collective, after the
process group's timeout (:func:`trainer_lib.engine.collectives.collective_timeout`). The same command
run again resumes from the last complete checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from trainer_lib.engine.collectives import LOST_PEER_EXIT
from trainer_lib.engine.preemption import PREEMPTED_EXIT, passing_sigterm_to
from trainer_lib.engine.process_group import free_port


def launch_workers(nproc: int, worker_args: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``python <worker_args>`` in ``nproc`` processes (``env`` added to their environment);
    returns the launcher's exit code."""
    env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-m", "trainer_lib.engine.launch", f"--nproc_per_node={nproc}"]
    if "PET_NNODES" not in env:  # single node: a private rendezvous on loopback
        cmd += ["--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.Popen([*cmd, *worker_args], env=env)
    # a pod's SIGTERM reaches this process alone: pass it on, so torchrun asks every rank to stop (each
    # saves a checkpoint first, trainer_lib.engine.preemption) instead of the ranks being killed with the pod
    with passing_sigterm_to(proc):
        return proc.wait()


def failure_line(failures: dict) -> tuple[str, int]:
    """The one line that says which rank ended the job and how, and the exit code to return.

    ``failures`` maps global rank -> torchrun's ``ProcessFailure``. The ranks torchrun stopped afterwards
    (SIGTERM) and those whose collective failed because a peer was gone (LOST_PEER_EXIT) are not the
    cause: a rank killed by another signal comes first, then one that failed of its own accord."""

    def blame(item) -> tuple[int, int]:
        code = item[1].exitcode
        if code in (-signal.SIGTERM, LOST_PEER_EXIT):
            return 2, item[0]
        return (0 if code < 0 else 1), item[0]

    rank, failure = min(failures.items(), key=blame)
    others = sorted(set(failures) - {rank})
    stopped = f"; the other rank(s) {', '.join(map(str, others))} were stopped" if others else ""
    if failure.exitcode > 0:  # its own error is printed above; its status (a user error's 2, ...) is kept
        return f"rank {rank} (pid {failure.pid}) exited with status {failure.exitcode}{stopped}", failure.exitcode
    line = (
        f"rank {rank} (pid {failure.pid}) was killed by {failure.signal_name()}{stopped}; the job ended. "
        f"Run the same command again to resume from the last complete checkpoint."
    )
    return line, 1


def torchrun(argv: list[str]) -> int:
    """``torch.distributed.run`` with a one-line message instead of a traceback when a rank fails."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        line, code = failure_line(exc.failures)
        print(f"error: {line}", file=sys.stderr, flush=True)
        return code
    except SignalException as exc:  # the launcher was stopped; torchrun passed the signal on to every rank
        if exc.sigval == signal.SIGTERM:  # preempted: retryable, the retry resumes from the last checkpoint
            line = f"the launcher got SIGTERM and passed it on to every rank; exit {PREEMPTED_EXIT} (retryable)"
            print(f"preempted: {line}", file=sys.stderr, flush=True)
            return PREEMPTED_EXIT
        print(f"error: the launcher got {exc.sigval.name}; every rank was stopped", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(torchrun(sys.argv[1:]))
