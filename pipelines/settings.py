"""Infrastructure settings, defined once for every pipeline and every task.

The image, the resources of each kind of stage, and the environment a task gets from the
cluster live here and only here; sub-pipelines never take them as parameters. Edit this file
for your cluster and run ``posttrain pipeline compile``. Resources and Kubernetes settings
compile into the IR and are ignored by ``kfp.local``.

Cluster objects referenced here are created by ``kubectl apply -k manifests/``:
``posttrain-s3`` (Secret: S3 credentials) and ``posttrain-config`` (ConfigMap: endpoint,
region). Both are optional: without them tasks simply run without those variables.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfp import kubernetes
from kfp.dsl import PipelineTask

from components.common import IMAGE

__all__ = ["IMAGE", "RESOURCES", "STAGE_KIND", "Resources", "configure"]


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    gpus: int = 0
    accelerator: str = "nvidia.com/gpu"
    shm: str = ""  # size of a memory-backed /dev/shm (NCCL and torch workers need more than 64M)


RESOURCES = {
    "light": Resources(cpu="1", memory="4Gi"),
    "train": Resources(cpu="8", memory="64Gi", gpus=1, shm="16Gi"),
    "export": Resources(cpu="8", memory="64Gi"),  # holds the FP32 model twice (PyTorch and ONNX) on CPU
}

#: which resources each component gets, by component name.
STAGE_KIND = {
    "check-config": "light",
    "fingerprint": "light",
    "bootstrap": "light",
    "prepare": "light",
    "train": "train",  # sft, reward, dpo, ppo, grpo
    "evaluate": "train",  # generates with the models
    "release": "light",
    "export": "export",
    "deploy": "light",
}

#: Secret key -> environment variable, and ConfigMap key -> environment variable.
S3_SECRET = "posttrain-s3"
S3_SECRET_ENV = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
CONFIG_MAP = "posttrain-config"
CONFIG_MAP_ENV = {
    "AWS_ENDPOINT_URL": "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION": "AWS_DEFAULT_REGION",
    "POSTTRAIN_KFP_API": "POSTTRAIN_KFP_API",
}

#: Tasks whose pods may be preempted or evicted are retried with backoff: training resumes from its
#: last complete checkpoint (on the pipeline root, see components/train.py), the others redo their work.
RETRIES = {
    "train": dict(num_retries=3, backoff_duration="60s", backoff_factor=2.0, backoff_max_duration="1800s"),
    "evaluate": dict(num_retries=2, backoff_duration="30s", backoff_factor=2.0, backoff_max_duration="600s"),
    "export": dict(num_retries=2, backoff_duration="30s", backoff_factor=2.0, backoff_max_duration="600s"),
}

#: Tasks that act on the world (publish a model, load it on a server) or look at it (what is behind a
#: location now) never answer from the cache.
NOT_CACHED = {"check-config", "fingerprint", "release", "deploy"}

#: Pod labels by component. ``check-config`` reads its run from the KFP API: on multi-user Kubeflow the
#: ``access-ml-pipeline`` PodDefault (see docs/pipelines.md) projects the API token into pods with this label.
POD_LABELS = {"check-config": {"access-ml-pipeline": "true"}}

#: Optional Secret with a Hugging Face token (key HF_TOKEN) for gated hub models and datasets.
HF_SECRET = "posttrain-hf"
HF_SECRET_ENV = {"HF_TOKEN": "HF_TOKEN"}
#: Image pull secrets of a private registry holding IMAGE (empty: none).
IMAGE_PULL_SECRETS: list[str] = []
#: A ReadWriteMany PVC shared by every task as the download cache of models and datasets ($POSTTRAIN_CACHE,
#: $HF_HOME), so a 70B base model is fetched once per run, not once per step (empty: none).
MODEL_CACHE_PVC = ""
MODEL_CACHE_PATH = "/cache"

#: plain environment variables for every task.
ENV = {"PYTHONUNBUFFERED": "1"}


def configure(task: PipelineTask, display_name: str | None = None, accelerator=None, gpus=None) -> PipelineTask:
    """Apply the shared settings to one task: resources by stage kind, environment, secrets, retries
    and caching. ``accelerator`` / ``gpus`` (pipeline parameters) replace the kind's accelerator type
    and count on tasks that have one."""
    name = task.component_spec.name
    if name not in STAGE_KIND:
        raise ValueError(f"pipelines/settings.py: add component '{name}' to STAGE_KIND")
    res = RESOURCES[STAGE_KIND[name]]
    task.set_cpu_request(res.cpu).set_memory_request(res.memory).set_memory_limit(res.memory)
    if res.gpus:
        task.set_accelerator_type(accelerator or res.accelerator).set_accelerator_limit(gpus or res.gpus)
        kubernetes.add_toleration(task, key=res.accelerator, operator="Exists", effect="NoSchedule")
    if res.shm:
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=res.shm)
    for key, value in POD_LABELS.get(name, {}).items():
        kubernetes.add_pod_label(task, key, value)
    for variable, value in ENV.items():
        task.set_env_variable(variable, value)
    kubernetes.use_secret_as_env(task, S3_SECRET, S3_SECRET_ENV, optional=True)
    kubernetes.use_config_map_as_env(task, CONFIG_MAP, CONFIG_MAP_ENV, optional=True)
    kubernetes.use_secret_as_env(task, HF_SECRET, HF_SECRET_ENV, optional=True)
    if IMAGE_PULL_SECRETS:
        kubernetes.set_image_pull_secrets(task, IMAGE_PULL_SECRETS)
    if MODEL_CACHE_PVC:
        kubernetes.mount_pvc(task, pvc_name=MODEL_CACHE_PVC, mount_path=MODEL_CACHE_PATH)
        task.set_env_variable("POSTTRAIN_CACHE", f"{MODEL_CACHE_PATH}/posttrain")
        task.set_env_variable("HF_HOME", f"{MODEL_CACHE_PATH}/huggingface")
    if name in RETRIES:
        task.set_retry(**RETRIES[name])
    if name in NOT_CACHED:
        task.set_caching_options(enable_caching=False)
    if display_name:
        task.set_display_name(display_name)
    return task
