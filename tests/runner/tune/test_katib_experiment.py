"""posttrain tune --target katib: the Experiment validates against Katib's OpenAPI definition and its
controller's rules, its trials run what the training components run, and its collector reads what the
trial prints. No cluster: tests/manifests/katib_schema.py says what each check stands for."""

import copy
import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from components.common import CUDA_IMAGE, IMAGE, training_node
from pipelines.commands import posttrain
from tests.conftest import REPO
from tests.manifests.crd_schema import trainjob_errors
from tests.manifests.katib_schema import collected, controller_errors, experiment_errors, substituted
from tests.runner.tune.tune_helpers import FAKE_STAGE
from trainer_lib.errors import ConfigError
from trainer_lib.runner.tune.katib_experiment import BASE_ENV, ClusterDefaults, build_experiment
from trainer_lib.runner.tune.search_config import load_search

CLUSTER = ClusterDefaults(IMAGE, CUDA_IMAGE, training_node)
VALUES = {"lr": "3.1e-05", "beta": "0.16"}  # what Katib's suggestion would hand a trial


def dpo_search(tmp_path, **changes) -> str:
    """The acceptance search of issue 47 (DPO, lr on a log scale and beta, 8 trials, 2 at once, ranked by
    logps/accuracy on held-out pairs), its data in an object store the trial pods reach."""
    search = {
        "stage": "dpo",
        "overrides": {
            "model.path": "s3://bucket/models/sft",
            "data.path": "s3://bucket/data/preferences.jsonl",
            "data.eval_path": "s3://bucket/data/preferences_eval.jsonl",
            "max_steps": 60,
            "eval_steps": 20,
        },
        "space": {"lr": {"low": 1.0e-6, "high": 1.0e-4, "log": True}, "beta": {"low": 0.02, "high": 0.5}},
        "objective": {"metric": "logps/accuracy", "direction": "maximize"},
        "n_trials": 8,
        "parallel": 2,
        "output_dir": "s3://bucket/tune-dpo",
        **changes,
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(search))
    return str(path)


def experiment(tmp_path, **changes) -> dict:
    return build_experiment(load_search(dpo_search(tmp_path, **changes)), CLUSTER)


def test_the_dpo_search_as_an_experiment_validates_against_katibs_schema_and_rules(tmp_path, capsys):
    out = tmp_path / "experiment.yaml"
    assert posttrain(["tune", "--config", dpo_search(tmp_path), "--target", "katib", "--out", str(out)]) == 0
    assert "kubectl apply -f" in capsys.readouterr().err
    written = yaml.safe_load(out.read_text())
    assert experiment_errors(written) == [] and controller_errors(written) == []
    spec = written["spec"]
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["algorithm"]["algorithmName"]) == (8, 2, "tpe")
    params = {p["name"]: p for p in spec["parameters"]}
    assert params["lr"] == {
        "name": "lr",
        "parameterType": "double",
        "feasibleSpace": {"min": "1e-06", "max": "0.0001", "distribution": "logUniform"},
    }
    assert params["beta"]["feasibleSpace"]["distribution"] == "uniform"
    assert spec["objective"]["metricStrategies"] == [{"name": "logps/accuracy", "value": "latest"}]
    # the trial's Job as Katib creates it is a valid batch/v1 Job
    job = substituted(written, VALUES)
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE and "resources" in container and "nvidia.com/gpu" not in str(container)


