"""Check every stage's config a pipeline run would build, in about a second, naming the task, stage and key.

The compiled pipeline (its IR, as a dict) is the one source of truth for which stage gets which
parameters: :func:`check_spec` walks its tasks (branches whose condition is false on these parameters
are skipped), fills in the pipeline's parameter values as the backend would, builds each task's layers
as its component does, and validates the stage config with placeholder paths for the artifacts. A typo
in ``dpo_overrides`` is then found in seconds, not when the DPO pod starts hours into the run.

Two callers: ``posttrain pipeline run|submit|schedule`` on the laptop (``pipelines/validate.py``, before
anything is sent), and the ``check config`` task every DAG starts with on the cluster (:func:`check_task`),
so a run started from the UI or a schedule is checked too. That task reads this run's IR and parameters
back from the KFP API; where the API cannot be reached or does not let the pod in (no ``access-ml-pipeline``
PodDefault, so no token), it checks the same walk from what it carries instead: the run's parameter values
(every pipeline parameter is an input of the task) and the DAG compiled into it (:func:`pack_spec`). Both are
what the stage tasks of this run get, so the fallback is exactly as strict as the API's copy.
"""

from __future__ import annotations

import json
import re

_CHANNEL = re.compile(r"\{\{\$\.inputs\.parameters\['pipelinechannel--(\w+)'\]\}\}")
_CONDITION_CHANNEL = re.compile(r"inputs\.parameter_values\['pipelinechannel--(\w+)'\]")


class ValidationError(Exception):
    """A stage config that the given parameters would make invalid."""


def _resolve(value, params: dict):
    """A constant with ``{{$.inputs.parameters['pipelinechannel--x']}}`` placeholders filled in as text."""
    if isinstance(value, str):
        return _CHANNEL.sub(lambda m: str(params[m.group(1)]), value)
    if isinstance(value, list):
        return [_resolve(v, params) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, params) for k, v in value.items()}
    return value


def _inputs(task: dict, component: dict, params: dict) -> dict:
    """The task's parameter inputs: the component's defaults, then what the DAG passes with the
    pipeline's values filled in (task outputs such as the gate are unknown here: left out)."""
    definitions = component.get("inputDefinitions", {}).get("parameters", {})
    values = {name: d["defaultValue"] for name, d in definitions.items() if "defaultValue" in d}
    for name, source in task.get("inputs", {}).get("parameters", {}).items():
        if "runtimeValue" in source:
            values[name] = _resolve(source["runtimeValue"]["constant"], params)
        elif "componentInputParameter" in source:
            values[name] = params.get(source["componentInputParameter"].removeprefix("pipelinechannel--"))
    return values


def _holds(condition: str, params: dict) -> bool:
    """KFP's trigger condition on pipeline parameters, e.g. ``inputs.parameter_values['pipelinechannel--x']
    == 'ppo'`` or ``!(... == true)``."""
    text = _CONDITION_CHANNEL.sub(lambda m: json.dumps(params[m.group(1)]), condition)
    if "inputs.parameter_values[" in text:  # on a task's output (check changes): unknown before the run, so
        return True  # the branch is checked as if it runs
    text = text.replace("!(", "not (").replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", text))
    return bool(eval(text, {"__builtins__": {}}, {}))


def _layers(component: str, v: dict) -> list[tuple[str, list, str]]:
    """``[(stage, layers, config_yaml)]`` a component would run, artifact paths as placeholders."""
    from trainer_lib.runner.stage_api import training_layers

    paths = {"model.path": "/validate/model", "data.path": "/validate/data", "output_dir": "/validate/out"}
    if component == "train":
        extra = {"reward.model_path": "/validate/reward_model"} if "reward_model" in v["artifacts"] else {}
        return [(v["stage"], training_layers(v, {**paths, **extra}), v["config_yaml"])]
    if component == "prepare":
        typed = {"data.max_length": v["max_length"], "data.eval_fraction": v["eval_fraction"], "seed": v["seed"]}
        return [("prepare", [typed, *v["overrides"], paths], v["config_yaml"])]
    if component == "evaluate":
        typed = {
            "judge.kind": v["judge"],
            "humaneval.limit": v["humaneval_limit"],
            "humaneval.n": v["humaneval_n"],
            "seed": v["seed"],
            **({"gate.rules": v["gate_rules"]} if v["gate_rules"] else {}),
        }
        labels = [v["base_label"], v["baseline_label"], v["candidate_label"]]
        wiring = {
            "models": [f"{label}=/validate/{label}" for label in labels],
            "candidate": labels[-1],
            "baseline": labels[1],
            "data_dir": "/validate/data",
            "output_dir": "/validate/out",
            "reward_model_path": "/validate/reward_model",
            **{k: p for k, p in (("tasks.path", v["tasks_path"]), ("safety.path", v["safety_path"])) if p},
        }
        if "exported" in v["artifacts"]:
            typed["served.variant"] = v["served_variant"]
            typed.update({"served.rules": v["served_rules"]} if v["served_rules"] else {})
            wiring["served.export_dir"] = "/validate/export"
        return [("evaluate", [typed, *v["overrides"], wiring], v["config_yaml"])]
    if component == "export":
        return [
            (
                "export",
                [*v["overrides"], {"model_path": "/validate/model", "output_dir": "/validate/out"}],
                v["config_yaml"],
            )
        ]
    if component == "deploy":
        wiring = {"export.path": "/validate/export", "repository": "/validate/repo", "triton.url": v["triton_url"]}
        return [("deploy", [{"model_name": v["model_name"], "variant": v["variant"]}, *v["overrides"], wiring], "")]
    if component == "bootstrap":
        return [
            ("demo-data", [{"seed": v["seed"]}, *v["demo_overrides"], {"output_dir": "/validate/demo"}], ""),
            (
                "tiny-model",
                [
                    {"seed": v["seed"]},
                    *v["tiny_model_overrides"],
                    {"corpus": "/validate/corpus.txt", "output_dir": "/validate/model"},
                ],
                "",
            ),
        ]
    return []  # release: nothing but paths and the gate; tune: its search (_check_search)


