"""Plain Argo Workflows: one ``WorkflowTemplate`` per pipeline, translated from its compiled KFP IR.

``posttrain pipeline compile --target argo`` compiles each pipeline of ``pipelines/dag.py`` with KFP and
translates the result (the PipelineSpec and kfp-kubernetes' platform spec), so the Argo DAG has the
same steps as the KFP one by construction, not by a second hand-written DAG:

- every KFP executor becomes a container template: the same image and the same embedded component
  source, started through :mod:`pipelines.argo_step` (KFP's executor, fed from Argo's inputs) instead of
  KFP's launcher; the same environment, secrets, config maps, node selector, tolerations, volumes, pod
  labels and resources (values known only at run time, such as a training pod's CPU, go through
  ``podSpecPatch``, since Argo takes no template expression in ``resources``);
- every KFP DAG (the pipeline and each ``dsl.If`` branch) becomes a DAG template, with the same task
  names, dependencies, ``when`` conditions and arguments;
- KFP retries become ``retryStrategy`` with the same limit and backoff;
- artifacts go through the cluster's artifact repository (S3 keys under ``posttrain/<workflow>/``);
- a ``dsl.ExitHandler`` task becomes the workflow's ``onExit`` template, with Argo's workflow status
  as its ``PipelineTaskFinalStatus``.

KFP caching has no Argo equivalent here: every step runs. The translation knows the IR features our
pipelines use and raises on any other, so a new KFP feature cannot be dropped silently.
"""

from __future__ import annotations

import json
import os
import re

IO_ROOT = "/tmp/argo"
ROOT_TEMPLATE = "pipeline"
EXIT_TEMPLATE = "exit-handler"
ARTIFACT_KEY = "posttrain/{{workflow.name}}/{{pod.name}}/NAME.tgz"
#: The shell program in front of the embedded component source (``$0``), as KFP's own, but it starts
#: pipelines.argo_step, which reads Argo's parameters and artifacts, instead of KFP's executor_main.
PROGRAM = (
    'program_path=$(mktemp -d)\nprintf "%s" "$0" > "$program_path/ephemeral_component.py"\n'
    'python3 -m pipelines.argo_step --component_module_path "$program_path/ephemeral_component.py" "$@"\n'
)
#: KFP run-time placeholders with an Argo counterpart.
PLACEHOLDERS = {
    "{{$.pipeline_job_uuid}}": "{{workflow.uid}}",
    "{{$.pipeline_job_name}}": "{{workflow.name}}",
    "{{$.pipeline_root}}": "{{workflow.parameters.pipeline_root}}",
}
#: Workflow parameters Argo needs beyond the pipeline's own: KFP's pipeline root is a setting of the KFP
#: installation or run, Argo has none (artifacts go to the artifact repository, not under a root).
ARGO_ONLY_PARAMETERS = {
    "pipeline_root": (
        "",
        "What KFP's pipeline root is: an s3:// prefix under which training keeps resumable checkpoints (needed "
        "for nodes_per_step > 1) and notify looks for the report. Empty: checkpoints stay in the pod.",
    )
}
_INPUT_REF = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")
_CONDITION_REF = re.compile(r"inputs\.parameter_values\['([^']+)'\]")
_NUMBER_REF = re.compile(r"(?:int|double)\(inputs\.parameter_values\['([^']+)'\]\)")
KNOWN_PLATFORM = {
    "secretAsEnv",
    "configMapAsEnv",
    "nodeSelector",
    "tolerations",
    "emptyDirMounts",
    "podMetadata",
    "imagePullSecret",
    "pvcMount",
}


class ArgoError(ValueError):
    """The KFP IR uses something this translation does not know."""


