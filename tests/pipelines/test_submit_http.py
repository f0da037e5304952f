"""posttrain pipeline submit / schedule with the real kfp.Client against a local KFP API server.

The server below implements the KFP v2beta1 REST calls kfp 2.17's client makes for these commands
(healthz, experiments list/create, runs create, recurringruns create) and records every request,
so the tests assert on what would reach a real Kubeflow Pipelines server.
"""

import json
import os
import re
import shlex
import uuid

import kfp
import pytest
import yaml

from pipelines.commands import posttrain
from tests.http_helpers import serving

API = "/apis/v2beta1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class KfpApi:
    """Just enough of the KFP API server: experiments persist, runs and recurring runs are echoed with ids."""

    def __init__(self, fail_runs_with=None):
        self.experiments: dict = {}
        self.ids: list = []  # run and recurring run ids handed out, in order
        self.runs: dict = {}
        self.fail_runs_with = fail_runs_with

    def handle(self, request):
        route = (request.method, request.path)
        if route == ("GET", f"{API}/healthz"):
            return 200, {"commit_sha": "test", "tag_name": "2.17.0", "multi_user": False}
        if route == ("GET", f"{API}/experiments"):
            (predicate,) = json.loads(request.query["filter"])["predicates"]
            assert predicate["key"] == "display_name" and predicate["operation"] == 1  # EQUALS
            found = [
                e
                for e in self.experiments.values()
                if e["display_name"] == predicate["stringValue"]
                and (e.get("namespace") or "") == request.query.get("namespace", "")
            ]
            return 200, {"experiments": found, "total_size": len(found)} if found else {}
        if route == ("POST", f"{API}/experiments"):
            experiment = {**request.json(), "experiment_id": str(uuid.uuid4()), "storage_state": "AVAILABLE"}
            self.experiments[experiment["experiment_id"]] = experiment
            return 200, experiment
        if route == ("POST", f"{API}/runs"):
            if self.fail_runs_with:
                return self.fail_runs_with
            self.ids.append(str(uuid.uuid4()))
            self.runs[self.ids[-1]] = {
                **request.json(),
                "run_id": self.ids[-1],
                "state": "PENDING",
                "created_at": "2026-11-30T03:00:00Z",
            }
            return 200, self.runs[self.ids[-1]]
        if request.method == "GET" and request.path.removeprefix(f"{API}/runs/") in self.runs:
            return 200, self.runs[request.path.removeprefix(f"{API}/runs/")]
        if route == ("POST", f"{API}/recurringruns"):
            self.ids.append(str(uuid.uuid4()))
            return 200, {**request.json(), "recurring_run_id": self.ids[-1], "status": "ENABLED"}
        return 404, {"code": 5, "message": f"no route {request.method} {request.path}"}


@pytest.fixture
def kfp_server(monkeypatch, tmp_path):
    """A KFP API on a free port; a developer's ~/.config/kfp/context.json and $KFP_TOKEN kept out."""
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "no-context.json"))
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    for var in (
        "KF_PIPELINES_ENDPOINT",
        "KF_PIPELINES_UI_ENDPOINT",
        "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME",
        "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME",
    ):
        monkeypatch.delenv(var, raising=False)
    with serving(KfpApi()) as server:
        yield server
    assert server.errors == []


def posts(server, what):
    return [r for r in server.requests if (r.method, r.path) == ("POST", f"{API}/{what}")]


def all_tasks(pipeline_spec):
    dags = [pipeline_spec["root"], *pipeline_spec["components"].values()]
    return [task for dag in dags for task in (dag.get("dag") or {}).get("tasks", {}).values()]


