"""``posttrain tune --config tune.yaml --target katib``: the same search as a Katib ``Experiment``.

    experiment = build_experiment(load_search("tune.yaml"), ClusterDefaults(IMAGE, CUDA_IMAGE, training_node))

Fields as in Katib v0.19 (``kubeflow.org/v1beta1``); docs/tuning.md says how to submit it and read it.

* Parameters: a float range is ``double``, an int range ``int`` (``log: true`` is ``distribution:
  logUniform``, ``step`` is ``step``), choices are ``categorical``; Katib writes every bound as text.
* The algorithm is the file's sampler (``tpe``, ``random``, ``grid``), seeded with its ``seed``.
* Early stopping: Katib's only algorithm is ``medianstop``; :func:`early_stopping` maps the median pruner
  onto it and says where the two differ.
* Each trial is a ``batch/v1`` Job (or, with ``katib.nodes`` > 1, a Kubeflow Trainer ``TrainJob`` built
  by :func:`trainer_lib.runner.trainjob.build_trainjob`) running ``posttrain tune-trial``, which runs the
  stage with the base config (its YAML text in ``POSTTRAIN_TUNE_BASE``) and each searched value as a
  ``key=${trialParameters.x}`` override, and prints the eval records' objective as
  ``<RFC 3339 time> posttrain-metric <name>=<value>`` lines (:mod:`~trainer_lib.runner.tune.katib_trial`).
  Katib's ``StdOut`` collector reads them with the filter :data:`METRICS_FORMAT`, and keeps the latest
  value, the held-out figure of the finished stage, as the trial's objective.
* Pods hold what the training components' pods hold: ``ClusterDefaults.node(gpus, accelerator)``
  (``components.common.training_node``, handed in by the ``posttrain`` command) gives the accelerators,
  host CPU and memory per GPU, GPU tolerations and node selector, and a memory-backed ``/dev/shm``.

What Katib cannot express is refused before anything is written, in one line naming the key (exit 2):
conditional keys (``when``), ``trial_seed: per_trial`` (a trial has no number), the halving pruner, and a
local path the trial pods cannot read.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Callable

from trainer_lib import storage
from trainer_lib.errors import ConfigError
from trainer_lib.runner.stage_api import config_text
from trainer_lib.runner.trainjob import (
    RUNTIME_CONTAINER,
    NodeResources,
    build_trainjob,
    check_read_paths,
    object_store_env,
)
from trainer_lib.runner.tune.search_config import Param, Search

API_VERSION, KIND = "kubeflow.org/v1beta1", "Experiment"
#: what starts each line of a trial's output that Katib's collector reads
METRIC_MARK = "posttrain-metric"
#: Katib's filter (``metricsFormat``): two groups, the metric's name and its value
METRICS_FORMAT = METRIC_MARK + r" ([\w./-]+)=([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)"
#: the environment variable that carries the base config's YAML text to a trial
BASE_ENV = "POSTTRAIN_TUNE_BASE"
#: a trial's output folder in its pod, when the search's output_dir is not an object store
POD_OUTPUT_DIR = "/tmp/posttrain-trial"
JOB_CONTAINER = "trial"
#: when Katib counts a trial's Job or TrainJob as done (the defaults it sets for both kinds, written out)
SUCCESS = 'status.conditions.#(type=="Complete")#|#(status=="True")#'
FAILURE = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
#: the pod of a TrainJob trial that Katib reads metrics from: the first node
TRAINJOB_PRIMARY = {"jobset.sigs.k8s.io/replicatedjob-name": "node", "batch.kubernetes.io/job-completion-index": "0"}


@dataclasses.dataclass(frozen=True)
class ClusterDefaults:
    """What the trials run in when the search file does not say: our CPU and CUDA images, and what a pod
    holding N accelerators gets (``node(gpus, accelerator)``). The ``posttrain`` command hands in the
    components' own (components/common.py), which this layer cannot import."""

    cpu_image: str = ""
    cuda_image: str = ""
    node: Callable[[int, str], NodeResources] | None = None