def text(value) -> str:
    """A KFP parameter value as Argo's parameter text (JSON for lists, dicts and booleans)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def expr(*parts: str) -> str:
    """An Argo template expression: ``expr("tasks", "train", "outputs.parameters", "cpu")``."""
    return "{{" + ".".join(parts) + "}}"


def argo_placeholder(value: str) -> str:
    """``{{$.inputs.parameters['x']}}`` -> ``{{inputs.parameters.x}}``; known KFP run placeholders too."""
    for kfp, argo in PLACEHOLDERS.items():
        value = value.replace(kfp, argo)
    value = _INPUT_REF.sub(lambda m: expr("inputs.parameters", m.group(1)), value)
    if "{{$" in value:
        raise ArgoError(f"no Argo counterpart for the KFP placeholder in {value!r}")
    return value


# --------------------------------------------------------------------------- container templates


KNOWN_RESOURCES = {"cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit", "accelerator"} | {
    f"resource{k[0].upper()}{k[1:]}" for k in ("cpuRequest", "cpuLimit", "memoryRequest", "memoryLimit")
}


def resources(spec: dict) -> tuple[dict, dict]:
    """KFP container resources -> (Argo ``resources``, ``podSpecPatch`` resources) for fixed / run-time values.
    The ``resource*`` fields are KFP's text form of each quantity (the numeric ones repeat them in GB)."""
    if set(spec) - KNOWN_RESOURCES:
        raise ArgoError(f"resources with no Argo translation yet: {sorted(set(spec) - KNOWN_RESOURCES)}")
    wanted = {
        ("requests", "cpu"): spec.get("resourceCpuRequest"),
        ("limits", "cpu"): spec.get("resourceCpuLimit"),
        ("requests", "memory"): spec.get("resourceMemoryRequest"),
        ("limits", "memory"): spec.get("resourceMemoryLimit"),
    }
    accelerator = spec.get("accelerator") or {}
    if accelerator:
        kind = accelerator.get("resourceType") or accelerator.get("type")
        wanted[("limits", kind)] = accelerator.get("resourceCount") or accelerator.get("count")
    fixed: dict = {}
    patched: dict = {}
    for (group, key), value in wanted.items():
        if value in (None, ""):
            continue
        target = patched if "{{" in str(key) + str(value) else fixed
        target.setdefault(group, {})[argo_placeholder(str(key))] = argo_placeholder(str(value))
    if patched:  # a run-time quantity: the whole set goes to the patch, so none is split across the two
        for group, values in fixed.items():
            patched.setdefault(group, {}).update(values)
        fixed = {}
    return fixed, patched


def fixed_name(item: dict, key: str) -> str:
    """The Kubernetes object a kfp-kubernetes setting names (``secretName`` or its constant parameter)."""
    name = item.get(key) or item.get(f"{key}Parameter", {}).get("runtimeValue", {}).get("constant")
    if not isinstance(name, str) or not name:
        raise ArgoError(f"{key} set by a run parameter has no Argo translation yet: {item}")
    return name


def apply_platform(template: dict, container: dict, platform: dict, pull_secrets: set) -> None:
    """kfp-kubernetes settings of one executor onto its Argo template."""
    unknown = set(platform) - KNOWN_PLATFORM
    if unknown:
        raise ArgoError(f"kfp-kubernetes settings with no Argo translation yet: {sorted(unknown)}")
    env = container.setdefault("env", [])
    for item in platform.get("secretAsEnv", []):
        for pair in item["keyToEnv"]:
            ref = {
                "name": fixed_name(item, "secretName"),
                "key": pair["secretKey"],
                "optional": bool(item.get("optional")),
            }
            env.append({"name": pair["envVar"], "valueFrom": {"secretKeyRef": ref}})
    for item in platform.get("configMapAsEnv", []):
        for pair in item["keyToEnv"]:
            name = fixed_name(item, "configMapName")
            ref = {"name": name, "key": pair["configMapKey"], "optional": bool(item.get("optional"))}
            env.append({"name": pair["envVar"], "valueFrom": {"configMapKeyRef": ref}})
    if platform.get("nodeSelector"):
        template["nodeSelector"] = dict(platform["nodeSelector"]["labels"])
    if platform.get("tolerations"):
        template["tolerations"] = [
            {k: v for k, v in t.items() if k in ("key", "operator", "value", "effect", "tolerationSeconds")}
            for t in platform["tolerations"]
        ]
    for mount in platform.get("emptyDirMounts", []):
        empty_dir = {k: mount[k] for k in ("medium", "sizeLimit") if mount.get(k)}
        template.setdefault("volumes", []).append({"name": mount["volumeName"], "emptyDir": empty_dir})
        container.setdefault("volumeMounts", []).append({"name": mount["volumeName"], "mountPath": mount["mountPath"]})
    for mount in platform.get("pvcMount", []):
        name = fixed_name(mount, "pvcName") if "pvcName" in mount or "pvcNameParameter" in mount else mount["constant"]
        template.setdefault("volumes", []).append({"name": name, "persistentVolumeClaim": {"claimName": name}})
        container.setdefault("volumeMounts", []).append({"name": name, "mountPath": mount["mountPath"]})
    metadata = platform.get("podMetadata") or {}
    if metadata:
        template["metadata"] = {k: dict(metadata[k]) for k in ("labels", "annotations") if metadata.get(k)}
    for secret in platform.get("imagePullSecret", []):
        pull_secrets.add(secret["secretName"])