def test_submit_creates_the_experiment_once_and_a_run_with_typed_parameters(kfp_server, monkeypatch, capsys):
    monkeypatch.setenv("KFP_TOKEN", "tok-123")
    argv = [
        "pipeline",
        "submit",
        "--host",
        kfp_server.url + "/",
        "--experiment",
        "nightly",
        "sft_max_steps=5",
        "sft_lr=2e-5",
        "base_model=s3://models/base",
        "sft_overrides=lora.r=8",
        "sft_overrides=seed=3",
    ]
    assert posttrain(argv) == 0
    assert posttrain(argv) == 0  # a second submit finds the experiment

    assert [(r.method, r.path) for r in kfp_server.requests[:4]] == [
        ("GET", f"{API}/healthz"),
        ("GET", f"{API}/experiments"),
        ("POST", f"{API}/experiments"),
        ("POST", f"{API}/runs"),
    ]
    assert all(r.headers["authorization"] == "Bearer tok-123" for r in kfp_server.requests)
    (experiment,) = posts(kfp_server, "experiments")
    assert experiment.json()["display_name"] == "nightly"
    first, second = (r.json() for r in posts(kfp_server, "runs"))
    experiment_id = next(iter(kfp_server.app.experiments))
    assert first["experiment_id"] == second["experiment_id"] == experiment_id
    assert re.fullmatch(r"posttrain-sft \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", first["display_name"])

    spec = first["pipeline_spec"]["pipeline_spec"]
    assert spec["pipelineInfo"]["name"] == "posttrain-sft"
    assert {"sft_max_steps", "sft_lr", "base_model"} <= set(spec["root"]["inputDefinitions"]["parameters"])
    assert "platform_spec" in first["pipeline_spec"]  # the kfp-kubernetes settings (secrets, tolerations) travel too
    parameters = first["runtime_config"]["parameters"]
    assert parameters == {
        "sft_max_steps": 5,
        "sft_lr": 2e-5,
        "base_model": "s3://models/base",
        "sft_overrides": ["lora.r=8", "seed=3"],
    }
    assert type(parameters["sft_max_steps"]) is int and type(parameters["sft_lr"]) is float
    tasks = [t for t in all_tasks(spec) if "dag" not in spec["components"][t["componentRef"]["name"]]]  # (not groups)
    cached = {t["taskInfo"]["name"]: t["cachingOptions"].get("enableCache", False) for t in tasks}
    assert cached == {
        **{name: True for name in cached},
        "deploy SFT": False,  # as compiled: these never cached
        "fingerprint sources": False,
        "check config": False,
        "notify": False,
    }

    out = capsys.readouterr().out
    for run_id in kfp_server.app.ids:
        assert f"submitted posttrain-sft run {run_id}\nrun: {kfp_server.url}/#/runs/details/{run_id}\n" in out


def test_submit_no_cache_turns_caching_off_in_every_sub_dag(kfp_server):
    assert (
        posttrain(
            [
                "pipeline",
                "submit",
                "--host",
                kfp_server.url,
                "--pipeline",
                "posttrain-rlhf",
                "--no-cache",
                "--namespace",
                "team-a",
                "--service-account",
                "posttrain",
                "--run-name",
                "rlhf nightly",
            ]
        )
        == 0
    )
    (run,) = posts(kfp_server, "runs")
    body = run.json()
    spec = body["pipeline_spec"]["pipeline_spec"]
    tasks = all_tasks(spec)
    assert len(tasks) > len(spec["root"]["dag"]["tasks"])  # there are tasks inside conditions
    # proto3 JSON leaves a false bool out: {} is enableCache=false, as KFP's backend reads it
    assert all(t["cachingOptions"].get("enableCache", False) is False for t in tasks)
    assert (body["display_name"], body["service_account"]) == ("rlhf nightly", "posttrain")
    assert posts(kfp_server, "experiments")[0].json()["namespace"] == "team-a"
    assert not [r for r in kfp_server.requests if r.path.endswith("/healthz")]  # namespace given: no discovery


def test_schedule_creates_a_recurring_run_with_kfp_cron(kfp_server, capsys):
    assert (
        posttrain(
            [
                "pipeline",
                "schedule",
                "--host",
                kfp_server.url,
                "--cron",
                "0 3 * * 0",
                "--namespace",
                "team-a",
                "--max-concurrency",
                "2",
                "--experiment",
                "weekly",
                "sft_lr=1e-5",
                "sft_max_steps=100",
            ]
        )
        == 0
    )
    (experiment,) = posts(kfp_server, "experiments")
    assert experiment.json() == {"display_name": "weekly", "namespace": "team-a"}
    (recurring,) = posts(kfp_server, "recurringruns")
    body = recurring.json()
    assert body["experiment_id"] == next(iter(kfp_server.app.experiments))
    assert body["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * 0"}}  # KFP's 6 fields, seconds first
    assert int(body["max_concurrency"]) == 2 and body["no_catchup"] is True and body["mode"] == "ENABLE"
    assert body["display_name"] == "posttrain-sft (0 3 * * 0)"
    assert body["runtime_config"]["parameters"] == {"sft_lr": 1e-5, "sft_max_steps": 100}
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "posttrain-sft"
    (rr_id,) = kfp_server.app.ids
    out = capsys.readouterr().out
    assert f"scheduled posttrain-sft with cron '0 0 3 * * 0' as recurring run {rr_id}\n" in out
    assert f"recurring run: {kfp_server.url}/#/recurringrun/details/{rr_id}\n" in out


