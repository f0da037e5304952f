"""A Katib Experiment checked as the cluster would check it, without a cluster.

* :func:`experiment_errors`: against Katib's OpenAPI definition of ``v1beta1.Experiment``:
  ``crds/katib-v0.19.0-experiment.openapi.json`` holds ``components.schemas`` of kubeflow/katib v0.19.0's
  ``api/openapi-spec/swagger.json`` reduced to ``v1beta1.Experiment`` and what it references, without
  ``description`` keys (the ``$comment`` names the commit). Katib's CRD preserves unknown fields, so the
  CRD itself checks nothing; here, as with ``kubectl apply --validate=strict``, every object that lists
  its properties is closed to others, and types are checked (Katib writes bounds as text).
* :func:`controller_errors`: the rules of Katib's validating webhook
  (``pkg/webhook/v1beta1/experiment/validator/validator.go``), of its Optuna suggestion service's settings
  checks and of its medianstop service, written out here for the fields we set.
* :func:`collected`: what Katib's StdOut collector takes from a trial's output
  (``parseLogsInTextFormat`` of ``pkg/metricscollector/v1beta1/file-metricscollector``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re

import jsonschema

from tests.manifests.crd_schema import schema_errors, strict

SCHEMA = os.path.join(os.path.dirname(__file__), "crds", "katib-v0.19.0-experiment.openapi.json")
PARAM = re.compile(r"\$\{trialParameters\..+?\}")
META = re.compile(r"\$\{trialSpec\.(.+?)\}")
META_KEYS = ("Name", "Namespace", "Kind", "APIVersion", "Annotations", "Labels")
#: Katib's default filter, used when the Experiment gives none
DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
#: the algorithms of Katib's default katib-config, and the settings its Optuna service accepts (ints >= 0)
ALGORITHMS = "random tpe grid multivariate-tpe cmaes bayesianoptimization hyperband sobol enas darts pbt".split()
OPTUNA_SETTINGS = {
    "tpe": ("n_startup_trials", "n_ei_candidates", "random_state"),
    "random": ("random_state",),
    "grid": ("random_state",),
}
MEDIANSTOP = {"min_trials_required": 1, "start_step": 1}  # setting -> its minimum


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    with open(SCHEMA, encoding="utf-8") as fh:
        definitions = strict(json.load(fh))
    schema = {"$ref": "#/components/schemas/v1beta1.Experiment", "components": definitions["components"]}
    return jsonschema.Draft7Validator(schema)


def experiment_errors(experiment: dict) -> list[str]:
    """What Katib's OpenAPI definition refuses in ``experiment``, one ``path: message`` each."""
    return schema_errors(_validator(), experiment)


def _number(text) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _count_errors(spec: dict) -> list[str]:
    errors = []
    most, parallel, failed = (spec.get(k) for k in ("maxTrialCount", "parallelTrialCount", "maxFailedTrialCount"))
    if failed is not None and failed < 0:
        errors.append("spec.maxFailedTrialCount: should not be less than 0")
    if most is not None and most <= 0:
        errors.append("spec.maxTrialCount: must be greater than 0")
    if parallel is not None and parallel <= 0:
        errors.append("spec.parallelTrialCount: must be greater than 0")
    if None not in (failed, most) and failed > most:
        errors.append("spec.maxFailedTrialCount: should be less than or equal to spec.maxTrialCount")
    if None not in (parallel, most) and parallel > most:
        errors.append("spec.parallelTrialCount: should be less than or equal to spec.maxTrialCount")
    return errors


def _objective_errors(objective: dict) -> list[str]:
    errors = []
    if objective.get("type") not in ("minimize", "maximize"):
        errors.append("spec.objective.type: must be minimize or maximize")
    if not objective.get("objectiveMetricName"):
        errors.append("spec.objective.objectiveMetricName: must be specified")
    if objective.get("objectiveMetricName") in (objective.get("additionalMetricNames") or []):
        errors.append("spec.objective.additionalMetricNames: should not contain the objective metric")
    return errors


def _settings_errors(where: str, settings: list[dict], allowed: dict) -> list[str]:
    errors = []
    for setting in settings:
        minimum = allowed.get(setting["name"])
        if minimum is None:
            errors.append(f"{where}: unknown setting {setting['name']}")
        elif not re.fullmatch(r"\d+", setting["value"]) or int(setting["value"]) < minimum:
            errors.append(f"{where}: {setting['name']} must be an integer >= {minimum}")
    return errors