def retry_strategy(policy: dict) -> dict:
    """KFP's retryPolicy -> Argo's retryStrategy (retried on any failure, with the same backoff)."""
    strategy = {"limit": str(policy["maxRetryCount"]), "retryPolicy": "Always"}
    backoff = {}
    if policy.get("backoffDuration"):
        backoff["duration"] = policy["backoffDuration"]
    if policy.get("backoffFactor"):
        backoff["factor"] = text(policy["backoffFactor"])
    if policy.get("backoffMaxDuration"):
        backoff["maxDuration"] = policy["backoffMaxDuration"]
    if backoff:
        strategy["backoff"] = backoff
    return strategy


def function_arguments(component: dict, function: str, status_task: str) -> list[str]:
    """The arguments pipelines.argo_step gets: which function, and every input and output of the component."""
    args = ["--function_to_execute", function, "--io-root", IO_ROOT]
    inputs = component.get("inputDefinitions", {})
    for name, spec in sorted(inputs.get("parameters", {}).items()):
        if name.startswith("pipelinechannel--"):
            continue  # a value KFP passes only for a resource placeholder, not to the function
        if spec["parameterType"] == "TASK_FINAL_STATUS":
            args += ["--final-status", name, "{{workflow.status}}", "{{workflow.failures}}", "{{workflow.name}}"]
            args.append(status_task)
            continue
        args += ["--parameter", f"{name}:{spec['parameterType']}", expr("inputs.parameters", name)]
    for name, spec in sorted(inputs.get("artifacts", {}).items()):
        args += ["--input-artifact", f"{name}:{spec['artifactType']['schemaTitle']}"]
    outputs = component.get("outputDefinitions", {})
    for name, spec in sorted(outputs.get("artifacts", {}).items()):
        args += ["--output-artifact", f"{name}:{spec['artifactType']['schemaTitle']}"]
    for name in sorted(outputs.get("parameters", {})):
        args += ["--output-parameter", name]
    return args


def declared_parameters(component: dict, executor: dict | None) -> set[str]:
    """The input parameters of a template: the component's, plus those its resources read at run time (KFP
    passes those to the task without declaring them on the component)."""
    names = set(component.get("inputDefinitions", {}).get("parameters", {}))
    resources_spec = json.dumps((executor or {}).get("container", {}).get("resources", {}))
    return names | set(_INPUT_REF.findall(resources_spec))


#: set on the check-config step: it checks the run from its parameters and the DAG compiled into it
CHECK_FROM_INPUTS = "POSTTRAIN_CHECK_FROM_INPUTS"


