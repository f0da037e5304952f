"""``--nproc N``: start N local worker processes with torchrun (``torch.distributed.run``).

On a multi-node Kubeflow job, torchrun also reads ``PET_NNODES``, ``PET_NODE_RANK`` and
``PET_MASTER_ADDR``/``PET_MASTER_PORT`` from the environment, which the Kubeflow Trainer sets.
"""

from __future__ import annotations

import os
import subprocess
import sys

from trainer_lib.engine.strategy import free_port


def launch_workers(nproc: int, worker_args: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``python <worker_args>`` in ``nproc`` processes (``env`` added to their environment);
    returns the launcher's exit code."""
    env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    if "PET_NNODES" not in env:  # single node: a private rendezvous on loopback
        cmd += ["--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.run([*cmd, *worker_args], env=env)
    return proc.returncode