def _check_search(v: dict) -> None:
    """A ``tune`` task's search file, checked as the task checks it before its first trial (the keys it
    searches, their ranges and the objective, on the base config of the training task it comes before)."""
    from trainer_lib.runner.stage_api import training_layers
    from trainer_lib.runner.tune.pipeline_search import pipeline_search

    paths = {"model.path": "/validate/model", "data.path": "/validate/data"}
    layers = training_layers({"reward_functions": [], "reward_weights": [], **v}, paths)
    pipeline_search(v["stage"], v["search"], layers, v["config_yaml"], "/validate/tune")


def spec_defaults(spec: dict) -> dict:
    """The pipeline's own parameter defaults from its IR (integers typed back: the IR stores them as floats)."""
    definitions = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    out = {}
    for name, definition in definitions.items():
        if "defaultValue" in definition:
            value = definition["defaultValue"]
            integer = definition.get("parameterType") == "NUMBER_INTEGER" and isinstance(value, float)
            out[name] = int(value) if integer and value.is_integer() else value
    return out


def check_spec(spec: dict, params: dict) -> int:
    """Build every stage config the pipeline ``spec`` (IR dict) would run with ``params`` (its defaults
    filled in); raises :class:`ValidationError` naming the task, stage and key. Returns how many
    configs were checked."""
    from trainer_lib.errors import ConfigError
    from trainer_lib.runner.stage_api import stage_config

    spec = spec.get("pipeline_spec", spec)  # the API's {pipeline_spec, platform_spec} form
    values, checked = {**spec_defaults(spec), **params}, 0

    def walk(dag: dict) -> None:
        nonlocal checked
        for name, task in dag.get("tasks", {}).items():
            condition = task.get("triggerPolicy", {}).get("condition")
            if condition and not _holds(condition, values):
                continue
            ref = task["componentRef"]["name"]
            if "dag" in spec["components"][ref]:
                walk(spec["components"][ref]["dag"])
                continue
            component = re.sub(r"-\d+$", "", ref.removeprefix("comp-"))
            title = task.get("taskInfo", {}).get("name", name)
            inputs = {
                **_inputs(task, spec["components"][ref], values),
                "artifacts": set(task.get("inputs", {}).get("artifacts", {})),
            }
            for stage, layers, config_yaml in _layers(component, inputs):
                try:
                    stage_config(stage, layers, config_yaml or "")
                except ConfigError as exc:
                    raise ValidationError(f"task '{title}' (posttrain {stage}): {exc}") from None
                checked += 1
            if component == "tune":
                try:
                    _check_search(inputs)
                except ConfigError as exc:
                    raise ValidationError(f"task '{title}' (posttrain tune, {inputs['stage']}): {exc}") from None
                checked += 1

    walk(spec["root"]["dag"])
    return checked


# --------------------------------------------------------------------------- the DAG a check task carries