def container_template(name: str, component: dict, executor: dict, platform: dict, ctx: dict) -> dict:
    """One KFP executor as an Argo container template."""
    spec = executor.get("container")
    if not spec or set(spec) - {"image", "command", "args", "env", "resources"}:
        raise ArgoError(f"{name}: only plain container executors translate (found {executor})")
    kfp_command, kfp_args = spec.get("command", []), spec.get("args", [])
    if "--function_to_execute" not in kfp_args or "kfp.dsl.executor_main" not in "".join(kfp_command[-2:-1]):
        raise ArgoError(f"{name}: not a KFP lightweight Python component (no embedded source)")
    function = kfp_args[kfp_args.index("--function_to_execute") + 1]
    inputs = component.get("inputDefinitions", {})
    parameters = []
    for pname in sorted(declared_parameters(component, executor)):
        pspec = inputs.get("parameters", {}).get(pname, {})
        if pspec.get("parameterType") == "TASK_FINAL_STATUS":
            continue
        entry = {"name": pname}
        if "defaultValue" in pspec:
            entry["default"] = text(pspec["defaultValue"])
        parameters.append(entry)
    artifacts = [
        {"name": a, "path": f"{IO_ROOT}/inputs/{a}", **({"optional": True} if s.get("isOptional") else {})}
        for a, s in sorted(inputs.get("artifacts", {}).items())
    ]
    outputs = component.get("outputDefinitions", {})
    container = {
        "image": spec["image"],
        # KFP's command up to its program (a shell; a pip install first, when KFP installs itself), then
        # ours, then the component source as KFP embedded it
        "command": [*kfp_command[:-2], PROGRAM, kfp_command[-1]],
        "args": function_arguments(component, function, ctx["status_task"]),
        "env": [dict(e) for e in spec.get("env", [])],
    }
    if function == "check_config":  # no KFP API to read the run back from: check it from the task's inputs
        container["env"].append({"name": CHECK_FROM_INPUTS, "value": "1"})
    fixed, patched = resources(spec.get("resources", {}))
    if fixed:
        container["resources"] = fixed
    template: dict = {"name": name}
    if parameters or artifacts:
        template["inputs"] = {k: v for k, v in (("parameters", parameters), ("artifacts", artifacts)) if v}
    out = {
        "parameters": [
            {"name": p, "valueFrom": {"path": f"{IO_ROOT}/outputs/parameters/{p}"}}
            for p in sorted(outputs.get("parameters", {}))
        ],
        "artifacts": [
            {"name": a, "path": f"{IO_ROOT}/outputs/{a}", "s3": {"key": ARTIFACT_KEY.replace("NAME", a)}}
            for a in sorted(outputs.get("artifacts", {}))
        ],
    }
    if out["parameters"] or out["artifacts"]:
        template["outputs"] = {k: v for k, v in out.items() if v}
    template["container"] = container
    apply_platform(template, container, platform, ctx["pull_secrets"])
    if not container["env"]:
        del container["env"]
    if patched:
        template["podSpecPatch"] = json.dumps({"containers": [{"name": "main", "resources": patched}]}, sort_keys=True)
    if ctx["retries"].get(name):
        template["retryStrategy"] = retry_strategy(ctx["retries"][name])
    return template


# --------------------------------------------------------------------------- DAG templates


def template_name(component_ref: str) -> str:
    return component_ref.removeprefix("comp-")


def argument(name: str, source: dict, at_root: bool) -> dict:
    """One KFP task input parameter -> an Argo argument parameter."""
    if "componentInputParameter" in source:
        scope = "workflow.parameters" if at_root else "inputs.parameters"
        return {"name": name, "value": expr(scope, source["componentInputParameter"])}
    if "taskOutputParameter" in source:
        ref = source["taskOutputParameter"]
        return {
            "name": name,
            "value": expr("tasks", ref["producerTask"], "outputs.parameters", ref["outputParameterKey"]),
        }
    if "runtimeValue" in source:
        value = source["runtimeValue"]["constant"]
        return {"name": name, "value": argo_placeholder(value) if isinstance(value, str) else text(value)}
    raise ArgoError(f"input parameter '{name}': no Argo translation for {sorted(source)}")


def _is_own_reference(source: dict) -> bool:
    value = source.get("runtimeValue", {}).get("constant")
    return isinstance(value, str) and _INPUT_REF.search(value) is not None


def artifact_argument(name: str, source: dict) -> dict:
    if "taskOutputArtifact" in source:
        ref = source["taskOutputArtifact"]
        return {
            "name": name,
            "from": expr("tasks", ref["producerTask"], "outputs.artifacts", ref["outputArtifactKey"]),
        }
    if "componentInputArtifact" in source:
        return {"name": name, "from": expr("inputs.artifacts", source["componentInputArtifact"])}
    raise ArgoError(f"input artifact '{name}': no Argo translation for {sorted(source)}")


def when(condition: str, arguments: dict) -> str:
    """A KFP ``dsl.If`` condition -> an Argo ``when`` over the same values, compared as text.

    KFP evaluates the condition on the branch task's own inputs; Argo evaluates ``when`` in the parent
    DAG, so each input is replaced by what the parent passes for it. Argo parameters are text, so
    booleans compare as 'true'/'false' (what pipelines.argo_step writes, and JSON's spelling), and
    ``int(x)`` / ``double(x)`` leave the value bare so that Argo compares numbers.
    """

    def value(match):
        name = match.group(1)
        if name not in arguments:
            raise ArgoError(f"condition {condition!r} reads '{name}', which the branch task is not given")
        return f"'{arguments[name]}'"

    def number(match):  # int(x) / double(x): compared as a number, so left unquoted
        return value(match).strip("'")

    expression = _NUMBER_REF.sub(number, condition)
    expression = _CONDITION_REF.sub(value, expression)
    return re.sub(r"(?<!['\w])(true|false)(?!['\w])", r"'\1'", expression)


