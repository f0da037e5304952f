"""release: lineage in release.json, a model card huggingface_hub reads, a version in a real MLflow registry."""

import hashlib
import json
import os
import subprocess

import pytest

from trainer_lib import storage
from trainer_lib.cli import main
from trainer_lib.loop.stage_record import LINEAGE_FILE, stage_record
from trainer_lib.release.lineage import build_info, combined_fingerprint
from trainer_lib.runner.stage_api import stage_config

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _model_dir(path, record=None):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"weights of " + path.name.encode())
    if record is not None:  # what a training stage leaves next to its model
        (path / LINEAGE_FILE).write_text(json.dumps(record))
    return str(path)


@pytest.fixture
def chain(tmp_path):
    """base (a hub cache snapshot with a licensed card) -> sft -> dpo, and sft -> reward; grpo from dpo
    with the reward model: each stage's lineage.json written by stage_record from its real config."""
    base = tmp_path / "hub" / "models--acme--tiny-base" / "snapshots" / REVISION
    _model_dir(base)
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny base\n")
    chat, prefs, prompts = tmp_path / "chat.jsonl", tmp_path / "prefs.jsonl", tmp_path / "prompts.jsonl"
    for path in (chat, prefs, prompts):
        path.write_text('{"text": "x"}\n')
    out = {name: str(tmp_path / name) for name in ("sft", "dpo", "reward", "grpo")}

    def train(stage, model, data, **keys):
        cfg = stage_config(stage, {"model.path": model, "data.path": str(data), "output_dir": out[stage], **keys})
        return _model_dir(tmp_path / stage, stage_record(cfg, stage))

    train("sft", str(base), chat, lr=2e-4)
    train("dpo", out["sft"], prefs, beta=0.2)
    train("reward", out["sft"], prefs)
    grpo = train(
        "grpo", out["dpo"], prompts, **{"reward.model_path": out["reward"], "reward.functions": ["code_execution"]}
    )
    return {"base": str(base), "chat": str(chat), "prefs": str(prefs), "model": grpo, **out}


def _evaluation(tmp_path, created="2026-12-02T20:00:00"):
    path = tmp_path / f"metrics-{created[-2:]}.json"
    rules = [
        {"rule": "task_pass_rate>=baseline-0.02", "value": 0.5, "threshold": 0.28, "passed": True},
        {"rule": "harmless_rate>=0.8", "value": 0.9, "threshold": 0.8, "passed": True},
    ]
    path.write_text(
        json.dumps(
            {
                "candidate": "grpo",
                "baseline": "sft",
                "models": {"grpo": {"task_pass_rate": 0.5, "harmless_rate": 0.9}, "sft": {"task_pass_rate": 0.3}},
                "gate": {"passed": True, "rules": rules},
                "paths": {"grpo": "/runs/grpo"},
                "created": created,
            }
        )
    )
    return str(path)


@pytest.fixture
def built(tmp_path, monkeypatch):
    """The image's build info, as images/Dockerfile writes it, and the digest the pod is given."""
    info = tmp_path / "build.json"
    info.write_text(json.dumps({"commit": "c0ffee" * 6 + "abcd", "dirty": "false", "image": "ghcr.io/p/p:0.1.0"}))
    monkeypatch.setenv("POSTTRAIN_BUILD_INFO", str(info))
    monkeypatch.setenv("POSTTRAIN_IMAGE_DIGEST", "sha256:" + "ab" * 32)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """One real local MLflow store (sqlite) for this module: its tables are made once."""
    return f"sqlite:///{tmp_path_factory.mktemp('registry') / 'mlflow.db'}"


def _release(chain, target, evaluation, *extra):
    sources = f"lineage.sources=[base_model={chain['base']},dataset={chain['chat']}]"
    args = ["release", f"model_path={chain['model']}", f"release_uri={target}", f"evaluation={evaluation}"]
    return main([*args, sources, "lineage.kfp_run_id=run-42", "model_name=coder", *extra])