def pack_spec(spec: dict) -> str:
    """What :func:`check_spec` reads of a compiled pipeline ``spec`` (IR dict), as compressed JSON text:
    the tasks (their component, inputs, condition and name) and the parameter definitions, without the
    executors and without the ``check-config`` task itself. The DAG compiles it into that task
    (``pipelines.dag.carry_spec``): text, so that no backend resolves the ``{{$.inputs...}}`` placeholders
    it holds as the check task's own, and compressed (4 KB for the largest DAG, 75 KB as JSON) with bzip2,
    which has one implementation everywhere: the IR compiles to the same bytes on every machine (zlib-ng,
    the system zlib of some distributions, compresses differently from zlib)."""
    import base64
    import bz2

    spec = spec.get("pipeline_spec", spec)
    needed: list[str] = []

    def parameters(owner: dict) -> dict:
        definitions = owner.get("inputDefinitions", {}).get("parameters", {})
        kept = {name: {k: d[k] for k in ("parameterType", "defaultValue") if k in d} for name, d in definitions.items()}
        return {"inputDefinitions": {"parameters": kept}}

    def dag(graph: dict) -> dict:
        tasks = {}
        for name, task in graph.get("tasks", {}).items():
            if name == "check-config":
                continue
            needed.append(task["componentRef"]["name"])
            inputs = task.get("inputs", {})
            passed = {
                k: source
                for k, source in inputs.get("parameters", {}).items()
                if "runtimeValue" in source or "componentInputParameter" in source
            }
            tasks[name] = {
                "componentRef": task["componentRef"],
                "taskInfo": task.get("taskInfo", {}),
                "inputs": {"parameters": passed, "artifacts": {k: {} for k in inputs.get("artifacts", {})}},
                **({"triggerPolicy": task["triggerPolicy"]} if "triggerPolicy" in task else {}),
            }
        return {"tasks": tasks}

    packed = {"root": {**parameters(spec["root"]), "dag": dag(spec["root"]["dag"])}, "components": {}}
    while needed:
        ref = needed.pop()
        if ref not in packed["components"]:
            component = spec["components"][ref]
            packed["components"][ref] = {
                **parameters(component),
                **({"dag": dag(component["dag"])} if "dag" in component else {}),
            }
    text = json.dumps(packed, sort_keys=True, separators=(",", ":"))
    return base64.b64encode(bz2.compress(text.encode(), 9)).decode("ascii")


def unpack_spec(text: str) -> dict:
    """The spec :func:`pack_spec` packed."""
    import base64
    import bz2

    return json.loads(bz2.decompress(base64.b64decode(text)))


# --------------------------------------------------------------------------- reading the run from the KFP API

#: Seconds to connect to the KFP API and to wait for its answer, and tries per request: a closed port
#: fails at once, an address that drops packets after 3 x 5 s, so the check never hangs.
API_TIMEOUT = (5.0, 20.0)
API_TRIES = 3
_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"


class ApiUnavailable(RuntimeError):
    """The KFP API could not be reached, or did not let this pod read the run: :func:`check_task` then
    checks the run from the task's own inputs."""


def _token_path() -> str:
    import os

    return os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", _TOKEN_PATH)


def _token() -> str | None:
    """The pod's KFP API token, where the cluster projects one (multi-user Kubeflow; see docs/pipelines.md)."""
    import os

    path = _token_path()
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    return None


def _public(host: str) -> str:
    """``host`` without any ``user:password@`` in it, for messages."""
    return re.sub(r"(?<=//)[^/@]*@", "", host)


def _network_reason(exc: BaseException) -> str:
    """One line on why a connection failed: the last error urllib3 retried on (refused, timed out, name not
    resolved, TLS), without the connection it names (the message names the host once)."""
    cause = getattr(exc, "reason", None)
    cause = cause if isinstance(cause, BaseException) else exc
    text = re.sub(r"^(<[^>]*>|\w+\(host=[^)]*\)):\s*", "", (str(cause).splitlines() or [""])[0])
    return f"{type(cause).__name__}: {text}"[:300]


def _refused(exc) -> bool:
    """An answer meaning "not authorised": HTTP 401/403, or the API's gRPC code UNAUTHENTICATED (16) or
    PERMISSION_DENIED (7) in its error body (read, never shown: it may echo what was sent)."""
    if exc.status in (401, 403):
        return True
    try:
        return json.loads(exc.body or "null").get("code") in (7, 16)
    except (ValueError, AttributeError, TypeError):
        return False