def test_the_trial_command_reaches_the_stage_with_the_base_config_and_the_trials_values(tmp_path):
    """The container's command, run as Katib's StdOut collector wraps it (sh -c, output to its metrics
    file), hands posttrain the wrapper's options, the base config's text as one argument, and each value."""
    exp = experiment(tmp_path)
    job = substituted(exp, VALUES)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    shim = tmp_path / "bin" / "posttrain"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    shim.chmod(0o755)
    log = tmp_path / "metrics.log"
    wrapped = f"{container['args'][0]} 1>{log} 2>&1 && echo completed"
    assert container["command"] == ["sh", "-c"]
    subprocess.run(["sh", "-c", wrapped], env={**env, "PATH": f"{shim.parent}:/usr/bin:/bin"}, check=True)
    argv = json.loads(log.read_text())
    trial_dir = "s3://bucket/tune-dpo/trials/posttrain-dpo-search-abc123"
    assert argv[: argv.index("--")] == ["tune-trial", "--metric", "logps/accuracy", "--output-dir", trial_dir]
    stage = argv[argv.index("--") + 1 :]
    assert stage[:3] == ["posttrain", "dpo", "--config-yaml"] and stage[3] == env[BASE_ENV]
    assert sorted(stage[4:]) == ["beta=0.16", "lr=3.1e-05", f"output_dir={trial_dir}"]
    from trainer_lib.runner.stage_api import stage_config

    cfg = stage_config("dpo", stage[4:], stage[3])
    assert (cfg.lr, cfg.beta, cfg.max_steps, cfg.output_dir) == (3.1e-05, 0.16, 60, trial_dir)


def test_a_gpu_search_runs_the_cuda_image_with_the_training_components_resources(tmp_path):
    exp = experiment(tmp_path, katib={"gpus_per_step": 2})
    assert experiment_errors(exp) == [] and controller_errors(exp) == []
    pod = substituted(exp, VALUES)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    node = training_node(2)
    assert container["image"] == CUDA_IMAGE
    assert container["resources"] == node.resources()
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == "2"
        == container["resources"]["requests"]["nvidia.com/gpu"]
    )
    assert pod["tolerations"] == [dict(t) for t in node.tolerations]
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": node.shm}
    assert "posttrain dpo --nproc 2" in container["args"][0]


def test_a_multi_node_search_runs_each_trial_as_a_trainjob(tmp_path):
    exp = experiment(tmp_path, katib={"gpus_per_step": 8, "nodes": 2})
    assert experiment_errors(exp) == [] and controller_errors(exp) == []
    template = exp["spec"]["trialTemplate"]
    assert template["primaryContainerName"] == "node" and template["primaryPodLabels"]
    job = substituted(exp, VALUES)
    assert trainjob_errors(job) == []
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == CUDA_IMAGE and trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"] == training_node(8).resources()
    assert "posttrain dpo --nproc 8" in trainer["args"][0]


def test_the_validators_catch_broken_experiments(tmp_path):
    good = experiment(tmp_path)

    def broken(change) -> dict:
        exp = copy.deepcopy(good)
        change(exp)
        return exp

    def args(exp) -> list:
        return exp["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0]["args"]

    undefined = broken(lambda e: args(e).__setitem__(0, args(e)[0] + " x=${trialParameters.x}"))
    assert "not defined in spec.trialTemplate.trialParameters" in " ".join(controller_errors(undefined))
    too_parallel = broken(lambda e: e["spec"].__setitem__("parallelTrialCount", 9))
    assert controller_errors(too_parallel) == [
        "spec.parallelTrialCount: should be less than or equal to spec.maxTrialCount"
    ]
    unmapped = broken(lambda e: e["spec"]["trialTemplate"]["trialParameters"][0].__setitem__("reference", "lrr"))
    assert "lrr does not exist in spec.parameters" in " ".join(controller_errors(unmapped))
    as_number = broken(lambda e: e["spec"]["parameters"][0]["feasibleSpace"].__setitem__("min", 1e-6))
    assert experiment_errors(as_number) == ["spec.parameters.0.feasibleSpace.min: 1e-06 is not of type 'string'"]
    unknown = broken(lambda e: e["spec"]["objective"].__setitem__("metric", "logps/accuracy"))
    assert "Additional properties are not allowed ('metric' was unexpected)" in experiment_errors(unknown)[0]


def test_katibs_collector_reads_the_objective_that_tune_trial_prints(tmp_path):
    """tune-trial on a stand-in stage: Katib's parser, with the Experiment's filter, finds the objective at
    every eval but step 0, then the stage's final held-out figure last (the trial's ``latest`` value)."""
    exp = experiment(tmp_path)
    trial_dir = tmp_path / "0000"
    config = tmp_path / "trial.yaml"
    config.write_text(yaml.safe_dump({"output_dir": str(trial_dir), "lr": 1e-3, "max_steps": 6, "eval_steps": 2}))
    stage = [sys.executable, FAKE_STAGE, "--config", str(config)]
    result = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "tune-trial", "--metric", "logps/accuracy"]
        + ["--output-dir", str(trial_dir), "--", *stage],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    found = collected(exp, result.stdout + result.stderr)
    final = json.loads((trial_dir / "summary.json").read_text())["eval"]["logps/accuracy"]
    assert [name for name, _ in found] == ["logps/accuracy"] * 4  # evals at steps 2, 4, 6, then the summary's
    assert found[-1][1] == pytest.approx(final) and found[0][1] == pytest.approx(final * 2 / 6)
    assert all(line.split(" ", 1)[0].endswith("+00:00") for line in result.stdout.splitlines())  # RFC 3339 first
    renamed = copy.deepcopy(exp)
    renamed["spec"]["objective"]["objectiveMetricName"] = "eval_loss"
    assert collected(renamed, result.stdout) == []  # a metric the trial does not print is never collected


