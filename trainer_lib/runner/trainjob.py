"""Launch a training stage on several nodes as a Kubeflow Trainer v2 ``TrainJob`` and wait for it.

A KFP task is one pod. A stage that needs several nodes is started from that pod as a ``TrainJob``
(``trainer.kubeflow.org/v1alpha1``, fields as in Trainer v2.2/v2.3), which the Trainer turns into
``numNodes`` pods running ``posttrain <stage> --nproc N --config-yaml TEXT``; its ``torch-distributed``
runtime sets the ``PET_*`` variables torchrun reads (:mod:`trainer_lib.engine.launch`).

    cfg = stage_config("sft", layers)  # with object-store paths, output_dir and checkpoint_dir
    result = launch_stage("sft", cfg, run_id=..., task="sft", image=CUDA_IMAGE,
                          num_nodes=2, nproc_per_node=8, timeout_s=12 * 3600,
                          node=NodeResources(gpus=8, cpu="64", memory="512Gi", shm="128Gi"))

Why it is shaped this way:

* The job name is a function of the pipeline run id and the task name, so a retried launcher pod
  finds the job its previous attempt created (409 on create) and waits on it again instead of
  starting a second copy of the training.
* Every path the nodes write is an object-store prefix (``s3://``, ``gs://``...): all nodes and
  every retry see the same checkpoints; the launcher's own disk is never involved. A path key that
  names the launcher's disk is refused before any request.
* The stage config arrives built and validated (before any GPU is requested) and travels as one
  argument, its YAML text (:func:`trainer_lib.runner.stage_api.config_text`), which each node reads
  back to an equal config.
* The wait has an explicit deadline; condition changes go to stdout (the KFP step log); the job is
  deleted in ``finally``, so a failed or abandoned job does not hold its nodes.
* What each node holds (:class:`NodeResources`) goes where the Trainer's API takes it: accelerators,
  CPU and memory in ``spec.trainer.resourcesPerNode``; the memory-backed ``/dev/shm``, tolerations and
  node selector, which that field has no room for, in one ``spec.runtimePatches`` entry of ours on the
  runtime's ``node`` job and container.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
import time

import yaml

from trainer_lib import storage
from trainer_lib.config import to_dict
from trainer_lib.errors import UserError
from trainer_lib.runner.kube import api_client, current_namespace
from trainer_lib.runner.stage_api import config_text

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
API_VERSION = f"{GROUP}/{VERSION}"
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime that ships with Kubeflow Trainer
#: that runtime's replicated job and trainer container, both named "node": runtimePatches name them (the
#: Trainer's webhook refuses a patch naming a job or container its runtime does not have)
RUNTIME_JOB = RUNTIME_CONTAINER = "node"
#: who owns our runtimePatches entry (a domain-prefixed path; Kueue and the Kubeflow SDK own theirs)
PATCH_MANAGER = "posttrain/launcher"
#: the Secrets and ConfigMap of manifests/ (same names as pipelines/settings.py)
S3_SECRET, CONFIG_MAP, HF_SECRET = "posttrain-s3", "posttrain-config", "posttrain-hf"
# A TrainJob name is an RFC 1035 label of <= 63 characters; the JobSet, Job and pod names derived
# from it append "-node-<i>-<j>-<suffix>", which must fit in 63 too.
NAME_MAX = 40


class TrainJobError(UserError):
    """The TrainJob failed, or could not be created or read."""


class TrainJobTimeout(TrainJobError, TimeoutError):
    """The TrainJob did not finish within the launcher's timeout."""


