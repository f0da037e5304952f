"""nodes=N: the train component becomes a TrainJob launcher. The real kubernetes client (configured from a
kubeconfig, as outside a cluster) talks HTTP to a local fake of the Trainer API; inputs and outputs go
through the real local S3 server. The fake plays the nodes: on create it writes a trained model where the
job was told to, as `posttrain sft` on the nodes would."""

import json
import os

from kfp import dsl

from components.common import CUDA_IMAGE, GPU_TOLERATIONS
from components.train import train
from tests.http_helpers import serving
from tests.runner.test_trainjob import NS, TrainerApi, sent
from trainer_lib.engine.checkpoint import stable_checkpoint_dir
from trainer_lib.runner.stage_api import stage_config


class Nodes(TrainerApi):
    def __init__(self, model_dir):
        super().__init__(outcome="complete", gets_to_finish=2)
        self.model_dir = model_dir

    def create(self, job):
        from trainer_lib import storage
        from trainer_lib.runner.trainjob import job_config

        reply = super().create(job)
        output = job_config(job)["output_dir"]
        storage.upload_dir(self.model_dir, output)
        storage.write_text(f"{output}/summary.json", json.dumps({"stage": "sft", "steps": 2}))
        return reply


def test_nodes_launch_a_trainjob_reading_and_writing_the_object_store(
    tiny_model_dir, chat_jsonl, s3_bucket, tmp_path, monkeypatch
):
    from trainer_lib import storage

    storage.upload_dir(tiny_model_dir, f"s3://{s3_bucket}/models/tiny")
    storage.write_text(f"s3://{s3_bucket}/data/chat.jsonl", open(chat_jsonl).read())
    with serving(Nodes(tiny_model_dir)) as server:
        (tmp_path / "kubeconfig").write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [{"name": "local", "cluster": {"server": server.url}}],
                    "contexts": [{"name": "test", "context": {"cluster": "local", "user": "me", "namespace": NS}}],
                    "users": [{"name": "me", "user": {"token": "t"}}],
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
        monkeypatch.setenv("POSTTRAIN_TRAINJOB_POLL_S", "0.01")
        out = dsl.Model(uri=str(tmp_path / "out"))
        train.python_func(
            stage="sft",
            model=dsl.Model(uri=f"minio://{s3_bucket}/models/tiny"),
            data=dsl.Dataset(uri=f"minio://{s3_bucket}/data/chat.jsonl"),
            output_model=out,
            metrics=dsl.Metrics(uri=str(tmp_path / "metrics")),
            tensorboard=dsl.Artifact(uri=str(tmp_path / "tensorboard")),
            max_steps=2,
            nodes=2,
            gpus=4,
            checkpoint_root=f"minio://{s3_bucket}/root",
        )

    (created,) = [r.json() for r in sent(server, "POST")]
    trainer = created["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4
    assert trainer["command"] == ["posttrain", "sft", "--nproc", "4"]
    assert trainer["image"] == CUDA_IMAGE  # the train component's own build, CUDA torch
    # 4 GPUs' worth of the per-GPU host settings (components.common.PER_GPU), on GPU nodes, with /dev/shm;
    # the fake Trainer refused the job had the CRD's schema not allowed it (tests/manifests/crd_schema.py)
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "256Gi", "nvidia.com/gpu": "4"},
    }
    (patch,) = created["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == GPU_TOLERATIONS
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
    # the config the nodes read back from their one argument (`posttrain sft --nproc 4 --config-yaml TEXT`)
    assert trainer["args"][0] == "--config-yaml"
    cfg = stage_config("sft", [], trainer["args"][1])
    assert (cfg.model.path, cfg.data.path) == (f"s3://{s3_bucket}/models/tiny", f"s3://{s3_bucket}/data/chat.jsonl")
    assert cfg.max_steps == 2
    # the checkpoints where a retry of the task finds them; the job's output beside them
    assert cfg.checkpoint_dir == stable_checkpoint_dir(cfg, f"minio://{s3_bucket}/root", "sft")
    assert cfg.checkpoint_dir.startswith(f"s3://{s3_bucket}/root/checkpoints/sft-")
    assert cfg.output_dir == cfg.checkpoint_dir.replace("/checkpoints/", "/jobs/") + "/output"
    assert len(sent(server, "DELETE")) == 1  # the job does not hold its nodes after the step
    assert os.path.isfile(os.path.join(out.path, "model.safetensors")) and out.metadata["steps"] == 2
