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


def docker_runner(pipeline_root: str, cache_dir: str):
    """The DockerRunner of a run under ``pipeline_root``. As root, the image's user (uid 1000) runs the
    tasks, so the run's folders become its own; as any other user, the tasks run under that user's uid."""
    from kfp import local

    os.makedirs(cache_dir, exist_ok=True)
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        for folder in (pipeline_root, cache_dir):
            os.chown(folder, settings.IMAGE_UID, settings.IMAGE_UID)
    return local.DockerRunner(**settings.container_run_args(dict(os.environ), cache_dir, uid, gid))


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