@dataclasses.dataclass(frozen=True)
class NodeResources:
    """What each node of a TrainJob holds, and where it may run.

    ``gpus`` accelerators of the extended resource ``accelerator``; ``cpu`` and ``memory`` requested for
    the host side (memory is the limit too); ``shm`` the size of a memory-backed ``/dev/shm`` (the
    runtime's pods otherwise get 64M, too little for NCCL); ``tolerations`` and ``node_selector`` as in a
    pod spec. Empty values are left out.
    """

    gpus: int = 0
    accelerator: str = "nvidia.com/gpu"
    cpu: str = ""
    memory: str = ""
    shm: str = ""
    tolerations: tuple[dict, ...] = ()
    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)

    def resources(self) -> dict:
        """``spec.trainer.resourcesPerNode``: requests, and limits for memory and the accelerators (an
        extended resource's request must equal its limit). No CPU limit: it would throttle the data workers."""
        requests: dict[str, str] = {}
        limits: dict[str, str] = {}
        if self.cpu:
            requests["cpu"] = self.cpu
        if self.memory:
            requests["memory"] = limits["memory"] = self.memory
        if self.gpus:
            requests[self.accelerator] = limits[self.accelerator] = str(self.gpus)
        return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}

    def pod_settings(self, container: str) -> dict:
        """The pod settings ``resources()`` cannot express: tolerations, node selector, and a memory-backed
        ``/dev/shm`` mounted in the container named ``container`` (empty when there are none)."""
        pod: dict = {}
        if self.tolerations:
            pod["tolerations"] = [dict(t) for t in self.tolerations]
        if self.node_selector:
            pod["nodeSelector"] = dict(self.node_selector)
        if self.shm:
            pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": self.shm}}]
            pod["containers"] = [{"name": container, "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
        return pod

    def runtime_patch(self) -> dict | None:
        """Our ``spec.runtimePatches`` entry: the pod settings of the runtime's ``node`` job that
        ``resourcesPerNode`` cannot express (None when there are none)."""
        pod = self.pod_settings(RUNTIME_CONTAINER)
        if not pod:
            return None
        job = {"name": RUNTIME_JOB, "template": {"spec": {"template": {"spec": pod}}}}
        return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


@dataclasses.dataclass
class TrainJobResult:
    name: str
    namespace: str
    status: dict  # the TrainJob's final .status
    output_dir: str  # where the stage wrote its logs and final HF model
    checkpoint_dir: str
    reattached: bool  # the job existed already (a retried launcher)


# --------------------------------------------------------------------------- the object


def job_name(run_id: str, task: str, prefix: str = "posttrain") -> str:
    """``posttrain-<task>-<hash of run id and task>``: stable across retries of one task, distinct
    across runs, a valid RFC 1035 label of at most ``NAME_MAX`` characters."""
    digest = hashlib.sha256(f"{run_id}/{task}".encode()).hexdigest()[:10]
    room = NAME_MAX - len(prefix) - len(digest) - 2
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower())[:room].strip("-")
    return "-".join(part for part in (prefix, slug, digest) if part)


def object_store_env(secret: str = S3_SECRET, config_map: str = CONFIG_MAP, extra: dict | None = None) -> list[dict]:
    """The trainer containers' environment: S3 credentials and endpoint from manifests/ and the Hugging
    Face token (optional references, as for pipeline tasks: workload identity and public models need
    none of them), plus plain variables. Secrets stay references: their values never enter the job."""
    env = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    env.append(
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_SECRET, "key": "HF_TOKEN", "optional": True}}}
    )
    env += [
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": config_map, "key": key, "optional": True}}}
        for key in ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
    ]
    plain = {"PYTHONUNBUFFERED": "1", "POSTTRAIN_NO_PROGRESS": "1", **(extra or {})}
    return env + [{"name": key, "value": str(value)} for key, value in plain.items()]


#: the option of ``posttrain <stage>`` that carries the config's YAML text to the nodes
CONFIG_OPTION = "--config-yaml"


def _dotted(values: dict, prefix: str = ""):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def check_locations(cfg) -> None:
    """Refuse a config that names the launcher's disk where a node reads or writes: ``output_dir`` and
    ``checkpoint_dir`` must be object-store prefixes every node and every retry sees, and no ``*path``
    key may be a local path (a hub id or a URL is fine)."""
    for key in ("output_dir", "checkpoint_dir"):
        value = getattr(cfg, key)
        if not storage.is_shared(value):
            raise UserError(
                f"{key}: a TrainJob writes to an object-store prefix (s3://, gs://, az://...) that "
                f"every node and every retry sees, got {value!r}"
            )
    check_read_paths(cfg, "the TrainJob's nodes")


def check_read_paths(cfg, who: str) -> None:
    """Refuse a ``*path`` key of ``cfg`` that names this machine's disk, which ``who`` (pods elsewhere)
    do not see; a hub id or a URL is fine."""
    for key, value in _dotted(to_dict(cfg)):
        if (
            key.endswith("path")
            and isinstance(value, str)
            and (value.startswith(("/", "./", "../", "~")) or storage.is_remote(value) and not storage.is_shared(value))
        ):
            raise UserError(
                f"{key}: {value!r} is a path on the launcher's disk, which {who} "
                f"do not see; use an object-store URL (s3://, gs://...) or a hub id"
            )


def job_config(job: dict) -> dict:
    """The config values a TrainJob's nodes run with (what follows ``--config-yaml`` in its args)."""
    args = list(job["spec"]["trainer"].get("args", []))
    if CONFIG_OPTION not in args:
        return {}
    return yaml.safe_load(args[args.index(CONFIG_OPTION) + 1]) or {}


