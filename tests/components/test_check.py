"""The DAG's first task checks the run's stage configs from the KFP API, as a UI or scheduled run gives them.

A local HTTP server plays the KFP API; runs reach it the way ``kfp run create`` or the UI would send
them (the real ``kfp.Client``, no ``posttrain`` check on the way), then the ``check config`` component
reads them back over HTTP.
"""

import json
import uuid

import kfp
import pytest
from google.protobuf import json_format

from components.check import check_config
from pipelines.dag import PIPELINES
from tests.http_helpers import serving

API = "/apis/v2beta1"


class RunStore:
    """Runs and pipeline versions, created and read back as the KFP API server does."""

    def __init__(self):
        self.runs, self.versions = {}, {}

    def handle(self, request):
        parts = request.path.removeprefix(API).strip("/").split("/")
        if (request.method, parts) == ("GET", ["healthz"]):
            return 200, {"multi_user": False}
        if (request.method, parts) == ("POST", ["runs"]):
            run = {**request.json(), "run_id": str(uuid.uuid4()), "state": "PENDING"}
            self.runs[run["run_id"]] = run
            return 200, run
        if request.method == "GET" and parts[0] == "runs" and parts[1] in self.runs:
            return 200, self.runs[parts[1]]
        if request.method == "GET" and parts[0] == "pipelines" and tuple(parts[1::2]) in self.versions:
            return 200, self.versions[tuple(parts[1::2])]
        return 404, {"code": 5, "message": f"no {request.method} {request.path}"}


@pytest.fixture
def api(monkeypatch, tmp_path):
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "no-context.json"))
    monkeypatch.delenv("KF_PIPELINES_ENDPOINT", raising=False)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "no-token"))
    with serving(RunStore()) as server:
        monkeypatch.setenv("POSTTRAIN_KFP_API", server.url)
        yield server
    assert server.errors == []


def started_from_outside(server, tmp_path, pipeline: str, params: dict) -> str:
    """A run created with the plain kfp client (as ``kfp run create`` or the UI would): no local check."""
    from kfp import compiler

    package = tmp_path / f"{pipeline}.yaml"
    compiler.Compiler().compile(PIPELINES[pipeline], str(package))
    run = kfp.Client(host=server.url).create_run_from_pipeline_package(
        str(package), arguments=params, experiment_id="e", run_name="from the UI"
    )
    return run.run_id


def test_a_typo_in_a_run_started_from_outside_fails_the_first_task_naming_stage_and_key(api, tmp_path):
    run_id = started_from_outside(api, tmp_path, "posttrain-all", {"dpo_overrides": ["betta=0.2"]})
    with pytest.raises(SystemExit) as failed:
        check_config.python_func(run_id=run_id)
    assert "check config: task 'DPO' (posttrain dpo): betta: unknown key (did you mean 'beta'?)" in str(failed.value)
    assert (api.requests[-1].method, api.requests[-1].path) == ("GET", f"{API}/runs/{run_id}")


def test_the_run_parameters_are_the_ones_checked(api, tmp_path, capsys):
    good = started_from_outside(
        api, tmp_path, "posttrain-rlhf", {"rl_algorithm": "ppo", "rl_overrides": ["kl.coef=0.1"]}
    )
    assert check_config.python_func(run_id=good) >= 6
    assert f"run {good}: all" in capsys.readouterr().out
    bad = started_from_outside(
        api, tmp_path, "posttrain-rlhf", {"rl_algorithm": "grpo", "rl_overrides": ["kl.coef=0.1"]}
    )
    with pytest.raises(SystemExit, match="task 'GRPO'.*kl: unknown key"):
        check_config.python_func(run_id=bad)


def test_a_run_of_an_uploaded_pipeline_version_is_checked_from_that_version(api, tmp_path):
    spec = json_format.MessageToDict(PIPELINES["posttrain-sft"].pipeline_spec)
    api.app.versions[("p1", "v1")] = {"pipeline_id": "p1", "pipeline_version_id": "v1", "pipeline_spec": spec}
    api.app.runs["r1"] = {
        "run_id": "r1",
        "pipeline_version_reference": {"pipeline_id": "p1", "pipeline_version_id": "v1"},
        "runtime_config": {"parameters": {"sft_overrides": ["max_stepz=3"]}},
    }
    with pytest.raises(SystemExit, match=r"task 'SFT' \(posttrain sft\): max_stepz: unknown key"):
        check_config.python_func(run_id="r1")
    reads = [r.path for r in api.requests if not r.path.endswith("/healthz")]  # the client's discovery call
    assert reads == [f"{API}/runs/r1", f"{API}/pipelines/p1/versions/v1"]


def test_the_pod_token_is_sent_and_an_unreadable_run_fails_with_the_host_not_a_traceback(api, tmp_path, monkeypatch):
    (tmp_path / "token").write_text("pod-token\n")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "token"))
    with pytest.raises(SystemExit) as failed:
        check_config.python_func(run_id="no-such-run")
    assert api.requests[-1].headers["authorization"] == "Bearer pod-token"
    message = str(failed.value)
    assert message.startswith(f"check config: cannot read run no-such-run from the KFP API at {api.url}")
    assert "POSTTRAIN_KFP_API in the posttrain-config ConfigMap" in message and "pod-token" not in message


def test_without_an_api_the_task_says_the_cli_checked(monkeypatch, capsys):
    monkeypatch.delenv("POSTTRAIN_KFP_API", raising=False)
    assert check_config.python_func(run_id="local-run") == 0
    assert "checked them before the run started" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_dag_starts_with_the_check_and_never_caches_it(name):
    spec = json_format.MessageToDict(PIPELINES[name].pipeline_spec)
    tasks = spec["root"]["dag"]["tasks"]
    assert "dependentTasks" not in tasks["check-config"]
    assert tasks["check-config"]["cachingOptions"].get("enableCache", False) is False
    assert tasks["fingerprint"]["dependentTasks"] == ["check-config"]
    everything_else = [t for key, t in tasks.items() if key != "check-config"]
    assert all(t.get("dependentTasks") for t in everything_else)  # all start after it, directly or not
    platform = json_format.MessageToDict(PIPELINES[name].platform_spec)
    executor = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-check-config"]
    assert executor["podMetadata"]["labels"] == {"access-ml-pipeline": "true"}
    assert json.dumps(executor).count("POSTTRAIN_KFP_API") == 2  # ConfigMap key -> environment variable