def _grid_combinations(parameters: list[dict]) -> int | None:
    """Katib's grid: the product of each parameter's values (None when a double has no step)."""
    total = 1
    for param in parameters:
        space = param["feasibleSpace"]
        if param["parameterType"] in ("categorical", "discrete"):
            total *= len(space["list"])
            continue
        if not space.get("step"):
            if param["parameterType"] == "double":
                return None
            total *= int(space["max"]) - int(space["min"]) + 1
            continue
        low, high, step = (float(space[k]) for k in ("min", "max", "step"))
        total *= int(math.floor((high - low) / step + 1e-9)) + 1
    return total


def _algorithm_errors(spec: dict) -> list[str]:
    algorithm = spec.get("algorithm") or {}
    name = algorithm.get("algorithmName", "")
    if name not in ALGORITHMS:
        return [f"spec.algorithm.algorithmName: {name!r} is not in katib-config"]
    allowed = {key: 0 for key in OPTUNA_SETTINGS.get(name, ())}
    errors = _settings_errors("spec.algorithm", algorithm.get("algorithmSettings") or [], allowed)
    if name == "grid":
        combinations = _grid_combinations(spec.get("parameters") or [])
        if combinations is None:
            errors.append("spec.parameters: grid needs a step on every double")
        elif spec.get("maxTrialCount", 0) > combinations:
            errors.append(f"spec.maxTrialCount: more than the grid's {combinations} combinations")
    stopping = spec.get("earlyStopping")
    if stopping:
        if stopping.get("algorithmName") != "medianstop":
            errors.append("spec.earlyStopping.algorithmName: Katib's only one is medianstop")
        errors += _settings_errors("spec.earlyStopping", stopping.get("algorithmSettings") or [], MEDIANSTOP)
    return errors


def _parameter_errors(parameters: list[dict]) -> list[str]:
    errors = []
    for i, param in enumerate(parameters):
        where, kind, space = f"spec.parameters[{i}]", param.get("parameterType"), param.get("feasibleSpace") or {}
        if kind not in ("int", "double", "categorical", "discrete", "unknown"):
            errors.append(f"{where}.parameterType: {kind} is not supported")
        if space.get("distribution", "") not in ("", "uniform", "logUniform", "normal", "logNormal", "unknown"):
            errors.append(f"{where}.feasibleSpace.distribution: {space['distribution']} is not supported")
        if not space:
            errors.append(f"{where}.feasibleSpace: must be specified")
        elif kind in ("int", "double"):
            low, high = _number(space.get("min")), _number(space.get("max"))
            if space.get("list"):
                errors.append(f"{where}.feasibleSpace.list: not supported for {kind}")
            if low is None or high is None or not low < high:  # (the suggestion service's own check)
                errors.append(f"{where}.feasibleSpace: min and max must be numbers, min below max")
            elif space.get("distribution") == "logUniform" and low <= 0:
                errors.append(f"{where}.feasibleSpace.min: a logUniform range starts above 0")
        elif any(space.get(k) for k in ("min", "max", "step")):
            errors.append(f"{where}.feasibleSpace: .max, .min and .step are not supported for {kind}")
    return errors


def _is_meta(reference: str) -> bool:
    match = META.fullmatch(reference)
    if not match:
        return False
    key = match.group(1)
    indexed = re.fullmatch(r"(.+)\[(.+)]", key)
    return key in META_KEYS or bool(indexed and indexed.group(1) in META_KEYS)


def _containers(trial_spec: dict) -> list[str]:
    """The container names of the trial's primary pod (a Job's template; a TrainJob's runtime node)."""
    if trial_spec.get("kind") == "Job":
        return [c.get("name") for c in trial_spec["spec"]["template"]["spec"].get("containers", [])]
    if trial_spec.get("kind") == "TrainJob":
        return ["node"]  # the torch-distributed runtime's trainer container
    return []