def build_trainjob(
    name: str,
    stage: str,
    config: str,
    *,
    image: str,
    num_nodes: int,
    nproc_per_node: int,
    node: NodeResources | None = None,
    env: list[dict] | None = None,
    runtime: str = RUNTIME,
    active_deadline_s: int | None = None,
    labels: dict | None = None,
    annotations: dict | None = None,
) -> dict:
    """The ``TrainJob`` object: ``posttrain <stage> --nproc N --config-yaml TEXT`` with ``config`` (a config's
    YAML text) as that one argument, each of its ``num_nodes`` nodes holding what ``node`` says."""
    if num_nodes < 1 or nproc_per_node < 1:
        raise UserError(f"num_nodes and nproc_per_node: expected >= 1, got {num_nodes} and {nproc_per_node}")
    trainer = {
        "image": image,
        "command": ["posttrain", stage, "--nproc", str(nproc_per_node)],
        "args": [CONFIG_OPTION, config],
        "env": object_store_env() if env is None else env,
        "numNodes": num_nodes,
        "numProcPerNode": nproc_per_node,
    }
    if node and node.resources():
        trainer["resourcesPerNode"] = node.resources()
    spec = {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime", "apiGroup": GROUP}, "trainer": trainer}
    patch = node.runtime_patch() if node else None
    if patch:
        spec["runtimePatches"] = [patch]
    if active_deadline_s:
        spec["activeDeadlineSeconds"] = int(active_deadline_s)  # the Trainer fails the job after this
    metadata = {
        "name": name,
        "labels": {"app.kubernetes.io/part-of": "posttrain", "posttrain/stage": stage, **(labels or {})},
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


# --------------------------------------------------------------------------- waiting


def _conditions(job: dict) -> list[dict]:
    return list((job.get("status") or {}).get("conditions") or [])


def _finished(job: dict) -> dict | None:
    """The true ``Complete`` or ``Failed`` condition, if the job has one."""
    return next(
        (c for c in _conditions(job) if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), None
    )


class TrainJobLauncher:
    """Create (or re-attach to) one TrainJob, wait for it, and delete it."""

    def __init__(self, namespace: str | None = None, client=None, poll_s: float = 15.0, out=None):
        from kubernetes.client import CustomObjectsApi

        self.api = CustomObjectsApi(client or api_client())
        self.namespace = namespace or current_namespace()
        self.poll_s, self.out = poll_s, out

    def say(self, text: str) -> None:
        print(f"[trainjob] {text}", file=self.out or sys.stdout, flush=True)

    def run(self, job: dict, timeout_s: float, keep: bool = False) -> TrainJobResult:
        """Create ``job`` and wait until it completes; raise on failure or after ``timeout_s``."""
        name = job["metadata"]["name"]
        deadline = time.monotonic() + timeout_s
        try:
            reattached = self._create_or_attach(job, deadline)
            final = self._wait(name, timeout_s, deadline)
        finally:
            if not keep:
                self._delete(name)
        config = job_config(job)
        return TrainJobResult(
            name,
            self.namespace,
            final.get("status") or {},
            config.get("output_dir") or "",
            config.get("checkpoint_dir") or "",
            reattached,
        )

    def _call(self, what: str, method, *args, hints: dict | None = None, **kwargs):
        """One API call; an error becomes a TrainJobError saying what was being done (409 and 404 pass
        through when ``hints`` names them as expected, with the value ``None``)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return method(GROUP, VERSION, self.namespace, PLURAL, *args, _request_timeout=60, **kwargs)
        except ApiException as exc:
            hints = {
                403: f"; grant the pipeline's ServiceAccount access to trainjobs in {self.namespace} "
                f"(manifests/rbac.yaml)",
                **(hints or {}),
            }
            if exc.status in hints and hints[exc.status] is None:
                raise
            raise TrainJobError(f"{what}: HTTP {exc.status} {exc.reason}{hints.get(exc.status, '')}") from exc

    def _create_or_attach(self, job: dict, deadline: float) -> bool:
        """Create the job; on 409 take over the one an earlier attempt of this task created, unless it
        failed. One still being deleted (that attempt's cleanup) is waited out, then created anew."""
        from kubernetes.client.exceptions import ApiException

        name, where = job["metadata"]["name"], f"TrainJob {self.namespace}/{job['metadata']['name']}"
        while True:
            try:  # Strict: a field this Trainer version does not know is an error, not silently dropped
                self._call(
                    f"creating {where}",
                    self.api.create_namespaced_custom_object,
                    job,
                    field_validation="Strict",
                    hints={409: None, 404: " (is Kubeflow Trainer v2 installed?)"},
                )
                trainer = job["spec"]["trainer"]
                self.say(f"created {where}: {trainer['numNodes']} nodes x {trainer['numProcPerNode']} processes")
                return False
            except ApiException:  # 409: it exists
                pass
            try:
                existing = self._call(
                    f"reading {where}", self.api.get_namespaced_custom_object, name, hints={404: None}
                )
            except ApiException:  # 404: deleted since; create it again
                continue
            if not existing["metadata"].get("deletionTimestamp"):
                break
            if time.monotonic() > deadline:
                raise TrainJobTimeout(f"{where} from an earlier attempt is still being deleted")
            self.say(f"waiting for {where} from an earlier attempt to be deleted")
            time.sleep(self.poll_s)
        done = _finished(existing)
        if done and done["type"] == "Failed":
            raise TrainJobError(
                f"{where} (from an earlier attempt) already failed: {done.get('reason', '')}: {done.get('message', '')}"
            )
        self.say(
            f"re-attached to {where}, created {existing['metadata'].get('creationTimestamp', '?')} "
            f"by an earlier attempt of this task"
        )
        return True

    def _wait(self, name: str, timeout_s: float, deadline: float) -> dict:
        """Poll until Complete (returned) or Failed (raised), printing what changes; raise at the deadline."""
        from urllib3.exceptions import HTTPError

        where = f"TrainJob {self.namespace}/{name}"
        seen: set = set()
        job: dict = {}
        while True:
            try:
                job = self._call(
                    f"reading {where}",
                    self.api.get_namespaced_custom_object,
                    name,
                    hints={404: " (deleted while the launcher waited)"},
                )
            except (TrainJobError, HTTPError) as exc:  # a restarting API server: retry until the deadline
                status = getattr(exc.__cause__, "status", 0) or 0
                if isinstance(exc, TrainJobError) and status < 500 and status != 429:
                    raise
                self.say(f"API error, retrying: {exc}")
            self._report(job, seen)
            done = _finished(job)
            if done and done["type"] == "Complete":
                self.say(f"{name} complete")
                return job
            if done:
                raise TrainJobError(f"{where} failed: {done.get('reason', '')}: {done.get('message', '')}")
            left = deadline - time.monotonic()
            if left <= 0:
                state = ", ".join(f"{c.get('type')}={c.get('status')}" for c in _conditions(job)) or "no conditions"
                raise TrainJobTimeout(
                    f"{where} did not finish within {timeout_s:g} s ({state}); raise the "
                    f"launcher's timeout or check the job's pods"
                )
            time.sleep(min(self.poll_s, left))

    def _report(self, job: dict, seen: set) -> None:
        """Print each new condition and each change in the node jobs' counts, once."""
        for c in _conditions(job):
            key = ("condition", c.get("type"), c.get("status"), c.get("reason"))
            if key not in seen:
                seen.add(key)
                text = f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
                self.say(text.rstrip(": "))
        for j in (job.get("status") or {}).get("jobsStatus") or []:
            counts = " ".join(
                f"{k}={j[k]}" for k in ("active", "ready", "succeeded", "failed", "suspended") if j.get(k)
            )
            key = ("jobs", j.get("name"), counts)
            if counts and key not in seen:
                seen.add(key)
                self.say(f"jobs {j.get('name')}: {counts}")

    def _delete(self, name: str) -> None:
        """Delete the job, its pods first (Foreground: a retry that creates it anew finds no leftovers);
        never raises, since an error here must not hide the run's own."""
        try:
            self.api.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Foreground", _request_timeout=60
            )
            self.say(f"deleted {self.namespace}/{name}")
        except Exception as exc:  # 404 included: nothing to clean up
            status = getattr(exc, "status", None)
            if status != 404:
                self.say(f"could not delete {self.namespace}/{name} ({status or exc}); delete it by hand")


def launch_stage(
    stage: str,
    cfg,
    *,
    run_id: str,
    task: str,
    image: str,
    num_nodes: int,
    nproc_per_node: int,
    timeout_s: float,
    node: NodeResources | None = None,
    namespace: str | None = None,
    client=None,
    poll_s: float = 15.0,
    keep: bool = False,
    active_deadline_s: int | None = None,
    env: list[dict] | None = None,
) -> TrainJobResult:
    """Run the built config ``cfg`` of ``stage`` as a TrainJob named after ``run_id`` and ``task``; a local
    path where a node would read or write is refused first (:func:`check_locations`).

    In a KFP component: ``run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER``, ``task=dsl.PIPELINE_TASK_NAME_PLACEHOLDER``
    (the same for every retry of the task); ``client`` defaults to the pod's in-cluster credentials.
    """
    check_locations(cfg)
    job = build_trainjob(
        job_name(run_id, task),
        stage,
        config_text(cfg),
        image=image,
        num_nodes=num_nodes,
        nproc_per_node=nproc_per_node,
        node=node,
        env=env,
        active_deadline_s=active_deadline_s,
        annotations={"posttrain/run-id": run_id, "posttrain/task": task},
    )
    own = client is None
    client = client or api_client()
    try:
        return TrainJobLauncher(namespace, client=client, poll_s=poll_s).run(job, timeout_s, keep=keep)
    finally:
        if own:
            client.close()