def test_the_median_pruner_maps_to_medianstop(tmp_path):
    stopping = experiment(tmp_path, pruner={"kind": "median", "startup_trials": 3, "warmup_steps": 30})
    settings = {s["name"]: s["value"] for s in stopping["spec"]["earlyStopping"]["algorithmSettings"]}
    assert settings == {"min_trials_required": "3", "start_step": "2"}  # evals at 20, 40: prunable from 40
    assert "earlyStopping" not in experiment(tmp_path, pruner={"kind": "none"})["spec"]


def test_grid_needs_a_finite_space_and_fits_katibs_grid(tmp_path):
    space = {"lr": {"choices": [1e-5, 1e-4]}, "beta": {"low": 0.1, "high": 0.3, "step": 0.1}}
    exp = experiment(tmp_path, space=space, sampler={"kind": "grid"}, n_trials=6)
    assert exp["spec"]["algorithm"]["algorithmName"] == "grid" and controller_errors(exp) == []
    params = {
        p.key: p for p in load_search(dpo_search(tmp_path, space=space, sampler={"kind": "grid"}, n_trials=6)).params
    }
    assert params["beta"].grid_values() == [0.1, 0.2, 0.3] and params["lr"].grid_values() == [1e-5, 1e-4]
    with pytest.raises(ConfigError, match="n_trials: 7 is more than the grid's 6 combinations"):
        load_search(dpo_search(tmp_path, space=space, sampler={"kind": "grid"}, n_trials=7))
    with pytest.raises(ConfigError, match="sampler.kind grid needs a step on a float range"):
        load_search(dpo_search(tmp_path, sampler={"kind": "grid"}))


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"pruner": {"kind": "halving"}}, "pruner.kind: halving has no Katib counterpart"),
        (
            {
                "trial_seed": "per_trial",
                "overrides": {"model.path": "s3://b/m", "data.path": "s3://b/d.jsonl", "data.eval_by": "hash"},
            },
            "trial_seed: per_trial needs a trial number",
        ),
        (
            {
                "space": {
                    "loss": {"choices": ["sigmoid", "ipo"]},
                    "label_smoothing": {"low": 0.0, "high": 0.2, "when": {"loss": "sigmoid"}},
                },
                "objective": {"metric": "logps/accuracy"},
            },
            "space.label_smoothing.when: Katib has no conditional parameters",
        ),
        ({"katib": {"nodes": 2}, "output_dir": "runs/tune"}, "output_dir: a TrainJob trial (katib.nodes > 1)"),
        (
            {"evaluate": {"tasks.path": "s3://b/tasks.jsonl"}, "objective": {"metric": "task_pass_rate"}},
            "evaluate: --target katib ranks trials by the stage's own held-out eval only",
        ),
    ],
)
def test_what_katib_cannot_run_is_refused_in_one_line(tmp_path, changes, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        experiment(tmp_path, **changes)


def test_a_local_path_the_trial_pods_cannot_read_is_refused(tmp_path, capsys):
    path = dpo_search(tmp_path, overrides={"model.path": "/home/me/sft", "data.path": "s3://b/d.jsonl"})
    assert posttrain(["tune", "--config", path, "--target", "katib"]) == 2
    err = capsys.readouterr().err
    assert "model.path: '/home/me/sft' is a path on the launcher's disk, which the trial pods" in err
