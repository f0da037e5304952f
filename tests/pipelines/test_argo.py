"""The Argo WorkflowTemplates: valid against Argo's schema, and the same DAG as the KFP IR they come from.

No Argo controller runs here (no Kubernetes), so the templates are checked statically: against the JSON
schema Argo publishes (every object closed, so a misspelled field fails), for references that resolve,
and step by step against the KFP IR, each side read from its own compiled output. One step's command
runs as a local process, as a container would run it.
"""

import copy
import functools
import gzip
import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest
import yaml

from pipelines import argo
from pipelines.commands import ARGO_SUBDIR, COMPILED_DIR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "argo_schema", "schema.json.gz")
PIPELINE_NAMES = ["posttrain-all", "posttrain-dpo", "posttrain-rlhf", "posttrain-sft"]
KFP_TYPES = {
    "STRING": str,
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": float,
    "BOOLEAN": json.loads,
    "LIST": json.loads,
    "STRUCT": json.loads,
}


@functools.lru_cache(maxsize=1)
def validator() -> jsonschema.Draft7Validator:
    """Argo's schema for a WorkflowTemplate, with every object definition closed to unknown fields."""
    with gzip.open(SCHEMA, "rt", encoding="utf-8") as fh:
        schema = json.load(fh)
    for definition in schema["definitions"].values():
        if definition.get("type") == "object" and "properties" in definition:
            definition.setdefault("additionalProperties", False)
    schema = {
        "definitions": schema["definitions"],
        "$ref": "#/definitions/io.argoproj.workflow.v1alpha1.WorkflowTemplate",
    }
    return jsonschema.Draft7Validator(schema)


def kfp_ir(name: str) -> tuple[dict, dict]:
    with open(os.path.join(COMPILED_DIR, f"{name}.yaml"), encoding="utf-8") as fh:
        spec, *rest = list(yaml.safe_load_all(fh))
    return spec, (rest[0] if rest else {})


