"""Run a built stage config where the caller says: in this process, in N local processes, or on N nodes.

    cfg = stage_config("sft", layers, config_yaml)
    summary = dispatch("sft", cfg, Where(processes=8, checkpoint_root="s3://bucket/root"))

The config is built once, by the caller, and handed over once. In this process it runs as it is. To N
local processes it goes as its YAML text (:func:`~trainer_lib.runner.stage_api.config_text`) in one
local file, which each worker reads (``posttrain <stage> --config FILE`` under torchrun,
:mod:`trainer_lib.engine.launch`); ``posttrain <stage> --nproc N`` hands its config over the same way.
To N nodes it goes as the same text in one argument of a Kubeflow Trainer ``TrainJob``
(:mod:`trainer_lib.runner.trainjob`), whose nodes start N processes each as above.

With a ``checkpoint_root`` (a pipeline root), resumable checkpoints go under it at a location that a
retried pod of the same task finds again (:func:`trainer_lib.engine.checkpoint.stable_checkpoint_dir`),
unless the config names its own ``checkpoint_dir``. The location is computed here, once; on nodes the
TrainJob's name and output prefix follow from it, so a retried launcher re-attaches to its job.

Preemption: workers stopped by SIGTERM after their checkpoint exit 75
(:data:`~trainer_lib.engine.preemption.PREEMPTED_EXIT`), and :func:`dispatch` raises
:class:`~trainer_lib.engine.preemption.Preempted`; a SIGTERM to this process is passed on to them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile

from trainer_lib import storage
from trainer_lib.engine.checkpoint import SUMMARY, stable_checkpoint_dir
from trainer_lib.engine.preemption import PREEMPTED_EXIT, Preempted
from trainer_lib.errors import UserError
from trainer_lib.runner.stage_api import config_text, run_config
from trainer_lib.runner.trainjob import NodeResources

#: What rank 0 leaves in ``output_dir`` for the caller, by stage: evaluate's metrics, else the summary.
RESULT_FILES = {"evaluate": "metrics.json"}


@dataclasses.dataclass(frozen=True)
class Where:
    """Where a stage runs: ``processes`` per node (one per accelerator) on ``nodes`` nodes.

    ``checkpoint_root``: resumable checkpoints go under it, at a location a retry finds again ("" leaves
    the config's). ``image`` and ``node``: the container image of a TrainJob's nodes and what each holds
    (a :class:`~trainer_lib.runner.trainjob.NodeResources`); used when ``nodes`` > 1.
    """

    processes: int = 1
    nodes: int = 1
    checkpoint_root: str = ""
    image: str = ""
    node: NodeResources | None = None


def dispatch(stage: str, cfg, where: Where = Where()) -> dict:
    """Run the built config ``cfg`` of ``stage`` where ``where`` says; returns the stage's summary (what rank
    0 wrote, for N processes or nodes). Raises Preempted when SIGTERM stopped it after its checkpoint."""
    location = ""
    if where.checkpoint_root or where.nodes > 1:
        location = stable_checkpoint_dir(cfg, where.checkpoint_root, stage)
        if not cfg.checkpoint_dir:
            cfg = dataclasses.replace(cfg, checkpoint_dir=location)
    if where.nodes > 1:
        return on_nodes(stage, cfg, where, location)
    if where.processes > 1:
        code = launch_processes(stage, cfg, where.processes)
        if code == PREEMPTED_EXIT:
            raise Preempted(f"posttrain {stage} --nproc {where.processes} stopped by SIGTERM after its checkpoint")
        if code != 0:
            raise RuntimeError(f"posttrain {stage} --nproc {where.processes} failed (see the workers' log above)")
        return read_result(stage, cfg.output_dir)
    return run_config(stage, cfg)


def launch_processes(stage: str, cfg, processes: int) -> int:
    """Run ``cfg`` in ``processes`` local workers (torchrun), each reading it from one YAML file written
    here; returns the launcher's exit status (0; 75 when SIGTERM stopped them after their checkpoint; a
    failure's otherwise). A SIGTERM to this process is passed on to the workers."""
    from trainer_lib.config.aliases import ANNOUNCED_ENV
    from trainer_lib.engine.launch import launch_workers

    if hasattr(cfg, "parallel"):  # a layout that cannot work is one line here, not one per rank
        from trainer_lib.engine.parallel import check_launch

        check_launch(cfg, processes)
    with tempfile.NamedTemporaryFile("w", prefix=f"posttrain-{stage}-", suffix=".yaml", delete=False) as fh:
        fh.write(config_text(cfg))
    try:
        worker = ["-m", "trainer_lib.cli", stage, "--config", fh.name]
        return launch_workers(processes, worker, env={ANNOUNCED_ENV: "1"})
    finally:
        os.remove(fh.name)


def on_nodes(stage: str, cfg, where: Where, location: str) -> dict:
    """Run ``cfg`` as a TrainJob of ``where.nodes`` nodes, then bring its final model into ``cfg.output_dir``.

    The job's output goes to ``<root>/jobs/<stage>-<fingerprint>/output`` beside the checkpoint
    ``location`` (``<root>/checkpoints/<stage>-<fingerprint>``), and the job is named after that
    fingerprint, so a retried launcher finds the same job and the same prefixes.
    """
    from trainer_lib.runner.trainjob import launch_stage, object_store_env

    if not storage.is_shared(location):
        raise UserError(
            f"nodes={where.nodes}: the pipeline root must be an object store every node reaches "
            f"(s3://, KFP's minio://, gs://...), got {where.checkpoint_root!r}"
        )
    job = location.replace("/checkpoints/", "/jobs/", 1)
    result = launch_stage(
        stage,
        dataclasses.replace(cfg, output_dir=f"{job}/output"),
        run_id=job.rsplit("-", 1)[-1],
        task=stage,
        image=where.image,
        num_nodes=where.nodes,
        nproc_per_node=where.processes,
        node=where.node,
        env=object_store_env(),
        timeout_s=float(os.environ.get("POSTTRAIN_TRAINJOB_TIMEOUT_S", 7 * 24 * 3600)),
        poll_s=float(os.environ.get("POSTTRAIN_TRAINJOB_POLL_S", 15)),
    )
    print(f"{stage}: TrainJob {result.name} finished; copying its model from {job}/output", flush=True)
    storage.download_dir(f"{job}/output", cfg.output_dir)
    return read_result(stage, cfg.output_dir)


def read_result(stage: str, output_dir: str) -> dict:
    """What rank 0 of ``stage`` left in ``output_dir`` for the caller (:data:`RESULT_FILES`)."""
    with open(os.path.join(output_dir, RESULT_FILES.get(stage, SUMMARY)), encoding="utf-8") as fh:
        return json.load(fh)


@contextlib.contextmanager
def exit_when_preempted():
    """Inside the block, :class:`Preempted` ends the process with status 75 and one line: a task's retry
    (Kubernetes, KFP) then resumes from the checkpoint the stage wrote on SIGTERM."""
    try:
        yield
    except Preempted as exc:
        print(f"preempted: {exc}", flush=True)
        raise SystemExit(PREEMPTED_EXIT) from None
