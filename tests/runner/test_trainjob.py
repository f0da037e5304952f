"""The TrainJob launcher against a local HTTP server speaking Kubeflow Trainer's trainjobs API.

The real ``kubernetes`` client does real HTTP to the server below, which keeps jobs in memory and
moves their status on with every GET, like the Trainer controller would between polls.
"""

import collections
import re

import pytest

from tests.crd_fields import TRAINJOB_NAME
from tests.http_helpers import serving
from tests.manifests.crd_schema import trainjob_errors
from trainer_lib.errors import UserError
from trainer_lib.runner.kube import api_client
from trainer_lib.runner.stage_api import stage_config
from trainer_lib.runner.trainjob import (
    CONFIG_OPTION,
    PATCH_MANAGER,
    NodeResources,
    TrainJobError,
    TrainJobTimeout,
    build_trainjob,
    check_locations,
    job_config,
    job_name,
    launch_stage,
)

NS = "team-a"
PATH = re.compile(r"/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs(?:/([^/]+))?")
COMPLETE = {"type": "Complete", "status": "True", "reason": "JobsCompleted", "message": "all node jobs succeeded"}
FAILED = {"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "node-0 exited with code 1"}
RUNNING = {"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}


def status(code: int, reason: str, message: str) -> tuple[int, dict]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


class TrainerApi:
    """POST/GET/DELETE .../namespaces/<ns>/trainjobs[/<name>]. ``outcome``: what a job does after
    a few GETs: complete, fail or hang (run forever). A job the Trainer CRD's schema refuses gets 422, as with
    fieldValidation=Strict (unknown fields included)."""

    def __init__(self, outcome="complete", gets_to_finish=3, forbid_create=False, unavailable_on=()):
        self.outcome, self.gets_to_finish, self.forbid_create = outcome, gets_to_finish, forbid_create
        self.unavailable_on = set(unavailable_on)  # GET numbers answered 503, as by a restarting API server
        self.jobs: dict = {}
        self.gets = collections.Counter()
        self.deleting: dict = {}  # name -> GETs until a job with a deletionTimestamp is gone

    def add(self, name, status_=None, deleting_after=None):
        self.jobs[name] = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NS, "creationTimestamp": "2026-11-30T10:00:00Z"},
            "spec": {},
            "status": status_ or {},
        }
        if deleting_after:
            self.jobs[name]["metadata"]["deletionTimestamp"] = "2026-11-30T11:00:00Z"
            self.deleting[name] = deleting_after

    def handle(self, request):
        match = PATH.fullmatch(request.path)
        if not match or match.group(1) != NS:
            return status(404, "NotFound", f"no route {request.path}")
        name = match.group(2)
        if request.method == "POST" and name is None:
            return self.create(request.json())
        if name not in self.jobs:
            return status(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
        job = self.jobs[name]
        if request.method == "GET":
            self.gets[name] += 1
            if self.gets[name] in self.unavailable_on:
                return status(503, "ServiceUnavailable", "etcdserver: leader changed")
            if name in self.deleting and self.gets[name] >= self.deleting[name]:
                del self.jobs[name]
            else:
                self.advance(job, self.gets[name])
            return 200, job
        if request.method == "DELETE":
            del self.jobs[name]
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return status(405, "MethodNotAllowed", request.method)

    def create(self, job):
        if self.forbid_create:
            return status(403, "Forbidden", 'cannot create resource "trainjobs" in API group "trainer.kubeflow.org"')
        errors = trainjob_errors(job)
        if errors:
            return status(422, "Invalid", f"TrainJob.trainer.kubeflow.org is invalid: {errors}")
        name = job["metadata"]["name"]
        if name in self.jobs:
            return status(409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{name}" already exists')
        self.deleting.pop(name, None)
        job["metadata"].update(namespace=NS, creationTimestamp="2026-11-30T12:00:00Z")
        self.jobs[name] = job
        return 201, job

    def advance(self, job, gets):
        if (job.get("status") or {}).get("conditions"):
            return  # finished: stays as it is
        if self.outcome == "hang" or gets < self.gets_to_finish:
            job["status"] = RUNNING if gets > 1 else {}
        else:
            done = COMPLETE if self.outcome == "complete" else FAILED
            job["status"] = {"conditions": [done], "jobsStatus": [{"name": "node", "succeeded": 2}]}


def sent(server, method):
    return [r for r in server.requests if r.method == method]


CONFIG = {
    "model.path": "s3://models/base",
    "data.path": "s3://data/sft",
    "max_steps": 2000,
    "lr": 2e-5,
    "engine.zero_stage": 3,
    "engine.gradient_checkpointing": True,
    "lora.target_modules": ["q_proj", "v_proj"],
}
WHERE = {"output_dir": "s3://runs/42/sft", "checkpoint_dir": "s3://checkpoints/42/sft"}


def built(extra=None, where=WHERE):
    """The sft config a component would build: CONFIG, an override, ``extra``, then the two locations."""
    return stage_config("sft", [CONFIG, "seed=7", extra or {}, where])


def launch(server, extra=None, where=WHERE, **kwargs):
    """launch_stage as the runner calls it, against ``server``; the config is built first, as there."""
    options = dict(
        run_id="run-42",
        task="sft",
        image="ghcr.io/posttrain/posttrain:0.1.0",
        num_nodes=2,
        nproc_per_node=8,
        timeout_s=30,
        namespace=NS,
        client=api_client(server.url),
        poll_s=0.01,
    )
    options.update(kwargs)
    return launch_stage("sft", built(extra, where), **options)


def config_argument(job: dict) -> str:
    """The one argument that carries a job's config (after ``--config-yaml``)."""
    args = job["spec"]["trainer"]["args"]
    assert len(args) == 2 and args[0] == CONFIG_OPTION
    return args[1]


def test_job_names_are_stable_distinct_and_valid_labels():
    name = job_name("run-42", "sft")
    assert name == job_name("run-42", "sft") and name.startswith("posttrain-sft-")
    assert len({name, job_name("run-43", "sft"), job_name("run-42", "dpo")}) == 3
    for task in ("sft", "SFT (policy) / 3", "x" * 200, "---", "Ünïcode_Task"):
        made = job_name("4f1c9d7e-0000-4a57-b0a1-6e1f8b2c9a11", task)
        assert re.fullmatch(TRAINJOB_NAME, made) and len(made) <= 40, made


#: an 8-GPU node as components.common.training_node(8) makes it with the default settings
H100_NODE = NodeResources(
    gpus=8,
    cpu="64",
    memory="512Gi",
    shm="128Gi",
    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
)
#: the Trainer webhook's check of a runtimePatches manager (apimachinery's IsDomainPrefixedPath)
DOMAIN_PREFIXED = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[-A-Za-z0-9/._~!$&'()*+,;=:@%]+"


def build(node):
    return build_trainjob(
        "posttrain-sft-0", "sft", "max_steps: 2\n", image="i", num_nodes=2, nproc_per_node=8, node=node
    )


def test_what_a_node_holds_goes_where_the_trainer_takes_it():
    job = build(H100_NODE)
    assert trainjob_errors(job) == []
    assert job["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
        "limits": {"memory": "512Gi", "nvidia.com/gpu": "8"},  # no CPU limit: no throttled data workers
    }
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == PATCH_MANAGER and re.fullmatch(DOMAIN_PREFIXED, PATCH_MANAGER)
    # the job and container the torch-distributed runtime of Trainer v2.3.0 names "node" (the webhook
    # refuses names its runtime lacks, and env on that container: env stays in spec.trainer)
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Gi"}}]
    assert pod["containers"] == [{"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]

    cpu_only = build(NodeResources(cpu="4", memory="16Gi"))
    assert cpu_only["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"memory": "16Gi"},
    }
    assert "runtimePatches" not in cpu_only["spec"] and "resourcesPerNode" not in build(None)["spec"]["trainer"]


def test_the_schema_refuses_what_the_api_server_would():
    errors = trainjob_errors(build(NodeResources(gpus=8, memory="768 GiB")))
    assert any(e.startswith("spec.trainer.resourcesPerNode.limits.memory: '768 GiB' does not match") for e in errors)
    job = build(H100_NODE)  # a patch may not set the trainer container's resources: resourcesPerNode does
    (replicated,) = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    replicated["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    (error,) = trainjob_errors(job)
    assert "containers.0: Additional properties are not allowed ('resources' was unexpected)" in error
    with serving(TrainerApi()) as server:
        with pytest.raises(TrainJobError, match=r"creating TrainJob .*: HTTP 422"):
            launch(server, node=NodeResources(gpus=8, cpu="64 cores"))


def test_the_config_travels_as_one_argument_that_reads_back_as_the_same_config():
    with serving(TrainerApi("complete", gets_to_finish=1)) as server:
        launch(server)
    (post,) = sent(server, "POST")
    text = config_argument(post.json())
    assert stage_config("sft", [], text) == built()  # what a node's `posttrain sft --config-yaml TEXT` builds
    assert job_config(post.json())["lora"]["target_modules"] == ["q_proj", "v_proj"]


def test_any_object_store_every_node_reaches_will_do():
    where = {"output_dir": "gs://runs/42/sft", "checkpoint_dir": "az://checkpoints/42/sft"}
    cfg = built({"data.path": "hf://datasets/org/sft"}, where)
    check_locations(cfg)  # nothing refused
    assert (cfg.output_dir, cfg.data.path) == ("gs://runs/42/sft", "hf://datasets/org/sft")


def test_strings_yaml_would_misread_read_back_unchanged():
    tricky = {
        "model.path": "s3://b/a: b",
        "data.path": "s3://b/x #1",
        "storage.region": "123",
        "storage.endpoint_url": "[http://x",
        "model.tokenizer_path": "null",
    }
    with serving(TrainerApi("complete", gets_to_finish=1)) as server:
        launch(server, tricky)
    (post,) = sent(server, "POST")
    cfg = stage_config("sft", [], config_argument(post.json()))
    assert cfg == built(tricky)
    assert (cfg.model.path, cfg.data.path, cfg.storage.region, cfg.storage.endpoint_url) == (
        "s3://b/a: b",
        "s3://b/x #1",
        "123",
        "[http://x",
    )


@pytest.mark.parametrize(
    "where, config, message",
    [
        (
            {"output_dir": "/tmp/out", "checkpoint_dir": "s3://c"},
            {},
            "output_dir: a TrainJob writes to an object-store",
        ),
        ({"output_dir": "s3://o", "checkpoint_dir": "runs/ckpt"}, {}, "checkpoint_dir: a TrainJob writes"),
        (
            WHERE,
            {"data.path": "/home/me/sft.jsonl"},
            "data.path: '/home/me/sft.jsonl' is a path on the launcher's disk",
        ),
        ({"output_dir": "memory://o", "checkpoint_dir": "s3://c"}, {}, "output_dir: a TrainJob writes"),
        (
            WHERE,
            {"data.path": "file:///home/me/sft.jsonl"},
            "data.path: 'file:///home/me/sft.jsonl' is a path on the launcher's disk",
        ),
        (WHERE, {"max_stepz": 3}, "max_stepz"),
    ],
)
def test_bad_configs_fail_before_any_request(where, config, message):
    with serving(TrainerApi()) as server:
        with pytest.raises(UserError, match=re.escape(message)):
            launch(server, config, where)
        assert server.requests == []


def test_creates_the_trainjob_waits_for_complete_and_deletes_it(capsys):
    with serving(TrainerApi("complete", gets_to_finish=4)) as server:
        result = launch(server, node=NodeResources(gpus=8, cpu="64", memory="512Gi"), active_deadline_s=7200)
    (post,) = sent(server, "POST")
    job = post.json()
    assert post.path == f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"
    assert post.query.get("fieldValidation") == "Strict"
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["metadata"]["name"] == job_name("run-42", "sft") == result.name
    assert job["metadata"]["annotations"] == {"posttrain/run-id": "run-42", "posttrain/task": "sft"}
    assert job["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "kind": "ClusterTrainingRuntime",
        "apiGroup": "trainer.kubeflow.org",
    }
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    trainer = job["spec"]["trainer"]
    assert trainer["command"] == ["posttrain", "sft", "--nproc", "8"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
        "limits": {"memory": "512Gi", "nvidia.com/gpu": "8"},
    }
    assert "runtimePatches" not in job["spec"]  # no pod settings beyond resourcesPerNode's
    assert trainer["args"][0] == "--config-yaml"
    values = job_config(job)
    assert (values["output_dir"], values["checkpoint_dir"]) == ("s3://runs/42/sft", "s3://checkpoints/42/sft")
    assert (values["model"]["path"], values["lr"], values["seed"]) == ("s3://models/base", 2e-5, 7)
    refs = {e["name"]: e["valueFrom"] for e in trainer["env"] if "valueFrom" in e}
    assert refs["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "posttrain-s3"
    assert refs["AWS_ENDPOINT_URL"]["configMapKeyRef"]["name"] == "posttrain-config"
    assert refs["HF_TOKEN"]["secretKeyRef"] == {"name": "posttrain-hf", "key": "HF_TOKEN", "optional": True}
    assert trainjob_errors(job) == []

    assert [r.method for r in server.requests] == ["POST", "GET", "GET", "GET", "GET", "DELETE"]
    assert server.requests[-1].path.endswith(f"/trainjobs/{result.name}")
    assert server.requests[-1].query == {"propagationPolicy": "Foreground"}  # the pods go before the job
    assert result.status["conditions"][0]["type"] == "Complete" and not result.reattached
    assert (result.output_dir, result.checkpoint_dir, result.namespace) == (*WHERE.values(), NS)
    out = capsys.readouterr().out
    for line in (
        "created TrainJob team-a/posttrain-sft-",
        "jobs node: active=2 ready=2",
        "Complete=True JobsCompleted: all node",
        "deleted team-a/posttrain-sft-",
    ):
        assert line in out
    assert out.count("active=2 ready=2") == 1  # a change is printed once, not on every poll


def test_a_failed_job_raises_with_its_reason_and_is_deleted():
    with serving(TrainerApi("fail")) as server:
        with pytest.raises(TrainJobError, match="failed: FailedJobs: node-0 exited with code 1"):
            launch(server)
    assert [r.method for r in server.requests][-1] == "DELETE" and server.app.jobs == {}


def test_a_job_that_never_finishes_times_out_naming_the_job_and_is_deleted():
    with serving(TrainerApi("hang")) as server:
        with pytest.raises(
            TrainJobTimeout,
            match=f"TrainJob {NS}/{job_name('run-42', 'sft')} did not finish "
            r"within 0.3 s",
        ) as caught:
            launch(server, timeout_s=0.3)
    assert isinstance(caught.value, TimeoutError)
    assert len(sent(server, "GET")) >= 3 and sent(server, "DELETE") and server.app.jobs == {}


def test_an_api_server_hiccup_while_waiting_is_retried(capsys):
    with serving(TrainerApi("complete", gets_to_finish=4, unavailable_on=(2,))) as server:
        result = launch(server)
    assert result.status["conditions"][0]["type"] == "Complete"
    assert "API error, retrying: reading TrainJob team-a/posttrain-sft-" in capsys.readouterr().out


def test_a_retried_launcher_reattaches_instead_of_creating_a_second_job(capsys):
    api = TrainerApi("complete", gets_to_finish=3)
    api.add(job_name("run-42", "sft"), RUNNING)  # created by the launcher's first attempt
    with serving(api) as server:
        result = launch(server)
    assert result.reattached and result.status["conditions"][0]["reason"] == "JobsCompleted"
    assert [r.method for r in server.requests] == ["POST", "GET", "GET", "GET", "DELETE"]  # 409, then attach
    assert "re-attached to TrainJob team-a/posttrain-sft-" in capsys.readouterr().out


def test_reattaching_to_an_already_failed_job_raises_and_deletes_it():
    api = TrainerApi()
    api.add(job_name("run-42", "sft"), {"conditions": [FAILED]})
    with serving(api) as server:
        with pytest.raises(TrainJobError, match="from an earlier attempt.*already failed: FailedJobs"):
            launch(server)
    assert [r.method for r in server.requests] == ["POST", "GET", "DELETE"] and api.jobs == {}


def test_a_job_still_being_deleted_is_waited_out_then_created_anew():
    api = TrainerApi("complete", gets_to_finish=2)
    api.add(job_name("run-42", "sft"), {"conditions": [FAILED]}, deleting_after=2)
    with serving(api) as server:
        result = launch(server)
    assert not result.reattached
    assert [r.method for r in server.requests][:5] == ["POST", "GET", "POST", "GET", "POST"]
    assert sent(server, "DELETE")


def test_keep_leaves_the_job_and_forbidden_explains_the_rbac(capsys):
    with serving(TrainerApi("complete", gets_to_finish=1)) as server:
        launch(server, keep=True)
    assert not sent(server, "DELETE") and len(server.app.jobs) == 1

    with serving(TrainerApi(forbid_create=True)) as server:
        with pytest.raises(TrainJobError, match=r"HTTP 403 Forbidden; grant .* \(manifests/rbac.yaml\)"):
            launch(server)
    assert [r.method for r in server.requests] == ["POST", "DELETE"]  # cleanup is tried even so, quietly
    assert "could not delete" not in capsys.readouterr().out