def read_run(run_id: str, host: str) -> tuple[dict, dict]:
    """KFP run ``run_id`` as the API at ``host`` holds it: its IR (inline, or its pipeline version's) and its
    runtime parameters. Raises :class:`ApiUnavailable` when the API cannot be reached (refused, timed out,
    no such host, a gateway's 502/503/504) or does not authorise this pod (401/403; the token is the pod's
    projected one, if any), and RuntimeError naming the host and run for any other failure. No message
    carries the token, the API's error body or a password in ``host``."""
    import logging

    import kfp_server_api
    import urllib3

    url = host if host.startswith("http") else f"https://{host}"  # as kfp.Client does
    config = kfp_server_api.Configuration(host=url.rstrip("/"))
    config.retries = urllib3.Retry(total=API_TRIES - 1, backoff_factor=0.1)
    token = _token()
    if token:
        config.api_key["authorization"], config.api_key_prefix["authorization"] = token, "Bearer"
    shown, retries = _public(host), logging.getLogger("urllib3.connectionpool")
    level = retries.level
    retries.setLevel(logging.ERROR)  # no "Retrying ..." warnings: the outcome is said once, below
    try:
        with kfp_server_api.ApiClient(config) as client:
            run = kfp_server_api.RunServiceApi(client).run_service_get_run(run_id, _request_timeout=API_TIMEOUT)
            spec = run.pipeline_spec
            if not spec and run.pipeline_version_reference:
                ref = run.pipeline_version_reference
                spec = (
                    kfp_server_api.PipelineServiceApi(client)
                    .pipeline_service_get_pipeline_version(
                        ref.pipeline_id, ref.pipeline_version_id, _request_timeout=API_TIMEOUT
                    )
                    .pipeline_spec
                )
            params = dict((run.runtime_config.parameters if run.runtime_config else None) or {})
    except kfp_server_api.ApiException as exc:
        answer = f"HTTP {exc.status} {exc.reason}" if exc.status else str(exc.reason).splitlines()[0][:300]
        if not exc.status or exc.status in (502, 503, 504):
            raise ApiUnavailable(f"KFP API at {shown} not reachable ({answer})") from None
        if _refused(exc):
            sent = "with the pod's token" if token else f"without a token: none at {_token_path()}"
            raise ApiUnavailable(
                f"KFP API at {shown} did not authorise this pod to read run {run_id} ({answer}, sent {sent}; "
                f"the access-ml-pipeline PodDefault of multi-user Kubeflow projects it, see docs/pipelines.md)"
            ) from None
        raise RuntimeError(_unreadable(run_id, shown, answer)) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:  # refused, timed out, no such host, TLS
        raise ApiUnavailable(f"KFP API at {shown} not reachable ({_network_reason(exc)})") from None
    except Exception as exc:  # an answer the client cannot read: the API is there, something else is wrong
        raise RuntimeError(_unreadable(run_id, shown, _network_reason(exc))) from None
    finally:
        retries.setLevel(level)
    if not spec:
        raise RuntimeError(f"run {run_id}: the KFP API returned no pipeline spec to check")
    return spec, params


def _unreadable(run_id: str, host: str, why: str) -> str:
    return (
        f"cannot read run {run_id} from the KFP API at {host} ({why}); set POSTTRAIN_KFP_API in the "
        f"posttrain-config ConfigMap to an API the pipeline pods can reach, or delete that key to skip this check"
    )


def check_task(run_id: str, host: str, compiled_spec: str, parameters: dict) -> tuple[int, str]:
    """The ``check config`` task: check run ``run_id`` as the KFP API at ``host`` holds it; when that API
    cannot be reached or does not authorise the pod, check it from the task's own inputs instead: the run's
    ``parameters`` (each pipeline parameter is an input of the task, so these are the values every stage
    task of the run gets) and ``compiled_spec``, the DAG compiled into the task (:func:`pack_spec`). Prints
    which check it runs when it falls back; returns how many configs were checked and where they came
    from. Raises :class:`ValidationError` (task, stage, key) the same way in both cases, and RuntimeError
    when the run can be checked neither way."""
    try:
        spec, params = read_run(run_id, host)
    except ApiUnavailable as exc:
        if not compiled_spec:
            raise RuntimeError(
                f"{exc}; this pipeline was compiled without its DAG in the check task, so the run cannot be "
                f"checked without the API: recompile it (posttrain pipeline compile) or give the pods the API"
            ) from None
        print(f"{exc}: validated the stage configs from the task's parameters", flush=True)
        return check_inputs(compiled_spec, parameters)
    return check_spec(spec, params), f"validated from the KFP API's copy of run {run_id}"


def check_inputs(compiled_spec: str, parameters: dict) -> tuple[int, str]:
    """Check a run from the ``check config`` task's own inputs: the run's ``parameters`` and
    ``compiled_spec``, the DAG compiled into the task; ``(configs checked, where they came from)``."""
    if not compiled_spec:
        raise RuntimeError("this pipeline was compiled without its DAG in the check task: recompile it")
    spec = unpack_spec(compiled_spec)
    ours = spec["root"]["inputDefinitions"]["parameters"]  # the task's other inputs stand for other DAGs'
    checked = check_spec(spec, {k: v for k, v in parameters.items() if k in ours})
    return checked, "validated from the task's parameters: the run's values and the DAG compiled into the task"
