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
    """One task's container: its log streamed, its exit status returned. Replaces kfp.local's own (2.17),
    which starts the container with auto_remove and, when the container is gone before it asks for the exit
    status (a quick exit; always, with podman), reports success: a failed deploy passed as SUCCESS."""
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
        return int(container.wait()["StatusCode"])
    finally:
        container.remove(force=True)


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


def task_images(pipeline) -> dict[str, str]:
    """Each task of the pipeline (nested DAGs' included, by task name) and the image it runs in."""
    spec = pipeline.pipeline_spec
    executors = spec.deployment_spec["executors"]
    components = spec.components
    found: dict[str, str] = {}

    def walk(tasks) -> None:
        for name, task in tasks.items():
            component = components[task.component_ref.name]
            if component.executor_label:
                found[name] = executors[component.executor_label]["container"]["image"]
            elif component.HasField("dag"):
                walk(component.dag.tasks)

    walk(spec.root.dag.tasks)
    return found


def image_records(pipeline) -> dict:
    """What the run's containers ran: per image, the engine's image id and the image's own build record
    (/etc/posttrain/build.json: the commit it was built from), and per task, its image. Kept in run.json."""
    import docker

    tasks = task_images(pipeline)
    client = docker.from_env()
    try:
        images = {}
        for image in sorted(set(tasks.values())):
            built = client.containers.run(image, ["cat", "/etc/posttrain/build.json"], remove=True, network_mode="none")
            images[image] = {"id": client.images.get(image).id, "build": json.loads(built)}
    finally:
        client.close()
    return {"images": images, "tasks": tasks}
