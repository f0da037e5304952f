"""The deploy component (components/deploy.py) as the pipeline runs it: nothing when the gate failed,
else the stage's next version, with where it runs in the artifact's metadata."""

from __future__ import annotations

import os


def _artifacts(tmp_path, export_dir):
    from kfp.dsl import Artifact

    exported = Artifact(name="exported", uri=export_dir, metadata={"exported": True})
    repository = Artifact(name="repository", uri=str(tmp_path / "repository"), metadata={})
    return exported, repository


def test_a_failed_gate_deploys_nothing_even_with_an_export(export_dir, tmp_path, capsys):
    from components.deploy import deploy

    exported, repository = _artifacts(tmp_path, export_dir)
    deploy.python_func(exported=exported, repository=repository, gate_passed=False)
    assert repository.metadata == {"deployed": False}
    assert "the evaluation gate failed; nothing is deployed" in capsys.readouterr().out
    assert not os.path.exists(repository.path)


def test_a_passed_gate_publishes_the_fp16_variant_for_gpus(export_dir, tmp_path):
    from components.deploy import deploy

    exported, repository = _artifacts(tmp_path, export_dir)
    deploy.python_func(exported=exported, repository=repository, model_name="chat", variant="fp16", gate_passed=True)
    assert repository.metadata == {
        "deployed": True,
        "model_name": "chat",
        "version": 1,
        "variant": "fp16",
        "instance_kind": "gpu",
    }
    assert "KIND_GPU" in open(os.path.join(repository.path, "chat", "config.pbtxt"), encoding="utf-8").read()