def _template_errors(spec: dict) -> list[str]:
    template = spec.get("trialTemplate")
    if not template:
        return ["spec.trialTemplate: must be specified"]
    errors = []
    trial_spec = template.get("trialSpec") or {}
    if template.get("primaryContainerName") not in _containers(trial_spec):
        errors.append("spec.trialTemplate.primaryContainerName: names no container of the trial's pod")
    if not template.get("successCondition") or not template.get("failureCondition"):
        errors.append("spec.trialTemplate: successCondition and failureCondition must be specified")
    names = {p["name"] for p in spec.get("parameters") or []}
    text = json.dumps(trial_spec)
    seen_names, seen_refs = set(), set()
    for i, param in enumerate(template.get("trialParameters") or []):
        name, reference = param.get("name", ""), param.get("reference", "")
        where = f"spec.trialTemplate.trialParameters[{i}]"
        if not name or not reference or "{" in name or "}" in name:
            errors.append(f"{where}: name and reference must be specified, name without braces")
            continue
        if name in seen_names or reference in seen_refs:
            errors.append(f"{where}: name or reference duplicated")
            continue
        seen_names.add(name)
        seen_refs.add(reference)
        if names and not _is_meta(reference) and reference not in names:
            errors.append(f"{where}.reference: {reference} does not exist in spec.parameters")
        placeholder = "${trialParameters." + name + "}"
        if placeholder not in text:
            errors.append(f"{where}.name: {name} is not used in spec.trialTemplate.trialSpec")
        text = text.replace(placeholder, "test-value")
    left = PARAM.findall(text)
    if left:
        errors.append(f"spec.trialTemplate: {left} are not defined in spec.trialTemplate.trialParameters")
    metadata = trial_spec.get("metadata") or {}
    if metadata.get("name") or metadata.get("namespace"):
        errors.append("spec.trialTemplate: metadata.name and metadata.namespace must be omitted")
    if not trial_spec.get("apiVersion") or not trial_spec.get("kind"):
        errors.append("spec.trialTemplate: apiVersion and kind must be specified")
    return errors


def _collector_errors(spec: dict) -> list[str]:
    collector = spec.get("metricsCollectorSpec") or {}
    kind = (collector.get("collector") or {}).get("kind", "StdOut")
    if kind != "StdOut":
        return [f"spec.metricsCollectorSpec.collector.kind: {kind}: only StdOut is written out here"]
    errors = []
    for pattern in ((collector.get("source") or {}).get("filter") or {}).get("metricsFormat") or []:
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.append(f"spec.metricsCollectorSpec.source.filter.metricsFormat: invalid filter: {exc}")
            continue
        if not re.fullmatch(r".*\(.*\).*\(.*\).*", pattern):
            errors.append("spec.metricsCollectorSpec.source.filter.metricsFormat: two top subexpressions are required")
    return errors


def controller_errors(experiment: dict) -> list[str]:
    """What Katib's controller refuses in ``experiment`` (its webhook and its services' setting checks)."""
    name = (experiment.get("metadata") or {}).get("name", "")
    errors = []
    if not re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 40:
        errors.append("metadata.name: a lower-case RFC 1035 label of at most 40 characters")
    spec = experiment.get("spec") or {}
    errors += _count_errors(spec)
    errors += _objective_errors(spec.get("objective") or {})
    errors += _algorithm_errors(spec)
    if not spec.get("parameters"):
        errors.append("spec.parameters: must be specified")
    errors += _parameter_errors(spec.get("parameters") or [])
    errors += _template_errors(spec)
    errors += _collector_errors(spec)
    return errors


def collected(experiment: dict, output: str) -> list[tuple[str, float]]:
    """The (metric, value) pairs Katib's StdOut collector takes from a trial's ``output``, in order: a
    line counts when it holds a metric's name, and each match of a filter whose name group is one of the
    Experiment's metrics is one observation."""
    spec = experiment["spec"]
    metrics = [spec["objective"]["objectiveMetricName"], *spec["objective"].get("additionalMetricNames", [])]
    source = spec.get("metricsCollectorSpec", {}).get("source") or {}
    filters = [re.compile(p) for p in (source.get("filter") or {}).get("metricsFormat") or [DEFAULT_FILTER]]
    found = []
    for line in output.splitlines():
        if not any(m in line for m in metrics):
            continue
        for pattern in filters:
            for match in pattern.finditer(line):
                name, value = match.group(1).strip(), match.group(2).strip()
                if name in metrics:
                    found.append((name, float(value)))
    return found


def substituted(experiment: dict, values: dict, trial_name: str = "posttrain-dpo-search-abc123") -> dict:
    """The trial's job as Katib creates it: each ``${trialParameters.x}`` replaced by its parameter's value
    from ``values`` (by parameter name) or by the trial's metadata, and the trial's name set."""
    template = experiment["spec"]["trialTemplate"]
    text = json.dumps(template["trialSpec"])
    for param in template["trialParameters"]:
        reference = param["reference"]
        value = trial_name if reference == "${trialSpec.Name}" else str(values[reference])
        text = text.replace("${trialParameters." + param["name"] + "}", value)
    job = json.loads(text)
    job.setdefault("metadata", {})["name"] = trial_name
    return job