def test_the_deprecated_lr_reaches_runs_and_schedules_as_sft_lr(kfp_server, capsys):
    assert posttrain(["pipeline", "submit", "--host", kfp_server.url, "lr=2e-5"]) == 0
    assert posttrain(["pipeline", "schedule", "--host", kfp_server.url, "--cron", "0 3 * * 0", "lr=2e-5"]) == 0
    (run,), (recurring,) = posts(kfp_server, "runs"), posts(kfp_server, "recurringruns")
    assert run.json()["runtime_config"]["parameters"] == recurring.json()["runtime_config"]["parameters"]
    assert run.json()["runtime_config"]["parameters"] == {"sft_lr": 2e-5}
    assert capsys.readouterr().err.count("warning: posttrain-sft: parameter lr is deprecated, use sft_lr\n") == 2


def test_server_errors_and_unreachable_hosts_are_one_line_and_exit_1(kfp_server, capsys):
    kfp_server.app.fail_runs_with = (400, {"code": 3, "message": "Invalid input error: parameter lr is not a number"})
    assert posttrain(["pipeline", "submit", "--host", kfp_server.url, "lr=0.1"]) == 1
    err = capsys.readouterr().err
    assert f"error: the KFP API at {kfp_server.url} answered HTTP 400: Invalid input error: parameter lr" in err
    assert "Traceback" not in err

    with serving(KfpApi()) as gone:
        url = gone.url  # a port that nothing listens on once this block ends
    assert posttrain(["pipeline", "schedule", "--host", url, "--namespace", "ns", "--cron", "0 3 * * 0"]) == 1
    assert f"error: cannot reach the KFP API at {url}" in capsys.readouterr().err


def test_the_readme_kfp_cli_line_submits_the_committed_pipeline_with_typed_parameters(kfp_server):
    """The ``kfp run create`` of docs/pipelines.md (the kfp CLI, for CI without posttrain) does what submit does."""
    from click.testing import CliRunner
    from kfp.cli.cli import cli

    package = os.path.join(ROOT, "pipelines", "compiled", "posttrain-dpo.yaml")
    result = CliRunner().invoke(
        cli,
        [
            "--endpoint",
            kfp_server.url,
            "run",
            "create",
            "--experiment-name",
            "posttrain",
            "--package-file",
            package,
            "sft_max_steps=5",
            'dpo_overrides=["beta=0.2"]',
        ],
        obj={},
    )
    assert result.exit_code == 0, result.output
    (run,) = posts(kfp_server, "runs")
    body = run.json()
    assert body["runtime_config"]["parameters"] == {"sft_max_steps": 5, "dpo_overrides": ["beta=0.2"]}
    with open(package, encoding="utf-8") as fh:
        committed = next(yaml.safe_load_all(fh))
    assert body["pipeline_spec"]["pipeline_spec"] == committed


def test_the_example_ci_job_submits_on_merge(kfp_server, monkeypatch, capsys):
    """examples/ci/submit-on-merge.yml's posttrain commands, run as the job would (secrets filled in)."""
    with open(os.path.join(ROOT, "examples", "ci", "submit-on-merge.yml"), encoding="utf-8") as fh:
        job = yaml.safe_load(fh)
    assert job[True] == {"push": {"branches": ["main"]}}  # YAML 1.1 reads the key `on` as True
    steps = job["jobs"]["submit"]["steps"]
    commands = [
        shlex.split(
            step["run"].replace("${{ secrets.KFP_HOST }}", kfp_server.url).replace("${{ github.sha }}", "abc123")
        )
        for step in steps
        if "run" in step
    ]
    posttrain_commands = [c for c in commands if c[0] == "posttrain"]
    assert [c[:3] for c in posttrain_commands] == [
        ["posttrain", "pipeline", "compile"],
        ["posttrain", "pipeline", "submit"],
    ]
    submit_step = next(s for s in steps if "submit" in s.get("run", ""))
    monkeypatch.setenv("KFP_TOKEN", "ci-token")
    assert submit_step["env"] == {"KFP_TOKEN": "${{ secrets.KFP_TOKEN }}"}
    assert posttrain(posttrain_commands[1][1:]) == 0
    (run,) = posts(kfp_server, "runs")
    assert run.headers["authorization"] == "Bearer ci-token"
    assert run.json()["display_name"] == "dpo abc123"
    assert run.json()["runtime_config"]["parameters"]["dpo_max_steps"] == 1000
    assert "submitted posttrain-dpo run" in capsys.readouterr().out
