"""Every pipeline compiles, deterministically, without heavy imports, to the committed IR."""

import os
import re
import subprocess
import sys

import pytest
import yaml

from components.common import CUDA_IMAGE, IMAGE, PER_GPU, VERSION, image_for
from components.resources import export_resources, training_resources
from pipelines import settings
from pipelines.commands import COMPILED_DIR, compile_all
from pipelines.dag import PIPELINES

HEAVY = ("torch", "transformers", "deepspeed", "datasets", "peft")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled")
    compile_all(str(out))
    return out


def test_compiled_ir_matches_the_committed_files(compiled):
    fresh = sorted(os.listdir(compiled))
    assert fresh == sorted(f"{name}.yaml" for name in PIPELINES)
    committed = sorted(f for f in os.listdir(COMPILED_DIR) if f.endswith(".yaml"))
    assert committed == fresh, "stale or missing files in pipelines/compiled/"
    for name in fresh:
        with open(os.path.join(COMPILED_DIR, name), "rb") as a, open(compiled / name, "rb") as b:
            assert a.read() == b.read(), f"{name} drifted: run 'posttrain pipeline compile' and commit it"


def test_compiling_is_deterministic_and_imports_no_heavy_modules(compiled, tmp_path):
    # another process, another hash seed: same bytes; and that process never imported torch
    code = (
        "import sys; from pipelines.commands import compile_all; compile_all(sys.argv[1]);"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"
    for name in os.listdir(compiled):
        assert (tmp_path / name).read_bytes() == (compiled / name).read_bytes()


def load(compiled, name):
    docs = list(yaml.safe_load_all((compiled / f"{name}.yaml").read_text()))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def test_sft_pipeline_interface(compiled):
    spec, _ = load(compiled, "posttrain-sft")
    params = spec["root"]["inputDefinitions"]["parameters"]
    for name in (
        "base_model",
        "dataset",
        "sft_max_steps",
        "sft_lr",
        "batch_size",
        "max_length",
        "seed",
        "sft_config_yaml",
        "sft_overrides",
    ):
        assert name in params
    assert params["base_model"]["defaultValue"] == "" and params["dataset"]["defaultValue"] == ""
    # every task runs inside the ExitHandler whose exit task notifies (so no pipeline outputs: KFP takes them
    # only from outside it)
    assert "outputDefinitions" not in spec["root"] and set(spec["root"]["dag"]["tasks"]) == {"exit-handler-1", "notify"}
    body = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    # SFT and what follows it are built twice: after a search (sft_search given) and without one, the default
    (branches,) = [
        spec["components"][t["componentRef"]["name"]] for t in body.values() if "condition-branches" in str(t)
    ]
    branch = {t["taskInfo"]["name"]: t["componentRef"]["name"] for t in branches["dag"]["tasks"].values()}
    assert set(branch) == {"SFT search", "no SFT search"}
    plain = spec["components"][branch["no SFT search"]]["dag"]["tasks"]
    tasks = {
        t["taskInfo"]["name"]: t for t in [*body.values(), *plain.values()] if "condition" not in str(t["taskInfo"])
    }
    assert set(tasks) == {
        "check config",
        "fingerprint sources",
        "training resources",
        "bootstrap",
        "prepare SFT data",
        "SFT",
        "export resources SFT",
        "export SFT",
        "deploy SFT",
    }  # named steps
    assert tasks["SFT"]["componentRef"]["name"] == "comp-train-2"
    assert tasks["SFT"]["inputs"]["parameters"]["stage"]["runtimeValue"]["constant"] == "sft"
    assert tasks["SFT"]["dependentTasks"] == ["prepare-2"]  # (bootstrap and the sizing: the branch's inputs)
    assert set(tasks["SFT"]["inputs"]["artifacts"]) == {"model", "data"}
    searched = spec["components"][branch["SFT search"]]["dag"]["tasks"]
    assert {t["taskInfo"]["name"] for t in searched.values()} == {*tasks, "tune SFT"} - set(
        t["taskInfo"]["name"] for t in body.values()
    )


#: what a training task's resources read: the outputs of the run's training-resources task
SIZED = "{{$.inputs.parameters['pipelinechannel--training-resources-%s']}}"
#: an export task's CPU and memory: the outputs of its own export-resources task (one per export)
EXPORT_SIZED = r"\{\{\$\.inputs\.parameters\['pipelinechannel--export-resources(-\d+)?-%s'\]\}\}"


def test_every_task_uses_the_shared_settings(compiled):
    for name in PIPELINES:
        spec, platform = load(compiled, name)
        executors = spec["deploymentSpec"]["executors"]
        k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
        for label, executor in executors.items():
            container = executor["container"]
            component = re.sub(r"-\d+$", "", label.removeprefix("exec-"))  # exec-prepare-2: a second prepare
            kind = settings.RESOURCES[settings.STAGE_KIND[component]]
            assert container["image"] == image_for(component) == (CUDA_IMAGE if kind.gpus else IMAGE), label
            assert not any("pip install" in part for part in container["command"])
            resources = container["resources"]
            if component in ("train", "tune", "evaluate"):  # follows the run's gpus_per_step and accelerator_type
                assert resources["resourceCpuRequest"] == SIZED % "cpu"
                assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"] == SIZED % "memory"
                assert resources["accelerator"] == {
                    "resourceCount": SIZED % "accelerators",
                    "resourceType": "{{$.inputs.parameters['pipelinechannel--accelerator_type']}}",
                }
            elif component == "export":  # follows the model's size, on one accelerator of the run's type
                assert re.fullmatch(EXPORT_SIZED % "cpu", resources["resourceCpuRequest"]), label
                assert re.fullmatch(EXPORT_SIZED % "memory", resources["resourceMemoryRequest"]), label
                assert resources["resourceMemoryLimit"] == resources["resourceMemoryRequest"]
                accelerator = resources["accelerator"]
                assert accelerator["resourceCount"] == "1", label
                assert accelerator["resourceType"] == "{{$.inputs.parameters['pipelinechannel--accelerator_type']}}"
            else:
                assert resources["resourceCpuRequest"] == kind.cpu
                assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"] == kind.memory
            if kind.gpus:
                assert k8s[label]["tolerations"] == settings.GPU_TOLERATIONS
                (shm,) = k8s[label]["emptyDirMounts"]
                assert (shm["mountPath"], shm["medium"]) == ("/dev/shm", "Memory")
            assert bool(kind.gpus) == (component in ("train", "tune", "evaluate", "export")), label
            assert k8s[label]["secretAsEnv"][0]["secretName"] == settings.S3_SECRET
            assert k8s[label]["configMapAsEnv"][0]["configMapName"] == settings.CONFIG_MAP
            assert settings.HF_SECRET in [secret["secretName"] for secret in k8s[label]["secretAsEnv"]]


def test_training_requests_scale_with_gpus_per_step(compiled):
    """The IR chain gpus_per_step -> training-resources -> each training task's requests, resolved as the KFP
    driver would for a few runs: CPU and memory grow with the GPUs, and every value is text (the driver
    reads a number-typed value as empty)."""
    runs = {}
    for gpus, nodes in ((1, 1), (2, 1), (8, 1), (8, 4)):
        outputs = training_resources.python_func(
            gpus=gpus, nodes=nodes, cpu_per_gpu=PER_GPU.cpu, memory_gi_per_gpu=PER_GPU.memory_gi
        )
        assert all(isinstance(value, str) for value in outputs)
        runs[gpus, nodes] = outputs._asdict()
    assert runs[1, 1] == {"cpu": "8", "memory": "64Gi", "accelerators": "1"}
    assert runs[2, 1] == {"cpu": "16", "memory": "128Gi", "accelerators": "2"}
    assert runs[8, 1] == {"cpu": "64", "memory": "512Gi", "accelerators": "8"}
    assert runs[8, 4] == {"cpu": "8", "memory": "64Gi", "accelerators": "0"}  # the TrainJob's nodes hold them

    for name in PIPELINES:
        spec, _ = load(compiled, name)
        (sizing,) = [task for component, task in _tasks(spec) if component == "training-resources"]
        given = sizing["inputs"]["parameters"]
        # (inside the ExitHandler every pipeline parameter reaches a task as the handler's input)
        assert given["gpus"] == {"componentInputParameter": "pipelinechannel--gpus_per_step"}
        assert given["nodes"] == {"componentInputParameter": "pipelinechannel--nodes_per_step"}
        assert given["cpu_per_gpu"]["runtimeValue"]["constant"] == PER_GPU.cpu
        assert given["memory_gi_per_gpu"]["runtimeValue"]["constant"] == PER_GPU.memory_gi
        trainings = [task for component, task in _tasks(spec) if component == "train"]
        assert trainings, name
        for task in trainings:
            for key in ("cpu", "memory", "accelerators"):
                channel = f"pipelinechannel--training-resources-{key}"
                produced = {"taskOutputParameter": {"outputParameterKey": key, "producerTask": "training-resources"}}
                # at the root from the task itself; inside a dsl.If branch as the branch's input
                assert task["inputs"]["parameters"][channel] in (produced, {"componentInputParameter": channel}), name


def test_export_memory_follows_the_trained_model(compiled):
    """Each export task is sized by its own export-resources task, from the parameter count of the training
    task whose model it exports: 12 bytes a parameter (over the measured peak of 2.5x the FP32 weights), at
    least the export's base memory, which is also what a model of unknown size (0) gets."""
    base = settings.RESOURCES["export"]
    sized = {
        n: export_resources.python_func(
            parameters=n, cpu=int(base.cpu), memory_gi_min=32, bytes_per_parameter=settings.EXPORT_BYTES_PER_PARAMETER
        )._asdict()
        for n in (0, 600_000, 8_030_261_248, 70_553_706_496)
    }
    assert sized[0] == sized[600_000] == {"cpu": "8", "memory": "32Gi"}
    assert sized[8_030_261_248] == {"cpu": "8", "memory": "90Gi"}  # Llama-3-8B: ceil(8.03e9 * 12 / 2**30)
    assert sized[70_553_706_496]["memory"] == "789Gi"
    assert base.memory == "32Gi"

    for name in PIPELINES:
        spec, _ = load(compiled, name)
        by_name = {task["taskInfo"]["name"]: task for _, task in _tasks(spec)}
        exports = [task for component, task in _tasks(spec) if component == "export"]
        assert exports, name
        for task in exports:
            label = task["taskInfo"]["name"].removeprefix("export ")
            sizing = by_name[f"export resources {label}"]["inputs"]["parameters"]
            producer = sizing["parameters"].get("taskOutputParameter") or {}
            if producer:  # at the root the training task's output; inside a branch, the branch's input
                assert producer["outputParameterKey"] == "parameters"
                assert re.fullmatch(r"train(-\d+)?", producer["producerTask"]), name
            else:
                assert "componentInputParameter" in sizing["parameters"], name


def test_images_are_the_two_builds_of_the_package_version():
    import tomllib

    root = os.path.dirname(COMPILED_DIR)
    with open(os.path.join(root, "..", "pyproject.toml"), "rb") as fh:
        assert tomllib.load(fh)["project"]["version"] == VERSION
    with open(os.path.join(root, "..", "Makefile"), encoding="utf-8") as fh:
        makefile = fh.read()
    name = re.search(r"^IMAGE_NAME\s*\?=\s*(\S+)", makefile, re.M).group(1)
    tag = re.search(r"^IMAGE_TAG\s*\?=\s*(\S+)", makefile, re.M).group(1)
    assert (IMAGE, CUDA_IMAGE) == (f"{name}:{tag}", f"{name}:{tag}-cu128")
    # what make image-cuda tags (image_build's TAG), cu128 unless CUDA_TAG says otherwise
    assert ",$(IMAGE_NAME):$(IMAGE_TAG)-$(CUDA_TAG)," in makefile and "\nCUDA_TAG ?= cu128\n" in makefile
    gpu_components = {c for c, kind in settings.STAGE_KIND.items() if settings.RESOURCES[kind].gpus}
    assert (
        gpu_components
        == {c for c, image in settings.BUILDS.items() if image == CUDA_IMAGE}
        == {"train", "tune", "evaluate", "export"}
    )
    assert set(settings.BUILDS) == set(settings.STAGE_KIND)


def test_settings_name_the_objects_the_manifests_create():
    root = os.path.join(os.path.dirname(COMPILED_DIR), "..", "manifests")
    kinds = {}
    for file in ("s3-secret.yaml", "configmap.yaml"):
        doc = yaml.safe_load(open(os.path.join(root, file)))
        kinds[doc["kind"]] = doc
    assert kinds["Secret"]["metadata"]["name"] == settings.S3_SECRET
    assert set(kinds["Secret"]["stringData"]) == set(settings.S3_SECRET_ENV)
    assert kinds["ConfigMap"]["metadata"]["name"] == settings.CONFIG_MAP
    assert set(settings.CONFIG_MAP_ENV) <= set(kinds["ConfigMap"]["data"])  # (the Triton Deployment reads more)


def test_a_component_without_settings_is_named(monkeypatch, tmp_path):
    from kfp import compiler, dsl

    from components.train import train

    monkeypatch.delitem(settings.STAGE_KIND, "train")
    with pytest.raises(ValueError, match="add component 'train' to STAGE_KIND"):

        @dsl.pipeline(name="broken")
        def broken(model: dsl.Input[dsl.Model], data: dsl.Input[dsl.Dataset]):
            settings.configure(train(stage="sft", model=model, data=data))

        compiler.Compiler().compile(broken, str(tmp_path / "broken.yaml"))


def _tasks(spec):
    """(component name, task) of every task in the IR, conditions and branches included."""
    dags = [spec["root"]] + [c for c in spec.get("components", {}).values() if "dag" in c]
    for dag in dags:
        for task in dag["dag"]["tasks"].values():
            if "componentRef" in task:
                yield re.sub(r"-\d+$", "", task["componentRef"]["name"].removeprefix("comp-")), task


def test_training_retries_and_nothing_that_publishes_is_cached(compiled):
    for name in PIPELINES:
        spec, _ = load(compiled, name)
        seen = set()
        for component, task in _tasks(spec):
            seen.add(component)
            if component == "train":
                assert task["retryPolicy"]["maxRetryCount"] == 3, name
                assert (
                    task["inputs"]["parameters"]["checkpoint_root"]["runtimeValue"]["constant"] == "{{$.pipeline_root}}"
                )  # checkpoints outside the artifact, found again by a retry
            never_cached = (
                "check-config",
                "fingerprint",
                "release",
                "deploy",
                "notify",
                "check-changes",
                "record-inputs",
            )
            if component in never_cached:
                assert not task.get("cachingOptions", {}).get("enableCache"), (name, component)
            if component == "bootstrap":  # keyed for the cache by what is behind the given locations now
                # (in the pipelines that release, from inside the branch taken when the inputs changed)
                assert task["inputs"]["parameters"]["sources_fingerprint"] in (
                    {"taskOutputParameter": {"outputParameterKey": "Output", "producerTask": "fingerprint"}},
                    {"componentInputParameter": "pipelinechannel--fingerprint-Output"},
                )
            elif (
                not component.startswith(("condition", "exit-handler")) and component not in never_cached
            ):  # (condition and exit-handler groups are not tasks of their own)
                assert task.get("cachingOptions", {}).get("enableCache") is True, (name, component)
        assert {"train", "export", "deploy"} <= seen, name


def test_cluster_settings_for_a_private_registry_and_a_shared_model_cache(monkeypatch, tmp_path):
    from kfp import compiler, dsl

    from pipelines.dag import carry_spec, posttrain_sft

    monkeypatch.setattr(settings, "IMAGE_PULL_SECRETS", ["registry-creds"])
    monkeypatch.setattr(settings, "MODEL_CACHE_PVC", "model-cache")
    path = tmp_path / "sft.yaml"
    # the settings are read while a DAG is traced: trace the SFT DAG again (only it, not every DAG)
    traced = carry_spec(dsl.pipeline(name="posttrain-sft")(posttrain_sft.pipeline_func))
    compiler.Compiler().compile(traced, str(path))
    spec, platform = list(yaml.safe_load_all(path.read_text()))
    for label, executor in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        assert [s["secretName"] for s in executor["imagePullSecret"]] == ["registry-creds"], label
        assert executor["pvcMount"][0]["mountPath"] == settings.MODEL_CACHE_PATH, label
    env = spec["deploymentSpec"]["executors"]["exec-train"]["container"]["env"]
    assert {"name": "HF_HOME", "value": "/cache/huggingface"} in env