def build_experiment(search: Search, cluster: ClusterDefaults | None = None) -> dict:
    """The Katib ``Experiment`` of a checked search; a ConfigError for what Katib cannot run."""
    tune, katib = search.tune, search.tune.katib
    cluster = cluster or ClusterDefaults()
    check_katib(search)
    spec = {
        "objective": objective(search),
        "algorithm": algorithm(search),
        "parallelTrialCount": tune.parallel,
        "maxTrialCount": tune.n_trials,
        "maxFailedTrialCount": tune.n_trials if katib.max_failed_trials < 0 else katib.max_failed_trials,
        "parameters": [parameter(p) for p in search.params],
        "metricsCollectorSpec": {
            "collector": {"kind": "StdOut"},
            "source": {"filter": {"metricsFormat": [METRICS_FORMAT]}},
        },
        "trialTemplate": trial_template(search, cluster),
    }
    stopping = early_stopping(search)
    if stopping:
        spec["earlyStopping"] = stopping
    metadata = {"name": experiment_name(search), "labels": {"app.kubernetes.io/part-of": "posttrain"}}
    if katib.namespace:
        metadata["namespace"] = katib.namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def check_katib(search: Search) -> None:
    tune, katib = search.tune, search.tune.katib
    conditional = next((p for p in search.params if p.when), None)
    if conditional:
        raise ConfigError(
            f"space.{conditional.key}.when: Katib has no conditional parameters; search it always or fix it"
        )
    if tune.trial_seed == "per_trial":
        raise ConfigError("trial_seed: per_trial needs a trial number, which Katib trials do not have; use same")
    if tune.evaluate:
        raise ConfigError(
            "evaluate: --target katib ranks trials by the stage's own held-out eval only; run this search locally "
            "(posttrain tune), or rank by a stage metric on Katib"
        )
    if tune.pruner.metric and tune.pruner.metric != tune.objective.metric:
        raise ConfigError("pruner.metric: Katib's early stopping reads the objective metric only; leave it out")
    if katib.nodes < 1 or katib.gpus_per_step < 0:
        raise ConfigError(f"katib: expected nodes >= 1, gpus_per_step >= 0; got {katib.nodes}, {katib.gpus_per_step}")
    if katib.nodes > 1 and not storage.is_shared(tune.output_dir):
        raise ConfigError(
            f"output_dir: a TrainJob trial (katib.nodes > 1) writes to an object-store prefix every node sees "
            f"(s3://, gs://...), got {tune.output_dir!r}"
        )
    check_read_paths(search.stage_config({}, POD_OUTPUT_DIR), "the trial pods")


def experiment_name(search: Search) -> str:
    """The search file's ``katib.name``, else ``posttrain-<stage>-<study_name>``: an RFC 1035 label of at
    most 40 characters, as Katib's webhook asks."""
    tune = search.tune
    if tune.katib.name:
        return tune.katib.name
    slug = re.sub(r"[^a-z0-9]+", "-", f"posttrain-{tune.stage}-{tune.study_name}".lower())
    return slug[:40].strip("-")


def objective(search: Search) -> dict:
    """The objective; Katib keeps a trial's ``latest`` value, the finished stage's held-out figure, as the
    local search ranks by ``summary.json``'s final eval (its default would be the best value seen)."""
    tune = search.tune
    spec = {
        "type": tune.objective.direction,
        "objectiveMetricName": tune.objective.metric,
        "metricStrategies": [{"name": tune.objective.metric, "value": "latest"}],
    }
    if tune.katib.goal is not None:
        spec["goal"] = float(tune.katib.goal)
    return spec


def algorithm(search: Search) -> dict:
    """The sampler as Katib's algorithm of the same name (Katib runs Optuna's for all three)."""
    sampler = search.tune.sampler
    settings = {"random_state": str(search.tune.seed)}
    if sampler.kind == "tpe":
        settings = {"n_startup_trials": str(sampler.startup_trials), **settings}
    return {
        "algorithmName": sampler.kind,
        "algorithmSettings": [{"name": key, "value": value} for key, value in settings.items()],
    }