def test_release_records_lineage_and_writes_a_model_card(chain, tmp_path, built):
    from huggingface_hub import ModelCard

    target = tmp_path / "released"
    assert _release(chain, target, _evaluation(tmp_path)) == 0
    lineage = json.loads((target / "release.json").read_text())["lineage"]

    base = lineage["base_model"]
    assert (base["hub_id"], base["revision"], base["license"]) == ("acme/tiny-base", REVISION, "apache-2.0")
    assert base["fingerprint"] == storage.fingerprint(chain["base"])
    assert lineage["data"] == {
        "dataset": {"location": chain["chat"], "fingerprint": storage.fingerprint(chain["chat"])}
    }
    by_hand = f"{chain['base']}={base['fingerprint']}\n{chain['chat']}={lineage['data']['dataset']['fingerprint']}"
    assert lineage["sources_fingerprint"] == hashlib.sha256(by_hand.encode()).hexdigest()  # the fingerprint step's

    stages = {s["stage"]: s for s in lineage["stages"]}
    assert list(stages) == ["sft", "dpo", "reward", "grpo"]  # sft once, though both dpo and reward start from it
    assert stages["sft"]["config"]["lr"] == 2e-4 and stages["dpo"]["config"]["beta"] == 0.2
    assert stages["grpo"]["inputs"]["reward.model_path"][0]["location"] == chain["reward"]
    assert stages["dpo"]["inputs"]["data.path"] == [
        {"location": chain["prefs"], "fingerprint": storage.fingerprint(chain["prefs"])}
    ]
    assert lineage["posttrain"]["commit"] == "c0ffee" * 6 + "abcd" and lineage["posttrain"]["dirty"] is False
    assert lineage["image"] == {"reference": "ghcr.io/p/p:0.1.0", "digest": "sha256:" + "ab" * 32}
    assert lineage["kfp"] == {"run_id": "run-42"}

    card = ModelCard.load(target / "README.md")
    assert (card.data.base_model, card.data.license, card.data.model_name) == ("acme/tiny-base", "apache-2.0", "coder")
    assert {"posttrain", "sft", "dpo", "reward", "grpo"} <= set(card.data.tags)
    assert {(r.metric_type, r.metric_value) for r in card.data.eval_results} == {
        ("task_pass_rate", 0.5),
        ("harmless_rate", 0.9),
    }
    assert "`harmless_rate>=0.8`: passed (value 0.9, threshold 0.8)" in card.text
    assert (target / "model.safetensors").read_bytes() == b"weights of grpo"


