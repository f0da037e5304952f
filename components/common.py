"""What every component shares: the images they run in, what a GPU pod gets from its host, and small
runtime helpers.

Module top imports only the standard library: compiling a pipeline imports this file. The
helpers are imported *inside* component bodies at run time (the image installs this package).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

#: The package version (pyproject.toml) and the two builds of images/Dockerfile tagged from it:
#: ``make image-cpu`` (torch +cpu) and ``make image-cuda`` (torch +cu128, DeepSpeed over NCCL).
#: Pushing elsewhere: change REGISTRY (and the ``image:`` lines under manifests/).
VERSION = "0.1.0"
REGISTRY = "ghcr.io/posttrain/posttrain"
IMAGE = f"{REGISTRY}:{VERSION}"  # the CPU build
CUDA_IMAGE = f"{REGISTRY}:{VERSION}-cu128"  # the CUDA build

#: Which build each component runs in, by KFP component name: the tasks that hold an accelerator get the
#: CUDA build, the rest the smaller CPU one. KFP fixes a lightweight component's image when it is decorated,
#: so each decorator reads this table (``base_image=image_for("train")``); the TrainJob of a multi-node step
#: runs the train component's image too.
BUILDS = {
    "check-config": IMAGE,
    "fingerprint": IMAGE,
    "bootstrap": IMAGE,
    "prepare": IMAGE,
    "training-resources": IMAGE,
    "export-resources": IMAGE,
    "train": CUDA_IMAGE,  # sft, reward, dpo, ppo, grpo; one process per GPU
    "evaluate": CUDA_IMAGE,  # generates with every model it compares
    "release": IMAGE,
    "export": CUDA_IMAGE,  # exports FP16 on its GPU; FP32, INT8/INT4 and their parity on CPU
    "deploy": IMAGE,
    "notify": IMAGE,  # the exit task: posts the run's outcome to a webhook
    "check-changes": IMAGE,  # skip_if_unchanged: compares the run's inputs with the latest release's
    "record-inputs": IMAGE,  # leaves what check-changes compares with beside a release
}


def image_for(component: str) -> str:
    """The image of the component named ``component`` (its KFP name, e.g. ``check-config``)."""
    if component not in BUILDS:
        raise KeyError(f"components/common.py: add component '{component}' to BUILDS")
    return BUILDS[component]


@dataclass(frozen=True)
class HostPerGpu:
    """What a training pod (or a TrainJob node) gets from its host for each accelerator it holds.

    Times 8 GPUs the defaults (64 CPUs, 512 GiB) fit the usual 8-GPU machines (AWS p4d/p5, GCP a2/a3,
    Azure ND A100/H100, DGX: 96-224 vCPUs, 680 GB-2 TiB) with room for the node's own daemons, and one
    GPU's worth fits the 1-GPU A100 machines (12 vCPUs, 85 GB). Lower them for small GPU nodes (an L4 or
    A10G node with 4-8 vCPUs and 16-32 GB); raise ``memory_gi`` for optimizer offload of large models.
    """

    #: a rank's own threads plus its DataLoader workers and the tokenizer
    cpu: int = 8
    #: host memory holds each rank's process (CUDA context, pinned transfer buffers), its DataLoader workers
    #: and batches in flight, and what the engine keeps on CPU: optimizer state with engine.offload_optimizer
    #: (fp32 weights and two Adam moments, 12 bytes per parameter, divided over the ranks), weights with
    #: engine.offload_params. Loading never puts a whole model per rank in host memory (trainer_lib.models).
    memory_gi: int = 64
    #: a memory-backed /dev/shm for NCCL's buffers and the DataLoader workers' batches (Kubernetes gives 64M;
    #: NCCL needs tens of MB per peer). What it holds counts against the memory above.
    shm_gi: int = 16

    def for_gpus(self, gpus: int) -> dict[str, str]:
        """Kubernetes quantities for a pod holding ``gpus`` accelerators (at least one GPU's worth)."""
        n = max(int(gpus), 1)
        return {"cpu": str(self.cpu * n), "memory": f"{self.memory_gi * n}Gi", "shm": f"{self.shm_gi * n}Gi"}


#: Host resources per accelerator, for the pipeline's training pods and the nodes of a multi-node step alike.
PER_GPU = HostPerGpu()
#: The accelerator a GPU pod requests unless the run names another (pipeline parameter ``accelerator_type``).
ACCELERATOR = "nvidia.com/gpu"
#: Where GPU pods may and must run: the taint of GPU nodes (GKE puts this one on GPU node pools; it is the
#: usual one elsewhere), and an optional node selector, e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
#: (the label of NVIDIA's GPU feature discovery).
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]  # key/operator/value/effect
GPU_NODE_SELECTOR: dict[str, str] = {}