def number(value: float, kind: str) -> str:
    return str(int(value)) if kind == "int" else repr(float(value))


def parameter(param: Param) -> dict:
    """One searched key as a Katib parameter, named as the stage key."""
    if param.kind == "categorical":
        space = {"list": [choice_text(param.key, c) for c in param.choices]}
        return {"name": param.key, "parameterType": "categorical", "feasibleSpace": space}
    space = {
        "min": number(param.low, param.kind),
        "max": number(param.high, param.kind),
        "distribution": "logUniform" if param.log else "uniform",
    }
    if param.step is not None:
        space["step"] = number(param.step, param.kind)
    return {"name": param.key, "parameterType": "double" if param.kind == "float" else "int", "feasibleSpace": space}


def choice_text(key: str, choice) -> str:
    """A choice as the text Katib hands the trial, which reads it back as ``key=text`` does."""
    text = "true" if choice is True else "false" if choice is False else "null" if choice is None else str(choice)
    if "'" in text or "$" in text:  # it goes into the trial's shell command inside single quotes
        raise ConfigError(f"space.{key}.choices: {text!r}: a Katib choice cannot hold ' or $")
    return text


def early_stopping(search: Search) -> dict | None:
    """The pruner as Katib's ``medianstop`` (None: no early stopping).

    Optuna's median pruner, after ``startup_trials`` trials finished, prunes at every eval (from
    ``warmup_steps`` on) a trial whose best value so far is worse than the median of the finished trials'
    values at that step. Katib's medianstop, once ``min_trials_required`` trials succeeded, checks a trial
    once, at its ``start_step``-th reported value: its best value so far against the mean over the
    succeeded trials of their first ``start_step`` values. So ``min_trials_required`` is
    ``startup_trials`` and ``start_step`` is the first eval a local trial could be pruned at, counted in
    evals (``tune-trial`` prints no step-0 eval, as the local pruner reads none).
    """
    pruner = search.tune.pruner
    if pruner.kind == "none":
        return None
    if pruner.kind != "median":
        raise ConfigError(
            f"pruner.kind: {pruner.kind} has no Katib counterpart (Katib stops trials early only with medianstop); "
            "use median or none"
        )
    eval_steps = getattr(search.stage_config({}, POD_OUTPUT_DIR), "eval_steps", 0)
    if not eval_steps:
        return None  # no eval while training: nothing to stop a trial on, here or locally
    start_step = max(1, math.ceil(pruner.warmup_steps / eval_steps))
    settings = {"min_trials_required": str(max(1, pruner.startup_trials)), "start_step": str(start_step)}
    return {"algorithmName": "medianstop", "algorithmSettings": [{"name": k, "value": v} for k, v in settings.items()]}


def trial_parameter_name(key: str) -> str:
    """``lora.r`` -> ``lora_r``: the name a template uses as ``${trialParameters.lora_r}``."""
    return re.sub(r"[^A-Za-z0-9]", "_", key)


def trial_command(search: Search, output_dir: str, processes: int) -> str:
    """The shell command a trial's container runs (Katib's StdOut collector wraps it as ``sh -c``, so
    it is one shell command, each argument quoted)."""
    tune = search.tune
    stage = ["posttrain", tune.stage, *(["--nproc", str(processes)] if processes > 1 else [])]
    overrides = [f"{p.key}=${{trialParameters.{trial_parameter_name(p.key)}}}" for p in search.params]
    wrapper = ["posttrain", "tune-trial", "--metric", tune.objective.metric, "--output-dir", output_dir, "--"]
    words = [*wrapper, *stage]
    quoted = [shlex.quote(word) for word in words]
    rest = [shlex.quote(word) for word in [*overrides, f"output_dir={output_dir}"]]
    return " ".join([*quoted, "--config-yaml", f'"${BASE_ENV}"', *rest])