def test_a_local_run_takes_the_commit_from_the_working_tree(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_BUILD_INFO", str(tmp_path / "absent.json"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = build_info()
    assert info["commit"] == head and isinstance(info["dirty"], bool) and info["from"] == "git working tree"


def test_a_model_without_lineage_is_released_with_what_its_summary_says(tmp_path, built):
    model = tmp_path / "old"
    _model_dir(model)
    (model / "summary.json").write_text(json.dumps({"stage": "dpo", "steps": 7}))
    target = tmp_path / "released"
    args = ["release", f"model_path={model}", f"release_uri={target}", f"evaluation={_evaluation(tmp_path)}"]
    assert main(args) == 0
    (stage,) = json.loads((target / "release.json").read_text())["lineage"]["stages"]
    assert stage["stage"] == "dpo" and stage["summary"]["steps"] == 7 and stage["config"] is None


def test_release_registers_a_version_in_a_real_mlflow_registry(chain, tmp_path, built, mlflow_uri):
    from mlflow import MlflowClient

    uri = mlflow_uri
    target = tmp_path / "released"
    assert _release(chain, target, _evaluation(tmp_path), f"registry.mlflow_uri={uri}") == 0
    assert json.loads((target / "release.json").read_text())["registry"]["version"] == 1
    assert _release(chain, target, _evaluation(tmp_path), f"registry.mlflow_uri={uri}") == 0  # a retry: found again
    assert _release(chain, target, _evaluation(tmp_path, "2026-12-09T20:00:00"), f"registry.mlflow_uri={uri}") == 0

    versions = MlflowClient(tracking_uri=uri, registry_uri=uri).search_model_versions("name = 'coder'")
    assert sorted(int(v.version) for v in versions) == [1, 2]
    tags = versions[0].tags
    assert tags["posttrain.gate"] == "passed" and tags["posttrain.commit"] == "c0ffee" * 6 + "abcd"
    assert tags["posttrain.base_model"] == "acme/tiny-base" and tags["posttrain.base_revision"] == REVISION
    assert tags["posttrain.data.dataset"] == storage.fingerprint(chain["chat"])
    assert tags["posttrain.kfp.run_id"] == "run-42" and tags["posttrain.stages"] == "sft,dpo,reward,grpo"
    assert versions[0].source == str(target) and versions[0].description.startswith("---\nbase_model: acme/tiny-base")


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_registry_keeps_the_release_and_fails_the_stage(chain, tmp_path, built, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # (the stage's own default tries 3 times)
    uri = f"http://127.0.0.1:{_closed_port()}"
    target = tmp_path / "released"
    assert _release(chain, target, _evaluation(tmp_path), f"registry.mlflow_uri={uri}") == 2
    assert "published to" in capsys.readouterr().err
    record = json.loads((target / "release.json").read_text())
    assert "failed" in record["registry"]["error"] and (target / "README.md").is_file()
    assert _release(chain, target, _evaluation(tmp_path), f"registry.mlflow_uri={uri}", "registry.required=false") == 0
    assert "warning: registering coder in MLflow" in capsys.readouterr().err


def test_no_secret_reaches_the_release_its_card_or_the_registry_error(chain, tmp_path, built, monkeypatch, capsys):
    """The canary search over the new fields: credentials in the environment, in a config value and in the
    registry URI appear in no file of the release and in no output."""
    secret, password = "canary-secret-5b2d8e41f0", "canaryPassw0rd"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", "hf_canary0token9d1c4b7a")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    data = tmp_path / secret / "chat.jsonl"  # a config value that holds a credential (here: a path)
    data.parent.mkdir()
    data.write_text('{"text": "x"}\n')
    cfg = stage_config("sft", {"model.path": chain["base"], "data.path": str(data), "output_dir": "o"})
    model = _model_dir(tmp_path / "leaky", stage_record(cfg, "sft"))
    target = tmp_path / "released"
    args = ["release", f"model_path={model}", f"release_uri={target}", f"evaluation={_evaluation(tmp_path)}"]
    uri = f"http://user:{password}@127.0.0.1:{_closed_port()}/"
    assert main([*args, f"lineage.sources=[dataset={data}]", f"registry.mlflow_uri={uri}"]) == 2
    printed = capsys.readouterr()
    needles = (secret, password, "hf_canary0token9d1c4b7a")
    written = {p: p.read_text(errors="replace") for p in target.rglob("*") if p.is_file()}
    assert "***" in written[target / "release.json"]  # the credential was there, and was blanked
    assert not [(str(p), n) for p, text in written.items() for n in needles if n in text]
    assert not [n for n in needles if n in printed.out + printed.err]


def test_the_release_component_records_the_run_and_the_fingerprint_step_agrees(chain, tmp_path, built, mlflow_uri):
    """The KFP release step: the run's sources, fingerprinted as the pipeline's fingerprint step does
    (the same combined value), the run id, and a registry version."""
    from kfp import dsl

    from components.fingerprint import fingerprint
    from components.release import release

    results = tmp_path / "results"
    results.mkdir()
    (results / "metrics.json").write_text(open(_evaluation(tmp_path)).read())
    released = dsl.Model(uri=str(tmp_path / "released"))
    release.python_func(
        model=dsl.Model(uri=chain["model"]),
        results=dsl.Artifact(uri=str(results)),
        released=released,
        gate_passed=True,
        base_model=chain["base"],
        dataset=chain["chat"],
        run_id="0b1c",
        registry_uri=mlflow_uri,
        model_name="coder-kfp",
    )
    lineage = json.loads((tmp_path / "released" / "release.json").read_text())["lineage"]
    step = fingerprint.python_func(base_model=chain["base"], dataset=chain["chat"])
    assert lineage["sources_fingerprint"] == step and lineage["kfp"] == {"run_id": "0b1c"}
    assert released.metadata["registered_version"] == 1 and released.metadata["commit"] == "c0ffee" * 6 + "abcd"


def test_the_image_build_writes_the_build_info_the_lineage_reads(tmp_path, monkeypatch):
    """images/Dockerfile's build-info step, run as the build runs it (its build args in the environment)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "images", "Dockerfile"), encoding="utf-8") as fh:
        text = fh.read().replace("\\\n", "")
    (step,) = [
        line[4:] for line in text.splitlines() if line.startswith("RUN ") and "/etc/posttrain/build.json" in line
    ]
    args = {"POSTTRAIN_COMMIT": "f" * 40, "POSTTRAIN_DIRTY": "true", "POSTTRAIN_IMAGE": "ghcr.io/p/p:0.1.0"}
    step = step.replace("/etc/posttrain", str(tmp_path / "etc"))
    subprocess.run(["bash", "-c", step], env={**os.environ, **args}, check=True)
    monkeypatch.setenv("POSTTRAIN_BUILD_INFO", str(tmp_path / "etc" / "build.json"))
    monkeypatch.delenv("POSTTRAIN_IMAGE_DIGEST", raising=False)
    info = build_info()
    assert (info["commit"], info["dirty"], info["image"]) == ("f" * 40, True, "ghcr.io/p/p:0.1.0")
    assert info["built_at"].endswith("Z") and info["from"].startswith("image build info")


def test_without_given_sources_the_first_stage_names_the_base_model_and_data(chain, tmp_path, built):
    """As in a pipeline's release pod, where the base model is not on the machine: its fingerprint is the
    one the first stage recorded, and the data are every stage's inputs."""
    import shutil

    recorded = storage.fingerprint(chain["base"])
    shutil.rmtree(chain["base"])
    target = tmp_path / "released"
    args = ["release", f"model_path={chain['model']}", f"release_uri={target}", f"evaluation={_evaluation(tmp_path)}"]
    assert main(args) == 0
    lineage = json.loads((target / "release.json").read_text())["lineage"]
    assert lineage["base_model"]["fingerprint"] == recorded and lineage["base_model"]["hub_id"] == "acme/tiny-base"
    assert list(lineage["data"]) == ["sft:data.path", "dpo:data.path", "reward:data.path", "grpo:data.path"]
    assert lineage["data"]["sft:data.path"]["fingerprint"] == storage.fingerprint(chain["chat"])
    inputs = [lineage["base_model"], *lineage["data"].values()]  # the first stage's model, then every stage's data
    assert lineage["sources_fingerprint"] == combined_fingerprint([(i["location"], i["fingerprint"]) for i in inputs])


def test_a_malformed_source_is_refused_before_anything_is_published(chain, tmp_path, capsys):
    target = tmp_path / "released"
    args = ["release", f"model_path={chain['model']}", f"release_uri={target}", f"evaluation={_evaluation(tmp_path)}"]
    assert main([*args, f"lineage.sources={chain['chat']}"]) == 2
    assert "lineage.sources: " in capsys.readouterr().err and not target.exists()