def argo_file(name: str) -> dict:
    with open(os.path.join(COMPILED_DIR, ARGO_SUBDIR, f"{name}.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def schema_errors(template: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator().iter_errors(template)]


# --------------------------------------------------------------------------- the two sides, read back


def kfp_steps(spec: dict) -> dict:
    """``{(dag, task): step}`` for every container task of the IR, ``dag`` being '' for the root."""
    executors = spec["deploymentSpec"]["executors"]
    steps = {}
    dags = {"": spec["root"], **{k: v for k, v in spec["components"].items() if "dag" in v}}
    for dag_name, dag in dags.items():
        for task_name, task in dag["dag"]["tasks"].items():
            component = spec["components"][task["componentRef"]["name"]]
            if "executorLabel" not in component:
                continue
            container = executors[component["executorLabel"]]["container"]
            res = container.get("resources", {})
            accelerator = res.get("accelerator", {})
            resources = {
                "cpu": res.get("resourceCpuRequest"),
                "memory_request": res.get("resourceMemoryRequest"),
                "memory_limit": res.get("resourceMemoryLimit"),
                "accelerator": accelerator.get("resourceType"),
                "accelerator_count": accelerator.get("resourceCount"),
            }
            policy = task.get("retryPolicy")
            steps[(dag_name.removeprefix("comp-"), task_name)] = {
                "image": container["image"],
                "function": container["args"][container["args"].index("--function_to_execute") + 1],
                "source": container["command"][-1],
                "retries": policy and (policy["maxRetryCount"], policy["backoffDuration"], policy["backoffFactor"]),
                "max_backoff": policy and policy["backoffMaxDuration"],
                "resources": {k: v for k, v in resources.items() if v},
                "after": sorted(task.get("dependentTasks", [])),
            }
    return steps


def kfp_placeholders(value: str) -> str:
    """Argo's ``{{inputs.parameters.x}}`` back in KFP's spelling, to compare resource values."""
    return re.sub(r"\{\{inputs\.parameters\.([^}]+)\}\}", r"{{$.inputs.parameters['\1']}}", value)


def argo_steps(template: dict) -> dict:
    """``{(dag, task): step}`` for every task of the WorkflowTemplate that runs a container."""
    by_name = {t["name"]: t for t in template["spec"]["templates"]}
    steps = {}
    for dag_name, dag in by_name.items():
        if "dag" not in dag:
            continue
        for task in dag["dag"]["tasks"]:
            target = by_name[task["template"]]
            if "container" not in target:
                continue
            container = target["container"]
            after = sorted(task.get("dependencies", []))
            if dag_name == argo.EXIT_TEMPLATE:  # onExit: after the task whose final status it reports
                status = container["args"][container["args"].index("--final-status") + 1 :]
                after = status[4].split(",")
            res = copy.deepcopy(container.get("resources", {}))
            if "podSpecPatch" in target:
                (patched,) = json.loads(target["podSpecPatch"])["containers"]
                assert patched["name"] == "main"
                res = patched["resources"]
            requests, limits = res.get("requests", {}), dict(res.get("limits", {}))
            limits.pop("cpu", None)
            memory_limit = limits.pop("memory", None)
            (accelerator, count), *_ = list(limits.items()) or [(None, None)]
            resources = {
                "cpu": requests.get("cpu"),
                "memory_request": requests.get("memory"),
                "memory_limit": memory_limit,
                "accelerator": accelerator and kfp_placeholders(accelerator),
                "accelerator_count": count and kfp_placeholders(count),
            }
            retry = target.get("retryStrategy")
            steps[("" if dag_name in (argo.ROOT_TEMPLATE, argo.EXIT_TEMPLATE) else dag_name, task["name"])] = {
                "image": container["image"],
                "function": container["args"][container["args"].index("--function_to_execute") + 1],
                "source": container["command"][-1],
                "retries": retry
                and (int(retry["limit"]), retry["backoff"]["duration"], float(retry["backoff"]["factor"])),
                "max_backoff": retry and retry["backoff"]["maxDuration"],
                "resources": {k: kfp_placeholders(v) for k, v in resources.items() if v},
                "after": after,
            }
    return steps


# --------------------------------------------------------------------------- the committed pipelines


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_workflow_template_validates_against_argo_schema(name):
    template = argo_file(name)
    assert template["kind"] == "WorkflowTemplate" and template["metadata"]["name"] == name
    assert schema_errors(template) == []
    broken = copy.deepcopy(template)
    broken["spec"]["templates"][-1]["retryStrategy"] = {"limitt": "3"}  # the closed schema catches a typo
    assert schema_errors(broken)


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_committed_argo_files_are_the_translation_of_the_committed_ir(name):
    fresh = argo.dump(argo.translate_file(os.path.join(COMPILED_DIR, f"{name}.yaml")))
    with open(os.path.join(COMPILED_DIR, ARGO_SUBDIR, f"{name}.yaml"), encoding="utf-8") as fh:
        committed = fh.read()
    assert committed.split("\n", 1)[1] == fresh, f"run 'posttrain pipeline compile' ({name} drifted)"


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_argo_and_kfp_agree_on_steps_images_commands_retries_resources(name):
    spec, _ = kfp_ir(name)
    ours, theirs = argo_steps(argo_file(name)), kfp_steps(spec)
    assert sorted(ours) == sorted(theirs)
    for key, step in theirs.items():
        assert ours[key] == step, key
    assert any(s["retries"] for s in theirs.values()) and any("accelerator" in s["resources"] for s in theirs.values())


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_parameters_and_defaults_are_the_kfp_pipelines(name):
    spec, _ = kfp_ir(name)
    kfp_params = spec["root"]["inputDefinitions"]["parameters"]
    argo_params = {p["name"]: p for p in argo_file(name)["spec"]["arguments"]["parameters"]}
    assert set(argo_params) == set(kfp_params) | set(argo.ARGO_ONLY_PARAMETERS)
    for key, param in kfp_params.items():
        if "defaultValue" not in param:
            assert "value" not in argo_params[key]
            continue
        value = KFP_TYPES[param["parameterType"]](argo_params[key]["value"])
        assert (
            value == param["defaultValue"]
            and type(value) is type(param["defaultValue"])
            or (param["parameterType"] == "NUMBER_INTEGER" and value == int(param["defaultValue"]))
        ), key


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_check_config_runs_first_and_every_reference_resolves(name):
    template = argo_file(name)
    by_name = {t["name"]: t for t in template["spec"]["templates"]}
    root = {t["name"]: t for t in by_name[argo.ROOT_TEMPLATE]["dag"]["tasks"]}
    if not any(by_name[t["template"]].get("container") and t["name"] == "check-config" for t in root.values()):
        (handler,) = [t for t in root.values() if "dag" in by_name[t["template"]]]  # inside dsl.ExitHandler
        root = {t["name"]: t for t in by_name[handler["template"]]["dag"]["tasks"]}

    def ancestors(task):
        found = set(root[task].get("dependencies", []))
        for parent in list(found):
            found |= ancestors(parent)
        return found

    assert "dependencies" not in root["check-config"]
    assert all("check-config" in ancestors(t) for t in root if t != "check-config")
    # every {{inputs.parameters.x}} of a template is an input of it; every task output it reads is declared
    for tmpl in template["spec"]["templates"]:
        declared = {p["name"] for p in tmpl.get("inputs", {}).get("parameters", [])}
        body = json.dumps({k: v for k, v in tmpl.items() if k != "inputs"})
        assert set(re.findall(r"\{\{inputs\.parameters\.([^}]+)\}\}", body)) <= declared, tmpl["name"]
        tasks = {t["name"]: t for t in tmpl.get("dag", {}).get("tasks", [])}
        for task, kind, key in re.findall(r"\{\{tasks\.([^.]+)\.outputs\.(parameters|artifacts)\.([^}]+)\}\}", body):
            produced = by_name[tasks[task]["template"]].get("outputs", {}).get(kind, [])
            assert key in {p["name"] for p in produced}, (tmpl["name"], task, key)
        for task in tasks.values():  # each task supplies every input its template requires
            target = by_name[task["template"]].get("inputs", {})
            given = {kind: {a["name"] for a in task.get("arguments", {}).get(kind, [])} for kind in target}
            for kind, declared_inputs in target.items():
                required = {i["name"] for i in declared_inputs if "default" not in i and not i.get("optional")}
                assert required <= given[kind] <= {i["name"] for i in declared_inputs}, (tmpl["name"], task["name"])
        workflow_params = {p["name"] for p in template["spec"]["arguments"]["parameters"]}
        assert set(re.findall(r"\{\{workflow\.parameters\.([^}]+)\}\}", body)) <= workflow_params


# --------------------------------------------------------------------------- a pipeline with an exit handler


TINY = """
from kfp import compiler, dsl
from kfp.dsl import Dataset, Input, Output


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def make(text: str, rows: Output[Dataset]) -> int:
    with open(rows.path, "w") as fh:
        fh.write(text)
    rows.metadata["chars"] = len(text)
    return len(text)


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def count(rows: Input[Dataset], factor: int = 2) -> int:
    return rows.metadata["chars"] * factor + len(open(rows.path).read())


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def report(status: dsl.PipelineTaskFinalStatus, webhook: str = "") -> str:
    return f"{status.state} {status.error_message}"


@dsl.pipeline(name="tiny-exit")
def tiny(text: str = "hello", webhook: str = "", long: bool = True):
    done = report(webhook=webhook)
    with dsl.ExitHandler(done, name="run"):
        made = make(text=text).set_retry(num_retries=2, backoff_duration="5s", backoff_max_duration="60s")
        with dsl.If(made.outputs["Output"] > 3):
            with dsl.If(long == True):  # noqa: E712
                count(rows=made.outputs["rows"]).set_cpu_request("2").set_memory_limit("1Gi")


compiler.Compiler().compile(tiny, __import__("sys").argv[1])
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "tiny.py").write_text(TINY)
    subprocess.run([sys.executable, str(folder / "tiny.py"), str(folder / "tiny.yaml")], check=True, cwd=REPO)
    return argo.translate_file(str(folder / "tiny.yaml")), kfp_ir_file(folder / "tiny.yaml")


def kfp_ir_file(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def run_step(template: dict, io_root, values: dict) -> subprocess.CompletedProcess:
    """Run a container template's command and arguments as a local process, as its pod would, with
    Argo's placeholders filled in from ``values`` (else the input's default)."""
    defaults = {p["name"]: p.get("default") for p in template.get("inputs", {}).get("parameters", [])}
    filled = {**defaults, **values}

    def fill(arg: str) -> str:
        arg = re.sub(r"\{\{inputs\.parameters\.([^}]+)\}\}", lambda m: str(filled[m.group(1)]), arg)
        arg = re.sub(r"\{\{(workflow\.[^}]+)\}\}", lambda m: str(filled[m.group(1)]), arg)
        return str(io_root) if arg == argo.IO_ROOT else arg

    container = template["container"]
    command = [fill(a) for a in container["command"] + container["args"]]
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHONPATH": REPO}
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    env.pop("POSTTRAIN_KFP_API", None)
    return subprocess.run(command, cwd=io_root, env=env, capture_output=True, text=True, timeout=120)


def test_exit_handler_conditions_and_artifacts_of_a_small_pipeline(tiny):
    template, spec = tiny
    assert schema_errors(template) == []
    by_name = {t["name"]: t for t in template["spec"]["templates"]}
    assert template["spec"]["onExit"] == argo.EXIT_TEMPLATE
    (notify,) = by_name[argo.EXIT_TEMPLATE]["dag"]["tasks"]
    assert notify["template"] == "report" and "dependencies" not in notify
    assert "report" not in {t["name"] for t in by_name[argo.ROOT_TEMPLATE]["dag"]["tasks"]}
    report_args = by_name["report"]["container"]["args"]
    assert report_args[report_args.index("--final-status") + 1 :][:5] == [
        "status",
        "{{workflow.status}}",
        "{{workflow.failures}}",
        "{{workflow.name}}",
        "exit-handler-1",
    ]
    whens = sorted(
        t["when"] for tmpl in template["spec"]["templates"] for t in tmpl.get("dag", {}).get("tasks", []) if "when" in t
    )
    assert whens == [
        "'{{inputs.parameters.pipelinechannel--long}}' == 'true'",
        "{{tasks.make.outputs.parameters.Output}} > 3",  # a number: compared bare
    ]
    assert by_name["make"]["retryStrategy"] == {
        "limit": "2",
        "retryPolicy": "Always",
        "backoff": {"duration": "5s", "factor": "2", "maxDuration": "60s"},
    }
    assert by_name["count"]["container"]["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}
    assert argo_steps(template) == kfp_steps(spec)


def test_steps_run_as_a_container_would_and_pass_artifacts_with_metadata(tiny, tmp_path):
    template, _ = tiny
    by_name = {t["name"]: t for t in template["spec"]["templates"]}
    (tmp_path / "make").mkdir()
    made = run_step(by_name["make"], tmp_path / "make", {"text": "hello"})
    assert made.returncode == 0, made.stderr
    out = tmp_path / "make" / "outputs"
    assert (out / "parameters" / "Output").read_text() == "5"
    assert (out / "rows" / "data").read_text() == "hello"
    assert json.loads((out / "rows" / "metadata.json").read_text()) == {"chars": 5}
    # what Argo's artifact repository hands the next pod: the output folder as its input artifact
    (tmp_path / "count" / "inputs").mkdir(parents=True)
    (out / "rows").rename(tmp_path / "count" / "inputs" / "rows")
    counted = run_step(by_name["count"], tmp_path / "count", {"factor": "3"})
    assert counted.returncode == 0, counted.stderr
    assert (tmp_path / "count" / "outputs" / "parameters" / "Output").read_text() == str(5 * 3 + 5)
    (tmp_path / "report").mkdir()
    failures = '[{"displayName": "make", "message": "Error (exit code 1)", "phase": "Failed"}]'
    values = {"workflow.status": "Failed", "workflow.failures": failures, "workflow.name": "tiny-exit-abc12"}
    reported = run_step(by_name["report"], tmp_path / "report", values)
    assert reported.returncode == 0, reported.stderr
    assert (tmp_path / "report" / "outputs" / "parameters" / "Output").read_text() == f"FAILED {failures}"


def test_a_posttrain_step_runs_from_its_argo_command(tmp_path):
    """The ``training-resources`` step of posttrain-sft, run by the command its Argo template gives a pod."""
    templates = argo_file("posttrain-sft")["spec"]["templates"]
    (task,) = [t for d in templates for t in d.get("dag", {}).get("tasks", []) if t["name"] == "training-resources"]
    constants = {p["name"]: p["value"] for p in task["arguments"]["parameters"] if "{{" not in p["value"]}
    assert set(constants) == {"cpu_per_gpu", "memory_gi_per_gpu"}  # pipelines/settings.py's PER_GPU
    by_name = {t["name"]: t for t in templates}
    result = run_step(by_name["training-resources"], tmp_path, {**constants, "gpus": "2", "nodes": "1"})
    assert result.returncode == 0, result.stderr
    outputs = {p.name: p.read_text() for p in (tmp_path / "outputs" / "parameters").iterdir()}
    from pipelines.settings import PER_GPU

    assert outputs == {
        "cpu": PER_GPU.for_gpus(2)["cpu"],
        "memory": PER_GPU.for_gpus(2)["memory"],
        "accelerators": "2",
    }


def test_compile_target_argo_writes_templates_and_check_catches_drift(tmp_path, capsys):
    from pipelines.commands import main

    assert main(["compile", "--target", "argo", "--out", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == [ARGO_SUBDIR]  # only the Argo templates, no KFP IR
    assert sorted(os.listdir(tmp_path / ARGO_SUBDIR)) == [f"{n}.yaml" for n in PIPELINE_NAMES]
    drifted = tmp_path / ARGO_SUBDIR / "posttrain-sft.yaml"
    drifted.write_text(drifted.read_text().replace("retryPolicy: Always", "retryPolicy: OnError"))
    (tmp_path / ARGO_SUBDIR / "posttrain-gone.yaml").write_text("kind: WorkflowTemplate\n")
    assert main(["compile", "--check", "--target", "argo", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    # the untouched templates compare equal: only the edited and the extra file are reported
    assert err.count("out of date") == 2 and f"out of date: {drifted}" in err and "posttrain-gone.yaml" in err


def test_the_check_config_step_checks_the_run_from_its_inputs(tmp_path):
    """Plain Argo has no KFP API to read the run back from: the first step checks every stage config from
    its parameters and the DAG compiled into it, and fails a run whose override is a typo."""
    workflow = argo_file("posttrain-sft")["spec"]
    templates = workflow["templates"]
    (check,) = [t for t in templates if t["name"] == "check-config"]
    assert {"name": argo.CHECK_FROM_INPUTS, "value": "1"} in check["container"]["env"]
    (task,) = [t for d in templates for t in d.get("dag", {}).get("tasks", []) if t["name"] == "check-config"]
    # what Argo hands the step for a run with the default parameters
    defaults = {}  # the pipeline's parameters, as the root or the exit handler's DAG passes them down
    for p in workflow["arguments"]["parameters"]:
        defaults[f"{{{{workflow.parameters.{p['name']}}}}}"] = p.get("value")
        defaults[f"{{{{inputs.parameters.pipelinechannel--{p['name']}}}}}"] = p.get("value")
    compiled = {
        p["name"]: defaults.get(p["value"], p["value"])
        for p in task["arguments"]["parameters"]
        if p["value"] in defaults or "{{" not in p["value"]
    }
    assert len(compiled["compiled_spec"]) > 1000  # the DAG, compiled into the task
    (tmp_path / "good").mkdir()
    good = run_step(check, tmp_path / "good", {**compiled, "run_id": "wf-1"})
    assert good.returncode == 0, good.stdout + good.stderr
    assert "stage configs are valid (validated from the task's parameters" in good.stdout
    (tmp_path / "bad").mkdir()
    bad = run_step(check, tmp_path / "bad", {**compiled, "run_id": "wf-2", "sft_overrides": '["no_such_key=1"]'})
    assert bad.returncode != 0 and "no_such_key" in bad.stderr, bad.stdout + bad.stderr
