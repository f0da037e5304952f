"""What every component shares: the images they run in, what a GPU pod gets from its host, and the small
runtime helpers that read KFP artifacts (where an artifact lives, its metadata, a Metrics artifact).

Running a stage (here, in N processes, on N nodes) is the library's: :mod:`trainer_lib.runner`.

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
    "tune": CUDA_IMAGE,  # a search before a training task: its trials, one process each, on the pod's GPUs
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


def stage_params(stage: str, data, params: dict) -> dict:
    """A training task's ``params`` with, under ``dpo``, the precomputed reference log-probs cached next to a
    dataset that lives in the object store (below the user's own keys: they may put the cache elsewhere), so
    a retry, a resumed run, a search's trials or another DPO run on the same data and reference find them."""
    store = store_prefix(data) if stage == "dpo" else None
    return {"reference_logps_path": store + "/reference_logps", **params} if store else params


def remote_location(artifact) -> str:
    """Where other pods read an artifact: its pass-through source, else its object-store URI (KFP's
    ``minio://`` read as the S3 bucket it is); a TrainJob's nodes cannot see the launcher's disk."""
    given = (artifact.metadata or {}).get(SOURCE_KEY)
    return given or (artifact.uri or "").replace("minio://", "s3://", 1)


def training_node(gpus: int, accelerator: str = ""):
    """What each node of a multi-node step holds (a ``trainer_lib.runner.trainjob.NodeResources``):
    ``gpus`` accelerators, :data:`PER_GPU` host resources for each, and the GPU placement above."""
    from trainer_lib.runner.trainjob import NodeResources

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
