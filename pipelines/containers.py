"""A local pipeline run with every task in its container: ``posttrain pipeline run --runner docker``.

kfp.local's DockerRunner starts each task in the image the task names, through the Docker SDK: Docker, or
podman's Docker-compatible API (``podman system service``, ``DOCKER_HOST=unix://...``; docs/images.md).
The container's user, /dev/shm, limits, network, environment and cache are the settings a cluster's pods
get (:func:`pipelines.settings.container_run_args`), not a second list.
"""

from __future__ import annotations

import json
import os

from pipelines import settings


def docker_runner(pipeline_root: str, cache_dir: str, host_paths: list[str] = ()):
    """The DockerRunner of a run under ``pipeline_root``. As root, the image's user (uid 1000) runs the
    tasks, so the run's folders become its own; as any other user, the tasks run under that user's uid.
    ``host_paths`` (local files and folders the run's parameters name) are mounted at their own paths."""
    from kfp import local
    from kfp.local import docker_task_handler

    os.makedirs(cache_dir, exist_ok=True)
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        for folder in (pipeline_root, cache_dir):
            os.chown(folder, settings.IMAGE_UID, settings.IMAGE_UID)
    args = settings.container_run_args(dict(os.environ), cache_dir, uid, gid)
    mounted = [os.path.join(os.path.abspath(folder), "") for folder in (pipeline_root, cache_dir)]
    extra = [path for path in host_paths if not any(os.path.join(path, "").startswith(m) for m in mounted)]
    args["mounts"] += [{"Target": path, "Source": path, "Type": "bind", "ReadOnly": False} for path in extra]
    docker_task_handler.run_docker_container = run_container
    return local.DockerRunner(**args)


def run_container(client, image: str, command: list[str], volumes: dict, **run_args) -> int:
    """One task's container: its log streamed, its exit status returned, and what it ran recorded in the task's
    executor output folder (:func:`record_container`). Replaces kfp.local's own (2.17), which starts the container
    with auto_remove and, when the container is gone before it asks for the exit status (a quick exit; always,
    with podman), reports success: a failed deploy passed as SUCCESS."""
    image = image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"
    if not any(image in found.tags for found in client.images.list()):
        print(f"Pulling image {image!r}")
        client.images.pull(image)
    print(f"Found image {image!r}\n")
    container = client.containers.run(
        image=image, command=command, detach=True, stdout=True, stderr=True, volumes=volumes, **run_args
    )
    try:
        for line in container.logs(stream=True):
            print(line.decode(errors="replace"), end="")
        status = int(container.wait()["StatusCode"])
        record_container(container, image, command)
        return status
    finally:
        container.remove(force=True)


#: The file beside a task's executor_output.json that says what the task's container ran.
RECORD = "container.json"
#: Where images/Dockerfile writes the image's build record (the commit it was built from).
BUILD_INFO = "/etc/posttrain/build.json"


def record_container(container, image: str, command: list[str]) -> str | None:
    """Write ``container.json`` beside the task's executor_output.json (the folder KFP's executor input names):
    the image's tag, the id of the image the container ran, and that container's own /etc/posttrain/build.json.
    KFP's ExecutorOutput message has no free-form field, so the record is a file of the task's output folder.
    A command that is no KFP task (no ``--executor_input``) has no such folder: nothing is written."""
    if "--executor_input" not in command:
        return None
    import io
    import tarfile

    import docker

    executor_input = json.loads(command[command.index("--executor_input") + 1])
    folder = os.path.dirname(executor_input["outputs"]["outputFile"])
    try:
        stream, _ = container.get_archive(BUILD_INFO)
    except docker.errors.NotFound:
        raise RuntimeError(f"image {image} has no {BUILD_INFO}: not a build of images/Dockerfile") from None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        build = json.load(tar.extractfile(os.path.basename(BUILD_INFO)))
    record = {"image": image, "image_id": container.attrs["Image"], "build": build}
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, RECORD)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2)
    return path


def container_records(run_dir: str) -> dict[str, dict]:
    """The records of a run's tasks (:func:`record_container`), by task folder under ``run_dir``. Kept in
    run.json."""
    found = {}
    for folder, _, files in sorted(os.walk(run_dir)):
        if RECORD in files:
            with open(os.path.join(folder, RECORD), encoding="utf-8") as fh:
                found[os.path.relpath(folder, run_dir)] = json.load(fh)
    return found


def host_paths(params: dict) -> tuple[dict, list[str]]:
    """The run's parameters with each value that names an existing local file or folder made absolute, and
    those paths (what --runner docker mounts into every task; a relative path means nothing there)."""
    out, paths = dict(params), []
    for key, value in params.items():
        if isinstance(value, str) and value and "://" not in value and os.path.exists(value):
            out[key] = os.path.abspath(value)
            paths.append(out[key])
    return out, sorted(set(paths))


def run_on_cpu(pipeline) -> list[str]:
    """Point the tasks that name the CUDA build at the CPU build (a machine without a GPU); returns the
    executors changed. Rewrites the loaded pipeline's spec in place, never the compiled files."""
    changed = []
    for name, executor in pipeline.pipeline_spec.deployment_spec["executors"].items():
        container = executor["container"]
        if container["image"] == settings.CUDA_IMAGE:
            container["image"] = settings.IMAGE
            changed.append(name)
    return changed