def dag_task(name: str, task: dict, at_root: bool, components: dict, ctx: dict) -> dict:
    ref = task["componentRef"]["name"]
    if "iteratorPolicy" in task or "parameterIterator" in task or "artifactIterator" in task:
        raise ArgoError(f"task '{name}': dsl.ParallelFor has no Argo translation yet")
    inputs = task.get("inputs", {})
    params = [
        argument(p, s, at_root) for p, s in sorted(inputs.get("parameters", {}).items()) if "taskFinalStatus" not in s
    ]
    # KFP resolves a constant "{{$.inputs.parameters['x']}}" against the task's own input x (how it hands a
    # task its run-time resources); in Argo that is whatever this task passes as x
    own = {p["name"]: p["value"] for p in params}
    params = [p for p in params if p["name"] in ctx["declared"][template_name(ref)]]
    for param in params:
        param["value"] = (
            re.sub(r"\{\{inputs\.parameters\.([^}]+)\}\}", lambda m: own.get(m.group(1), m.group(0)), param["value"])
            if _is_own_reference(inputs["parameters"][param["name"]])
            else param["value"]
        )
    artifacts = [artifact_argument(a, s) for a, s in sorted(inputs.get("artifacts", {}).items())]
    entry: dict = {"name": name, "template": template_name(ref)}
    if task.get("dependentTasks"):
        entry["dependencies"] = sorted(task["dependentTasks"])
    condition = task.get("triggerPolicy", {}).get("condition")
    if condition:
        entry["when"] = when(condition, {p["name"]: p["value"] for p in params})
    if params or artifacts:
        entry["arguments"] = {k: v for k, v in (("parameters", params), ("artifacts", artifacts)) if v}
    if "executorLabel" in components[ref]:
        policy = task.get("retryPolicy")
        known = ctx["retries"].setdefault(template_name(ref), policy)
        if known != policy:
            raise ArgoError(f"component {ref}: its tasks retry differently ({known} vs {policy})")
    return entry


