"""Check every stage's config a pipeline run would build, in about a second, naming the task, stage and key.

The compiled pipeline (its IR, as a dict) is the one source of truth for which stage gets which
parameters: :func:`check_spec` walks its tasks (branches whose condition is false on these parameters
are skipped), fills in the pipeline's parameter values as the backend would, builds each task's layers
as its component does, and validates the stage config with placeholder paths for the artifacts. A typo
in ``dpo_overrides`` is then found in seconds, not when the DPO pod starts hours into the run.

Two callers: ``posttrain pipeline run|submit|schedule`` on the laptop (``pipelines/validate.py``, before
anything is sent), and the ``check config`` task every DAG starts with on the cluster (:func:`check_run`,
which reads this run's IR and parameters from the KFP API), so a run started from the UI or a schedule
is checked too.
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
    text = text.replace("!(", "not (").replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", text))
    return bool(eval(text, {"__builtins__": {}}, {}))


def _layers(component: str, v: dict) -> list[tuple[str, list, str]]:
    """``[(stage, layers, config_yaml)]`` a component would run, artifact paths as placeholders."""
    from components.common import training_layers

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
    return []  # release: nothing but paths and the gate


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
    from trainer_lib.stage_api import stage_config

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

    walk(spec["root"]["dag"])
    return checked


def _token() -> str | None:
    """The pod's KFP API token, where the cluster projects one (multi-user Kubeflow; see docs/pipelines.md)."""
    import os

    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "/var/run/secrets/kubeflow/pipelines/token")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    return None


def check_run(run_id: str, host: str) -> int:
    """Check the configs of KFP run ``run_id`` as the API at ``host`` holds it: its IR (inline, or its
    pipeline version's) and its runtime parameters. Raises :class:`ValidationError` on a bad setting,
    and RuntimeError naming the host and run when the API cannot be read."""
    import kfp

    try:
        client = kfp.Client(host=host, existing_token=_token())
        run = client.get_run(run_id)
        spec = run.pipeline_spec
        if not spec and run.pipeline_version_reference:
            reference = run.pipeline_version_reference
            spec = client.get_pipeline_version(reference.pipeline_id, reference.pipeline_version_id).pipeline_spec
        params = dict((run.runtime_config.parameters if run.runtime_config else None) or {})
    except Exception as exc:  # the API client raises many kinds; all mean "cannot read the run"
        reason = getattr(exc, "reason", None) or str(exc).splitlines()[0]
        raise RuntimeError(
            f"cannot read run {run_id} from the KFP API at {host} ({type(exc).__name__}: "
            f"{reason}); set POSTTRAIN_KFP_API in the posttrain-config ConfigMap to an "
            f"API the pipeline pods can reach, or delete that key to skip this check"
        ) from None
    if not spec:
        raise RuntimeError(f"run {run_id}: the KFP API returned no pipeline spec to check")
    return check_spec(spec, params)