#: Artifact metadata key of a pass-through location (HF id, local dir, s3:// prefix).
SOURCE_KEY = "source"


def source_of(artifact) -> str:
    """Where a stage reads an artifact: its pass-through ``source`` if set, else its own path.

    A 70B base model given as ``s3://...`` or a hub id is never copied into an artifact; the
    bootstrap component records the location in the artifact's metadata instead.
    """
    return (artifact.metadata or {}).get(SOURCE_KEY) or artifact.path


def mark_source(artifact, source: str) -> None:
    """Make ``artifact`` a pass-through pointer to ``source`` (metadata plus a small file)."""
    artifact.metadata[SOURCE_KEY] = source
    os.makedirs(artifact.path, exist_ok=True)  # the backend uploads whatever is at the path
    with open(os.path.join(artifact.path, "SOURCE"), "w", encoding="utf-8") as fh:
        fh.write(source + "\n")


def log_summary(metrics, summary: dict, prefix: str = "") -> dict:
    """Log every finite number of a stage summary (nested keys joined by '.') to a Metrics artifact."""
    logged = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            logged.update(log_summary(metrics, value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            metrics.log_metric(name, value)
            logged[name] = value
    return logged


def last_logged(output_dir: str, split: str = "train") -> dict:
    """The last ``metrics.jsonl`` record of ``split`` a training stage wrote (without step/time)."""
    import json

    path = os.path.join(output_dir, "metrics.jsonl")
    record: dict = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line) if line.strip() else {}
                if row.get("split") == split:
                    record = row
    return {k: v for k, v in record.items() if k not in ("step", "split", "time")}


def store_prefix(artifact) -> str | None:
    """The object-store folder an artifact lives in (``s3://...``), or None when it is not in one.

    KFP's MinIO store is S3-compatible (``minio://bucket/key`` is ``s3://bucket/key`` at the same
    endpoint); a file artifact's folder is the one holding it.
    """
    uris = [u.replace("minio://", "s3://", 1) for u in (source_of(artifact), artifact.uri) if u]
    store = next((u.rstrip("/") for u in uris if u.startswith("s3://")), None)
    if store and "." in store.rsplit("/", 1)[-1]:
        store = store.rsplit("/", 1)[0]
    return store


def training_layers(values: dict, paths: dict) -> list:
    """The config layers of a training task, lowest precedence first: its typed parameters, ``params``
    (empty values left out), the reward lists when non-empty, the user's overrides, the artifact
    paths. The train component runs these; ``posttrain pipeline run`` validates them beforehand."""
    typed = {
        "max_steps": values["max_steps"],
        "lr": values["lr"],
        "batch_size": values["batch_size"],
        "data.max_length": values["max_length"],
        "seed": values["seed"],
    }
    lists = {"reward.functions": values["reward_functions"], "reward.weights": values["reward_weights"]}
    given = {
        **{key: value for key, value in values["params"].items() if value not in ("", None)},
        **{key: value for key, value in lists.items() if value},
    }
    return [typed, given, *values["overrides"], paths]


def run_in_processes(stage: str, cfg, processes: int, written: str = "summary.json") -> dict:
    """Run a built stage config in ``processes`` local workers, as ``posttrain <stage> --config F
    --nproc N`` (torchrun); returns what rank 0 wrote to ``written`` in the output directory (a training
    stage's summary, evaluate's metrics.json). A worker's failure fails the step; workers stopped by SIGTERM
    after their checkpoint (status 75; a SIGTERM to this process is passed on to them) raise
    :class:`trainer_lib.engine.preemption.Preempted`, which the train component exits with as 75 (retryable)."""
    import json
    import subprocess
    import sys
    import tempfile

    import yaml

    from trainer_lib.config import to_dict

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(to_dict(cfg), fh, sort_keys=False)
    command = [sys.executable, "-m", "trainer_lib.cli", stage, "--config", fh.name, "--nproc", str(processes)]
    try:
        from trainer_lib.engine.preemption import PREEMPTED_EXIT, Preempted, passing_sigterm_to

        workers = subprocess.Popen(command)
        with passing_sigterm_to(workers):  # a pod's SIGTERM reaches the workers, which checkpoint and stop
            code = workers.wait()
        if code == PREEMPTED_EXIT:
            raise Preempted(f"posttrain {stage} --nproc {processes} stopped by SIGTERM after its checkpoint")
        if code != 0:
            raise RuntimeError(f"posttrain {stage} --nproc {processes} failed (see the workers' log above)")
    finally:
        os.remove(fh.name)
    with open(os.path.join(cfg.output_dir, written), encoding="utf-8") as fh:
        return json.load(fh)


def remote_location(artifact) -> str:
    """Where other pods read an artifact: its pass-through source, else its object-store URI (KFP's
    ``minio://`` read as the S3 bucket it is); a TrainJob's nodes cannot see the launcher's disk."""
    given = (artifact.metadata or {}).get(SOURCE_KEY)
    return given or (artifact.uri or "").replace("minio://", "s3://", 1)


def training_node(gpus: int, accelerator: str = ""):
    """What each node of a multi-node step holds (a ``trainer_lib.cluster.trainjob.NodeResources``):
    ``gpus`` accelerators, :data:`PER_GPU` host resources for each, and the GPU placement above."""
    from trainer_lib.cluster.trainjob import NodeResources

    host = PER_GPU.for_gpus(gpus)
    return NodeResources(
        gpus=gpus,
        accelerator=accelerator or ACCELERATOR,
        cpu=host["cpu"],
        memory=host["memory"],
        shm=host["shm"],
        tolerations=tuple(GPU_TOLERATIONS),
        node_selector=dict(GPU_NODE_SELECTOR),
    )


def run_on_nodes(stage: str, cfg, nodes: int, per_node: int, root: str, accelerator: str = "") -> dict:
    """Run a built stage config on ``nodes`` nodes x ``per_node`` processes (and accelerators, of
    ``accelerator``, default :data:`ACCELERATOR`) as a Kubeflow Trainer ``TrainJob`` (trainer_lib.cluster)
    in the train component's image, then bring its final model into ``cfg.output_dir``.

    The job's output and checkpoints live under the pipeline root at a location derived from the
    config, so a retried launcher re-attaches to the same job (same name) and the same prefixes.
    """
    import json

    from trainer_lib import storage
    from trainer_lib.cluster.trainjob import launch_stage, object_store_env
    from trainer_lib.config import to_dict
    from trainer_lib.engine.checkpoint import stable_checkpoint_dir
    from trainer_lib.errors import UserError

    checkpoints = stable_checkpoint_dir(cfg, root, stage)
    if not storage.is_shared(checkpoints):
        raise UserError(
            f"nodes={nodes}: the pipeline root must be an object store every node reaches "
            f"(s3://, KFP's minio://, gs://...), got {root!r}"
        )
    job = checkpoints.replace("/checkpoints/", "/jobs/", 1)
    values = {k: v for k, v in to_dict(cfg).items() if k not in ("output_dir", "checkpoint_dir")}
    result = launch_stage(
        stage,
        [values],
        run_id=job.rsplit("-", 1)[-1],
        task=stage,
        image=image_for("train"),
        output_dir=f"{job}/output",
        checkpoint_dir=cfg.checkpoint_dir or checkpoints,
        num_nodes=nodes,
        nproc_per_node=per_node,
        node=training_node(per_node, accelerator),
        env=object_store_env(),
        timeout_s=float(os.environ.get("POSTTRAIN_TRAINJOB_TIMEOUT_S", 7 * 24 * 3600)),
        poll_s=float(os.environ.get("POSTTRAIN_TRAINJOB_POLL_S", 15)),
    )
    print(f"{stage}: TrainJob {result.name} finished; copying its model from {job}/output", flush=True)
    storage.download_dir(f"{job}/output", cfg.output_dir)
    with open(os.path.join(cfg.output_dir, "summary.json"), encoding="utf-8") as fh:
        return json.load(fh)