def dag_template(name: str, component: dict, at_root: bool, components: dict, ctx: dict) -> dict:
    """One KFP DAG (the pipeline, a dsl.If branch) as an Argo DAG template; exit tasks are set aside."""
    tasks = []
    for task_name, task in sorted(component["dag"]["tasks"].items()):
        if task.get("triggerPolicy", {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED":
            if not at_root:
                raise ArgoError(f"task '{task_name}': an exit handler below the pipeline's root DAG")
            ctx["exit_tasks"].append((task_name, task))
            continue
        tasks.append(dag_task(task_name, task, at_root, components, ctx))
    template: dict = {"name": name}
    inputs = component.get("inputDefinitions", {})
    if not at_root and inputs:
        template["inputs"] = {
            k: [{"name": n} for n in sorted(inputs.get(k, {}))] for k in ("parameters", "artifacts") if inputs.get(k)
        }
    outputs = component["dag"].get("outputs", {})
    out: dict = {}
    for key, spec in sorted(outputs.get("parameters", {}).items()):
        ref = spec["valueFromParameter"]
        value = expr("tasks", ref["producerSubtask"], "outputs.parameters", ref["outputParameterKey"])
        out.setdefault("parameters", []).append({"name": key, "valueFrom": {"parameter": value}})
    for key, spec in sorted(outputs.get("artifacts", {}).items()):
        (ref,) = spec["artifactSelectors"]
        value = expr("tasks", ref["producerSubtask"], "outputs.artifacts", ref["outputArtifactKey"])
        out.setdefault("artifacts", []).append({"name": key, "from": value})
    if out:
        template["outputs"] = out
    template["dag"] = {"tasks": tasks}
    return template


def exit_template(ctx: dict, components: dict) -> dict:
    """The tasks KFP runs after its exit handler's DAG, as the DAG Argo runs on exit of the workflow."""
    tasks = []
    for task_name, task in ctx["exit_tasks"]:
        task = {k: v for k, v in task.items() if k not in ("dependentTasks", "triggerPolicy")}
        tasks.append(dag_task(task_name, task, True, components, ctx))
    return {"name": EXIT_TEMPLATE, "dag": {"tasks": tasks}}


# --------------------------------------------------------------------------- the workflow template


def workflow_template(spec: dict, platform: dict | None = None) -> dict:
    """The Argo WorkflowTemplate of one compiled KFP pipeline (``spec``: the PipelineSpec document,
    ``platform``: kfp-kubernetes' platform spec document, if any)."""
    components = spec.get("components", {})
    executors = spec["deploymentSpec"]["executors"]
    kube = ((platform or {}).get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {})).get("executors", {})
    exit_handlers = {
        s["taskFinalStatus"]["producerTask"]
        for t in spec["root"]["dag"]["tasks"].values()
        for s in t.get("inputs", {}).get("parameters", {}).values()
        if "taskFinalStatus" in s
    }
    ctx = {"retries": {}, "exit_tasks": [], "pull_secrets": set(), "status_task": ",".join(sorted(exit_handlers))}
    ctx["declared"] = {
        template_name(ref): declared_parameters(c, executors.get(c.get("executorLabel")))
        for ref, c in components.items()
    }
    dags = [dag_template(ROOT_TEMPLATE, spec["root"], True, components, ctx)]
    for ref, component in sorted(components.items()):
        if "dag" in component:
            dags.append(dag_template(template_name(ref), component, False, components, ctx))
    if ctx["exit_tasks"]:
        dags.append(exit_template(ctx, components))
    containers = []
    for ref, component in sorted(components.items()):
        if "executorLabel" in component:
            label = component["executorLabel"]
            name = template_name(ref)
            containers.append(container_template(name, component, executors[label], kube.get(label, {}), ctx))
    arguments = []
    for name, param in sorted(spec["root"].get("inputDefinitions", {}).get("parameters", {}).items()):
        entry = {"name": name}
        if "defaultValue" in param:
            entry["value"] = text(param["defaultValue"])
        if param.get("description"):
            entry["description"] = param["description"]
        arguments.append(entry)
    for name, (default, description) in ARGO_ONLY_PARAMETERS.items():
        arguments.append({"name": name, "value": default, "description": description})
    pipeline = spec["pipelineInfo"]["name"]
    body: dict = {"entrypoint": ROOT_TEMPLATE}
    if arguments:
        body["arguments"] = {"parameters": arguments}
    if ctx["exit_tasks"]:
        body["onExit"] = EXIT_TEMPLATE
    if ctx["pull_secrets"]:
        body["imagePullSecrets"] = [{"name": s} for s in sorted(ctx["pull_secrets"])]
    body["templates"] = dags + containers
    metadata = {"name": pipeline, "labels": {"posttrain/pipeline": pipeline}}
    if spec["pipelineInfo"].get("description"):
        metadata["annotations"] = {"workflows.argoproj.io/description": spec["pipelineInfo"]["description"]}
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate", "metadata": metadata, "spec": body}


def translate_file(ir_path: str) -> dict:
    """The WorkflowTemplate of one compiled KFP file (PipelineSpec, then the optional platform spec)."""
    import yaml

    with open(ir_path, encoding="utf-8") as fh:
        spec, *rest = list(yaml.safe_load_all(fh))
    return workflow_template(spec, rest[0] if rest else None)


def dump(template: dict) -> str:
    import yaml

    return yaml.safe_dump(template, sort_keys=False, width=120, default_flow_style=False)


def write(ir_path: str, out_path: str) -> str:
    """Translate ``ir_path`` and write the WorkflowTemplate YAML to ``out_path``."""
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(f"# Generated by 'posttrain pipeline compile' from ../{os.path.basename(ir_path)}; do not edit.\n")
        fh.write(dump(translate_file(ir_path)))
    return out_path


def write_all(kfp_dir: str, out_dir: str) -> list[str]:
    """A WorkflowTemplate ``<name>.yaml`` in ``out_dir`` for every compiled KFP pipeline in ``kfp_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    names = sorted(f for f in os.listdir(kfp_dir) if f.endswith(".yaml"))
    return [write(os.path.join(kfp_dir, name), os.path.join(out_dir, name)) for name in names]
