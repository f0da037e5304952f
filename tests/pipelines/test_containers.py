"""pipelines/containers.py and the container settings: what a task's container gets in a local run."""

from __future__ import annotations

import os

from kfp import local

from pipelines import settings
from pipelines.commands import get_pipeline
from pipelines.containers import run_on_cpu


def test_a_container_gets_the_pods_user_limits_network_cache_and_only_the_pods_variables(tmp_path):
    environ = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "HF_TOKEN": "",  # set but empty: not forwarded
        "GITHUB_TOKEN": "ghp_unrelated",  # the host's, never a pod's: stays out
        "HOME": "/root",
        "OMP_NUM_THREADS": "1",  # the host's thread cap, passed on
    }
    args = settings.container_run_args(environ, str(tmp_path), host_uid=0, host_gid=0)
    assert args["user"] == "1000:1000"  # root on the host: the image's own user
    assert settings.container_run_args(environ, str(tmp_path), 1234, 99)["user"] == "1234:99"
    env = args["environment"]
    assert env["AWS_ACCESS_KEY_ID"] == "AKIAEXAMPLE" and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert "GITHUB_TOKEN" not in env and "HF_TOKEN" not in env and "HOME" not in env
    assert env["PYTHONUNBUFFERED"] == "1" and env["POSTTRAIN_CACHE"] == "/cache/posttrain"
    assert env["OMP_NUM_THREADS"] == "1" and "MKL_NUM_THREADS" not in env
    assert env["HF_HOME"] == f"{settings.MODEL_CACHE_PATH}/huggingface"
    assert args["mounts"] == [
        {"Target": settings.MODEL_CACHE_PATH, "Source": str(tmp_path), "Type": "bind", "ReadOnly": False}
    ]
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in args["ulimits"]} == {
        "nofile": (20000, 20000),
        "nproc": (4096, 4096),
    }
    assert args["shm_size"] == "16g" and args["network_mode"] == "host"
    runner = local.DockerRunner(**args)  # kfp.local accepts every key
    assert runner.container_run_args["user"] == "1000:1000"


def test_cpu_only_points_gpu_tasks_at_the_cpu_image_in_memory_only():
    pipeline = get_pipeline("posttrain-sft")
    executors = pipeline.pipeline_spec.deployment_spec["executors"]
    before = {name: e["container"]["image"] for name, e in executors.items()}
    gpu = sorted(name for name, image in before.items() if image == settings.CUDA_IMAGE)
    assert gpu and any(image == settings.IMAGE for image in before.values())
    try:
        assert sorted(run_on_cpu(pipeline)) == gpu
        assert {e["container"]["image"] for e in executors.values()} == {settings.IMAGE}
    finally:  # the loaded pipeline is shared with the other tests of this process
        for name in gpu:
            executors[name]["container"]["image"] = settings.CUDA_IMAGE
    compiled = os.path.join(os.path.dirname(settings.__file__), "compiled", "posttrain-sft.yaml")
    with open(compiled, encoding="utf-8") as fh:
        assert settings.CUDA_IMAGE in fh.read()  # the compiled pipeline keeps its images


def test_every_task_of_every_pipeline_is_mapped_to_the_image_its_component_names():
    from components.common import BUILDS
    from pipelines.commands import pipelines

    for name in pipelines():
        tasks = task_images(get_pipeline(name))
        assert tasks, name
        for task, image in tasks.items():
            component = task.rsplit("-", 1)[0] if task.rsplit("-", 1)[-1].isdigit() else task
            assert image == BUILDS[component], (name, task, image)


def test_parameters_naming_local_paths_become_absolute_and_are_mounted(tmp_path, monkeypatch):
    from pipelines.containers import host_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text("{}\n")
    (tmp_path / "repository").mkdir()
    params = {
        "dataset": "data.jsonl",
        "model_repository": str(tmp_path / "repository"),
        "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",  # a hub id, not a path here
        "prompt_dataset": "s3://bucket/prompts.jsonl",
        "sft_max_steps": 5,
    }
    out, paths = host_paths(params)
    assert out["dataset"] == str(tmp_path / "data.jsonl") and out["sft_max_steps"] == 5
    assert out["base_model"] == params["base_model"] and out["prompt_dataset"] == params["prompt_dataset"]
    assert paths == sorted([str(tmp_path / "data.jsonl"), str(tmp_path / "repository")])


def task_images(pipeline) -> dict[str, str]:
    """Each task of the pipeline (nested DAGs' included, by task name) and the image it runs in."""
    spec = pipeline.pipeline_spec
    executors = spec.deployment_spec["executors"]
    found: dict[str, str] = {}

    def walk(tasks) -> None:
        for name, task in tasks.items():
            component = spec.components[task.component_ref.name]
            if component.executor_label:
                found[name] = executors[component.executor_label]["container"]["image"]
            elif component.HasField("dag"):
                walk(component.dag.tasks)

    walk(spec.root.dag.tasks)
    return found


def test_the_container_records_of_a_run_are_gathered_by_task_folder(tmp_path):
    import json

    from pipelines.containers import RECORD, container_records

    records = {"prepare": {"image": "a:1", "image_id": "sha256:1"}, "sft/train": {"image": "b:1", "image_id": "2"}}
    for task, record in records.items():
        (tmp_path / task).mkdir(parents=True)
        (tmp_path / task / RECORD).write_text(json.dumps(record))
        (tmp_path / task / "executor_output.json").write_text("{}")
    (tmp_path / "fingerprint").mkdir()  # a task folder without a record is not one
    assert container_records(str(tmp_path)) == records
