"""Infrastructure settings, defined once for every pipeline and every task.

The images, the resources of each kind of stage, and the environment a task gets from the
cluster live here and only here; sub-pipelines never take them as parameters. Edit this file
for your cluster and run ``posttrain pipeline compile``. Resources and Kubernetes settings
compile into the IR and are ignored by ``kfp.local``.

Images: which build (CPU or CUDA) each component runs is the ``BUILDS`` table of components/common.py,
read when a component is decorated (KFP fixes a lightweight component's image there; components/ cannot
import this file), re-exported here. GPU tasks (train, tune, evaluate) run the CUDA build, the rest the CPU one.

Resources follow the accelerators. A GPU pod gets ``PER_GPU`` host CPU, memory and /dev/shm for each
accelerator it holds. ``PER_GPU``, ``GPU_TOLERATIONS`` and ``GPU_NODE_SELECTOR`` are set in
components/common.py, because the train component also reads them at run time for the nodes of a
multi-node TrainJob (rebuild the image when you change them); they are re-exported here.
``gpus_per_step`` is a run parameter, and KFP 2.17 takes a run value for a task's CPU, memory and
accelerator count only as it is (a pipeline parameter or a task output, no arithmetic; as text: the KFP
driver reads a number as empty). So each pipeline starts one light ``training-resources`` task
(:func:`sizing_task`) that multiplies the per-GPU values by the run's ``gpus_per_step`` and returns the
quantities as text; every training task takes its CPU and memory requests, memory limit and accelerator
count from that task's outputs. In the IR a training task's ``resourceCpuRequest`` reads
``{{$.inputs.parameters['pipelinechannel--training-resources-cpu']}}`` (memory and the accelerator count
alike). With ``nodes_per_step`` > 1 the training pod only launches the TrainJob: it holds no accelerator.
Two settings stay fixed when compiling, because kfp-kubernetes takes no run value there: the /dev/shm
size limit of a training pod (set for a whole node, ``GPUS_PER_NODE_MAX`` accelerators; what /dev/shm holds
counts against the pod's memory limit, which does follow ``gpus_per_step``), and the tolerations and node
selector of GPU pods (``GPU_TOLERATIONS``, ``GPU_NODE_SELECTOR``). ``evaluate`` is sized like a training pod
(``gpus_per_step`` accelerators, one evaluation process on each), and so is ``tune`` (a search's trials, one
process each). ``export`` holds one accelerator, and
its CPU and memory follow the model: a light ``export-resources`` task turns the training task's parameter
count into them (``EXPORT_BYTES_PER_PARAMETER``).

Cluster objects referenced here are created by ``kubectl apply -k manifests/``:
``posttrain-s3`` (Secret: S3 credentials) and ``posttrain-config`` (ConfigMap: endpoint,
region). Both are optional: without them tasks simply run without those variables.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfp import kubernetes
from kfp.dsl import PipelineTask

from components.common import (
    ACCELERATOR,
    BUILDS,
    CUDA_IMAGE,
    GPU_NODE_SELECTOR,
    GPU_TOLERATIONS,
    IMAGE,
    PER_GPU,
    image_for,
)
from components.resources import export_resources, training_resources

__all__ = [
    "ACCELERATOR",
    "BUILDS",
    "CUDA_IMAGE",
    "GPU_NODE_SELECTOR",
    "GPU_TOLERATIONS",
    "IMAGE",
    "PER_GPU",
    "RESOURCES",
    "STAGE_KIND",
    "Resources",
    "configure",
    "image_for",
    "sizing_task",
]


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    gpus: int = 0
    shm: str = ""  # size of a memory-backed /dev/shm (NCCL and torch workers need more than 64M)


#: The most accelerators one training pod holds (a node's worth): its /dev/shm size limit is set for this many.
GPUS_PER_NODE_MAX = 8

RESOURCES = {
    "light": Resources(cpu="1", memory="4Gi"),
    # one accelerator's worth of PER_GPU; a training task's CPU, memory and count follow gpus_per_step
    "train": Resources(**PER_GPU.for_gpus(1), gpus=1),
    # one accelerator (FP16 export and its parity); CPU and memory follow the model (export_sizing_task)
    "export": Resources(cpu="8", memory="32Gi", gpus=1, shm="1Gi"),
}

#: The export pod's host memory per parameter of the model: the measured peak of ``posttrain export`` is
#: under 2.5x the FP32 weights (10 bytes a parameter; benchmarks/export_memory.py), plus room for the
#: onnxruntime sessions of the parity check. Never under the export's ``memory`` above.
EXPORT_BYTES_PER_PARAMETER = 12.0

#: which resources each component gets, by component name.
STAGE_KIND = {
    "check-config": "light",
    "fingerprint": "light",
    "bootstrap": "light",
    "prepare": "light",
    "training-resources": "light",
    "export-resources": "light",
    "train": "train",  # sft, reward, dpo, ppo, grpo
    "tune": "train",  # a search before a training task: its trials run in this pod, sized as a training step
    "evaluate": "train",  # generates with the models
    "release": "light",
    "export": "export",
    "deploy": "light",
    "notify": "light",
    "check-changes": "light",
    "record-inputs": "light",
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
NOT_CACHED = {"check-config", "fingerprint", "release", "deploy", "notify", "check-changes", "record-inputs"}

#: Pod labels by component. ``check-config`` reads its run from the KFP API: on multi-user Kubeflow the
#: ``access-ml-pipeline`` PodDefault (see docs/pipelines.md) projects the API token into pods with this label.
POD_LABELS = {"check-config": {"access-ml-pipeline": "true"}}

#: Optional Secret with a Hugging Face token (key HF_TOKEN) for gated hub models and datasets.
HF_SECRET = "posttrain-hf"
HF_SECRET_ENV = {"HF_TOKEN": "HF_TOKEN"}
#: Optional Secret with the webhook the ``notify`` exit task posts to when the run gives no ``notify_webhook``
#: (key ``webhook``): a webhook URL usually carries its token, and run parameters are shown in the KFP UI.
NOTIFY_SECRET = "posttrain-notify"
NOTIFY_SECRET_ENV = {"webhook": "POSTTRAIN_NOTIFY_WEBHOOK"}
#: Image pull secrets of a private registry holding IMAGE and CUDA_IMAGE (empty: none).
IMAGE_PULL_SECRETS: list[str] = []
#: A ReadWriteMany PVC shared by every task as the download cache of models and datasets ($POSTTRAIN_CACHE,
#: $HF_HOME), so a 70B base model is fetched once per run, not once per step (empty: none).
MODEL_CACHE_PVC = ""
MODEL_CACHE_PATH = "/cache"

#: plain environment variables for every task.
ENV = {"PYTHONUNBUFFERED": "1"}

#: ``posttrain pipeline run --runner docker`` (kfp.local's DockerRunner; Docker, or podman's Docker API):
#: every task in its image, with what its pod gets on a cluster, from this file (:func:`container_run_args`).
IMAGE_UID = 1000  # the image's user (images/Dockerfile)
CONTAINER_ULIMITS = {"nofile": 20000, "nproc": 4096}  # a container runtime's defaults can be lower, or unset
#: the network of a local task: the host's, so a server on the host's loopback (a local S3 endpoint, as the
#: cluster's endpoint is for a pod) is reachable; a container on the default bridge cannot reach it.
CONTAINER_NETWORK = "host"


#: thread caps a local container takes from the host where set: torch sizes its pools by the machine's
#: cores, and beside other work a tiny model's many short parallel regions stall on preempted threads
#: (make demo-containers' SFT ran 3.5 s a step beside one other training process, 10x its usual).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def container_run_args(environ: dict, cache_dir: str, host_uid: int, host_gid: int) -> dict:
    """kfp.local DockerRunner arguments: the image's user (the host's own uid when that is not root, so the
    files a task writes are the host user's), /dev/shm as a one-accelerator training pod's, the limits
    above, the network above, ENV plus the variables the S3 and Hugging Face Secrets and the ConfigMap give
    a pod and the thread caps of THREAD_ENV, taken from ``environ`` where set (nothing is compiled into the
    pipeline), and ``cache_dir`` as the shared cache at MODEL_CACHE_PATH (a local run's MODEL_CACHE_PVC)."""
    forwarded = [*S3_SECRET_ENV.values(), *CONFIG_MAP_ENV.values(), *HF_SECRET_ENV.values(), *THREAD_ENV]
    environment = {**ENV, **{name: environ[name] for name in forwarded if environ.get(name)}}
    environment.update(POSTTRAIN_CACHE=f"{MODEL_CACHE_PATH}/posttrain", HF_HOME=f"{MODEL_CACHE_PATH}/huggingface")
    user = f"{IMAGE_UID}:{IMAGE_UID}" if host_uid == 0 else f"{host_uid}:{host_gid}"
    return {
        "user": user,
        "shm_size": PER_GPU.for_gpus(1)["shm"].replace("Gi", "g"),
        "ulimits": [{"Name": name, "Soft": value, "Hard": value} for name, value in CONTAINER_ULIMITS.items()],
        "network_mode": CONTAINER_NETWORK,
        "environment": environment,
        "mounts": [{"Target": MODEL_CACHE_PATH, "Source": cache_dir, "Type": "bind", "ReadOnly": False}],
    }


def sizing_task(gpus, nodes, after: PipelineTask) -> PipelineTask:
    """The run's ``training-resources`` task: a training pod's CPU, memory and accelerator count for
    ``gpus`` (``gpus_per_step``) accelerators per node and ``nodes`` (``nodes_per_step``), started
    ``after`` a task that follows the run's config check. Create it once per pipeline and hand it to
    :func:`configure` (``sizing=``) with every training task."""
    task = training_resources(gpus=gpus, nodes=nodes, cpu_per_gpu=PER_GPU.cpu, memory_gi_per_gpu=PER_GPU.memory_gi)
    return configure(task.after(after), "training resources")


def export_sizing_task(parameters, label: str) -> PipelineTask:
    """The ``export-resources`` task of one export: its pod's CPU and memory for a model of ``parameters``
    (the training task's output). Hand it to :func:`configure` (``sizing=``) with the export task."""
    res = RESOURCES["export"]
    task = export_resources(
        parameters=parameters,
        cpu=int(res.cpu),
        memory_gi_min=int(res.memory.removesuffix("Gi")),
        bytes_per_parameter=EXPORT_BYTES_PER_PARAMETER,
    )
    return configure(task, f"export resources {label}")


def configure(task: PipelineTask, display_name: str | None = None, accelerator=None, sizing=None) -> PipelineTask:
    """Apply the shared settings to one task: resources by stage kind, environment, secrets, retries
    and caching. On tasks that hold an accelerator, ``accelerator`` (a pipeline parameter) replaces its
    type, and ``sizing`` (the :func:`sizing_task` of the run) sets CPU, memory and the accelerator count."""
    name = task.component_spec.name
    if name not in STAGE_KIND:
        raise ValueError(f"pipelines/settings.py: add component '{name}' to STAGE_KIND")
    res = RESOURCES[STAGE_KIND[name]]
    cpu, memory, gpus, shm = res.cpu, res.memory, res.gpus, res.shm
    if res.gpus and sizing is not None:
        channels = [sizing.outputs[key] for key in ("cpu", "memory", "accelerators") if key in sizing.outputs]
        cpu, memory = channels[:2]
        if len(channels) == 3:  # a training pod: the run's accelerators and /dev/shm for a node's worth
            gpus, shm = channels[2], PER_GPU.for_gpus(GPUS_PER_NODE_MAX)["shm"]
        # resources alone do not make KFP pass a task output into a dsl.If branch (nor order the tasks)
        task.register_pipeline_channels(channels)
    task.set_cpu_request(cpu).set_memory_request(memory).set_memory_limit(memory)
    if res.gpus:
        task.set_accelerator_type(accelerator or ACCELERATOR).set_accelerator_limit(gpus)
        for toleration in GPU_TOLERATIONS:
            kubernetes.add_toleration(task, **toleration)
        for label, value in GPU_NODE_SELECTOR.items():
            kubernetes.add_node_selector(task, label, value)
    if shm:
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=shm)
    for key, value in POD_LABELS.get(name, {}).items():
        kubernetes.add_pod_label(task, key, value)
    for variable, value in ENV.items():
        task.set_env_variable(variable, value)
    kubernetes.use_secret_as_env(task, S3_SECRET, S3_SECRET_ENV, optional=True)
    kubernetes.use_config_map_as_env(task, CONFIG_MAP, CONFIG_MAP_ENV, optional=True)
    kubernetes.use_secret_as_env(task, HF_SECRET, HF_SECRET_ENV, optional=True)
    if name == "notify":
        kubernetes.use_secret_as_env(task, NOTIFY_SECRET, NOTIFY_SECRET_ENV, optional=True)
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