def trial_template(search: Search, cluster: ClusterDefaults) -> dict:
    """``spec.trialTemplate``: its parameters and a Job (or TrainJob) that runs one trial."""
    tune, katib = search.tune, search.tune.katib
    per_trial = storage.is_shared(tune.output_dir)
    output_dir = f"{tune.output_dir.rstrip('/')}/trials/${{trialParameters.trialName}}" if per_trial else POD_OUTPUT_DIR
    base = config_text(search.stage_config({}, POD_OUTPUT_DIR))
    gpus = katib.gpus_per_step
    image = katib.image or (cluster.cuda_image if gpus > 0 else cluster.cpu_image)
    if not image:
        raise ConfigError("katib.image: required (only the posttrain command knows our images)")
    accelerator = katib.accelerator or "nvidia.com/gpu"
    node = cluster.node(gpus, accelerator) if cluster.node else NodeResources(gpus=gpus, accelerator=accelerator)
    if gpus == 0:  # a CPU trial: no GPU toleration or node selector
        node = dataclasses.replace(node, tolerations=(), node_selector={})
    command = trial_command(search, output_dir, max(gpus, 1))
    env = object_store_env(extra={BASE_ENV: base})
    kind = "TrainJob" if katib.nodes > 1 else "Job"
    if kind == "Job":
        spec, container = trial_job(image, command, env, node, tune.trial_timeout_s), JOB_CONTAINER
    else:
        spec, container = trial_trainjob(search, image, command, env, node, max(gpus, 1)), RUNTIME_CONTAINER
    parameters = [{"name": trial_parameter_name(p.key), "reference": p.key} for p in search.params]
    if per_trial:
        parameters.append({"name": "trialName", "reference": "${trialSpec.Name}"})
    template = {
        "primaryContainerName": container,
        "successCondition": SUCCESS,
        "failureCondition": FAILURE,
        "trialParameters": parameters,
        "trialSpec": spec,
    }
    if kind == "TrainJob":
        template["primaryPodLabels"] = dict(TRAINJOB_PRIMARY)
    return template


def trial_job(image: str, command: str, env: list[dict], node: NodeResources, timeout_s: float) -> dict:
    """A ``batch/v1`` Job of one pod, which is not restarted: a trial that fails (out of memory, a NaN) is
    recorded failed and the search goes on, as locally."""
    container = {"name": JOB_CONTAINER, "image": image, "command": ["sh", "-c"], "args": [command], "env": env}
    if node.resources():
        container["resources"] = node.resources()
    pod = node.pod_settings(JOB_CONTAINER)
    mounts = pod.pop("containers", [])
    if mounts:
        container["volumeMounts"] = mounts[0]["volumeMounts"]
    pod_spec = {"restartPolicy": "Never", "containers": [container], **pod}
    job_spec = {
        "backoffLimit": 0,
        "template": {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}, "spec": pod_spec},
    }
    if timeout_s:
        job_spec["activeDeadlineSeconds"] = int(math.ceil(timeout_s))
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": job_spec}


def trial_trainjob(
    search: Search, image: str, command: str, env: list[dict], node: NodeResources, processes: int
) -> dict:
    """A TrainJob of ``katib.nodes`` nodes, built as the pipeline's multi-node steps build theirs; each node
    runs the trial's command (``posttrain <stage> --nproc N`` under ``tune-trial``), and Katib reads the
    first node's output, where rank 0 writes the eval records."""
    tune = search.tune
    job = build_trainjob(
        "katib-trial",
        tune.stage,
        "",
        image=image,
        num_nodes=tune.katib.nodes,
        nproc_per_node=processes,
        node=node,
        env=env,
        active_deadline_s=int(math.ceil(tune.trial_timeout_s)) or None,
    )
    del job["metadata"]["name"]  # Katib names each trial's job itself
    job["spec"]["trainer"]["command"] = ["sh", "-c"]
    job["spec"]["trainer"]["args"] = [command]
    return job
