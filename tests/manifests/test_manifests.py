"""manifests/: every file parses, names its objects, and holds no real-looking secrets."""

import base64
import os
import re

import pytest
import yaml

from components.common import CUDA_IMAGE, image_for, training_node
from trainer_lib.serving.triton_image import IMAGE as TRITON_IMAGE

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "manifests")
#: every YAML file under manifests/, as a path relative to it (serving options live in subfolders)
FILES = sorted(
    os.path.relpath(os.path.join(d, f), ROOT)
    for d, _, names in os.walk(ROOT)
    for f in names
    if f.endswith((".yaml", ".yml"))
)
PLACEHOLDER = re.compile(r"^(REPLACE_ME|CHANGE_ME|<[^>]+>)?$")


def docs(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def test_there_are_manifests():
    assert {
        "kustomization.yaml",
        "s3-secret.yaml",
        "configmap.yaml",
        "serviceaccount.yaml",
        "rbac.yaml",
        "trainjob-sft.yaml",
        "triton/kustomization.yaml",
        "triton/triton.yaml",
        "kserve/kustomization.yaml",
        "kserve/inferenceservice.yaml",
        "kserve/serviceaccount.yaml",
        "kserve/s3-secret.yaml",
    } <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_every_object_has_api_version_kind_and_name(name):
    for doc in docs(name):
        assert isinstance(doc, dict)
        assert doc.get("apiVersion") and doc.get("kind"), name
        assert doc.get("metadata", {}).get("name"), f"{name}: {doc['kind']} without metadata.name"


@pytest.mark.parametrize("name", [f for f in FILES if os.path.basename(f) == "kustomization.yaml"])
def test_kustomization_lists_existing_files(name):
    (kustomization,) = docs(name)
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["resources"]
    for resource in kustomization["resources"]:
        assert os.path.isfile(os.path.join(ROOT, os.path.dirname(name), resource)), resource


def test_secrets_hold_only_placeholders():
    secrets = [d for name in FILES for d in docs(name) if d["kind"] == "Secret"]
    assert secrets
    for secret in secrets:
        values = dict(secret.get("stringData") or {})
        values.update({k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()})
        assert values
        for key, value in values.items():
            assert PLACEHOLDER.match(str(value)), f"{secret['metadata']['name']}.{key} looks like a real value"


def test_no_credentials_anywhere_in_manifests():
    for name in (os.path.join(d, f) for d, _, names in os.walk(ROOT) for f in names):
        text = open(name, encoding="utf-8").read()
        assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text), name  # AWS access key ids
        assert not re.search(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])", text), name  # secret keys
        assert "BEGIN PRIVATE KEY" not in text and "BEGIN RSA" not in text, name


def test_images_are_ours_training_and_serving():
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "image":
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for name in FILES:
        for doc in docs(name):
            walk(doc)
    # the TrainJob runs the CUDA build; Triton (manifests/triton) and KServe's predictor the serving image
    assert found and set(found) == {CUDA_IMAGE, TRITON_IMAGE}
    (service,) = docs("kserve/inferenceservice.yaml")
    model = service["spec"]["predictor"]["model"]
    assert model["image"] == TRITON_IMAGE and "runtimeVersion" not in model  # KServe would retag the image


def test_the_serving_pods_hold_a_gpu_for_fp16():
    (deployment, _) = docs("triton/triton.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (service,) = docs("kserve/inferenceservice.yaml")
    for resources in (container["resources"], service["spec"]["predictor"]["model"]["resources"]):
        assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == "1"


def test_trainjob_runs_posttrain_sft_with_the_shared_credentials():
    (job,) = docs("trainjob-sft.yaml")
    trainer = job["spec"]["trainer"]
    assert trainer["command"][:2] == ["posttrain", "sft"] and "--nproc" in trainer["command"]
    refs = {
        e["valueFrom"].get("secretKeyRef", e["valueFrom"].get("configMapKeyRef"))["name"]
        for e in trainer["env"]
        if "valueFrom" in e
    }
    assert refs == {"posttrain-s3", "posttrain-config"}
    assert all(
        arg.split("=", 1)[1].startswith("s3://")
        for arg in trainer["command"]
        if arg.startswith(("model.path=", "data.path=", "output_dir="))
    )


def test_trainjob_arguments_are_valid_sft_config():
    from trainer_lib.config import load_config
    from trainer_lib.stages.training.sft import CONFIG

    (job,) = docs("trainjob-sft.yaml")
    cfg = load_config(CONFIG, None, [a for a in job["spec"]["trainer"]["command"] if "=" in a])
    assert cfg.engine.zero_stage == 3 and cfg.output_dir.startswith("s3://")


def test_trainjob_nodes_hold_what_a_pipeline_step_gives_them():
    """The example's image, resources and pod patch are those the launcher builds for an 8-GPU node
    (components.common.training_node), so the two do not drift apart."""
    (job,) = docs("trainjob-sft.yaml")
    node = training_node(8)
    assert job["spec"]["trainer"]["image"] == image_for("train")
    assert job["spec"]["trainer"]["resourcesPerNode"] == node.resources()
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["trainingRuntimeSpec"] == node.runtime_patch()["trainingRuntimeSpec"]
