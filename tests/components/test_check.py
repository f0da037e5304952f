"""The DAG's first task checks the run's stage configs from the KFP API, as a UI or scheduled run gives them.

A local HTTP server plays the KFP API; runs reach it the way ``kfp run create`` or the UI would send
them (the real ``kfp.Client``, no ``posttrain`` check on the way), then the ``check config`` component
reads them back over HTTP. Where no API answers (a closed port, a server that never replies) or it
refuses the pod (401/403), the component gets its inputs as the backend resolves them from the
compiled IR, and checks the run from those.
"""

import json
import socket
import threading
import uuid

import kfp
import pytest
from google.protobuf import json_format
from kfp import dsl

from components import validation
from components.check import check_config
from components.validation import spec_defaults, unpack_spec
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
    out = capsys.readouterr().out
    assert f"run {good}: all" in out and f"valid (validated from the KFP API's copy of run {good})" in out
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


def body_tasks(spec: dict) -> dict:
    """The tasks of the DAG's body: every task runs inside its ExitHandler (the exit task notifies)."""
    (tasks,) = [
        c["dag"]["tasks"] for c in spec["components"].values() if "check-config" in c.get("dag", {}).get("tasks", {})
    ]
    return tasks


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_dag_starts_with_the_check_and_never_caches_it(name):
    spec = json_format.MessageToDict(PIPELINES[name].pipeline_spec)
    assert set(spec["root"]["dag"]["tasks"]) == {"exit-handler-1", "notify"}
    tasks = body_tasks(spec)
    assert "dependentTasks" not in tasks["check-config"]
    assert tasks["check-config"]["cachingOptions"].get("enableCache", False) is False
    assert tasks["fingerprint"]["dependentTasks"] == ["check-config"]
    everything_else = [t for key, t in tasks.items() if key != "check-config"]
    assert all(t.get("dependentTasks") for t in everything_else)  # all start after it, directly or not
    platform = json_format.MessageToDict(PIPELINES[name].platform_spec)
    executor = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-check-config"]
    assert executor["podMetadata"]["labels"] == {"access-ml-pipeline": "true"}
    assert json.dumps(executor).count("POSTTRAIN_KFP_API") == 2  # ConfigMap key -> environment variable


# --------------------------------------------------------------------------- without the KFP API


def task_inputs(pipeline: str, run_id: str, params: dict) -> dict:
    """The check task's inputs as the backend resolves them for a run of ``pipeline`` with ``params``: each
    pipeline parameter (given or its default) and the constants compiled into the task."""
    spec = json_format.MessageToDict(PIPELINES[pipeline].pipeline_spec)
    values = {**spec_defaults(spec), **params}
    inputs = {}
    for name, source in body_tasks(spec)["check-config"]["inputs"]["parameters"].items():
        if "componentInputParameter" in source:
            inputs[name] = values[source["componentInputParameter"].removeprefix("pipelinechannel--")]
        else:
            constant = source["runtimeValue"]["constant"]
            inputs[name] = run_id if constant == dsl.PIPELINE_JOB_ID_PLACEHOLDER else constant
    return inputs


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(tmp_path / "no-token"))
    return tmp_path / "no-token"


@pytest.fixture
def closed_port():
    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_api_checks_the_run_from_the_tasks_parameters(monkeypatch, no_token, closed_port, capsys):
    monkeypatch.setenv("POSTTRAIN_KFP_API", f"http://user:hunter2@127.0.0.1:{closed_port}")
    assert check_config.python_func(**task_inputs("posttrain-all", "r1", {"dpo_overrides": ["beta=0.2"]})) == 12
    out = capsys.readouterr().out
    assert (
        f"KFP API at http://127.0.0.1:{closed_port} not reachable (NewConnectionError: Failed to establish a new "
        "connection: [Errno 111] Connection refused): validated the stage configs from the task's parameters\n"
    ) in out
    assert "run r1: all 12 stage configs are valid (validated from the task's parameters: the run's values" in out
    with pytest.raises(SystemExit) as failed:
        check_config.python_func(**task_inputs("posttrain-all", "r2", {"dpo_overrides": ["betta=0.2"]}))
    assert str(failed.value) == "check config: task 'DPO' (posttrain dpo): betta: unknown key (did you mean 'beta'?)"
    # the run's values decide the branches too: kl.coef is PPO's, GRPO refuses it
    good = task_inputs("posttrain-rlhf", "r3", {"rl_algorithm": "ppo", "rl_overrides": ["kl.coef=0.1"]})
    assert check_config.python_func(**good) >= 6
    with pytest.raises(SystemExit, match="task 'GRPO'.*kl: unknown key"):
        check_config.python_func(**{**good, "rl_algorithm": "grpo"})
    # a pipeline compiled before the DAG was carried into the task: no way to check, said so
    with pytest.raises(SystemExit, match="compiled without its DAG in the check task.*posttrain pipeline compile"):
        check_config.python_func(**{**good, "compiled_spec": ""})
    assert "hunter2" not in capsys.readouterr().out


class Refusing:
    """A KFP API that lets nobody in, and echoes what it was sent in its error body (some proxies do)."""

    def __init__(self, status: int):
        self.status = status

    def handle(self, request):
        sent = request.headers.get("authorization", "nothing")
        return self.status, {"code": 16, "message": f"invalid credentials: {sent}"}


@pytest.mark.parametrize("status, token", [(401, "s3cr3t-pod-token"), (403, None)])
def test_an_api_that_refuses_the_pod_checks_from_the_parameters_and_never_shows_the_token(
    monkeypatch, tmp_path, capsys, caplog, status, token
):
    path = tmp_path / "token"
    if token:
        path.write_text(token + "\n")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(path))
    with serving(Refusing(status)) as server:
        monkeypatch.setenv("POSTTRAIN_KFP_API", server.url)
        assert check_config.python_func(**task_inputs("posttrain-sft", "r1", {"sft_overrides": ["lora.r=8"]})) == 6
        with pytest.raises(SystemExit) as failed:
            check_config.python_func(**task_inputs("posttrain-sft", "r2", {"sft_overrides": ["max_stepz=3"]}))
    assert server.requests[0].headers.get("authorization") == (f"Bearer {token}" if token else None)
    assert (
        str(failed.value)
        == "check config: task 'SFT' (posttrain sft): max_stepz: unknown key (did you mean 'max_steps'?)"
    )
    captured = capsys.readouterr()
    reason = {
        401: "HTTP 401 Unauthorized, sent with the pod's token",
        403: f"HTTP 403 Forbidden, sent without a token: none at {path}",
    }
    assert (
        f"KFP API at {server.url} did not authorise this pod to read run r1 ({reason[status]}; the access-ml-pipeline "
        "PodDefault of multi-user Kubeflow projects it, see docs/pipelines.md): validated the stage configs from "
        "the task's parameters\n"
    ) in captured.out
    assert "run r1: all 6 stage configs are valid (validated from the task's parameters" in captured.out
    shown = captured.out + captured.err + caplog.text + str(failed.value)
    assert "s3cr3t" not in shown and "invalid credentials" not in shown


def test_an_api_that_never_answers_times_out_and_checks_from_the_parameters(monkeypatch, no_token, capsys):
    class Silent:
        def __init__(self):
            self.released = threading.Event()

        def handle(self, request):
            self.released.wait(10)
            return 503, {}

    monkeypatch.setattr(validation, "API_TIMEOUT", (0.5, 0.2))
    app = Silent()
    with serving(app) as server:
        monkeypatch.setenv("POSTTRAIN_KFP_API", server.url)
        try:
            assert check_config.python_func(**task_inputs("posttrain-sft", "r1", {})) == 6
        finally:
            app.released.set()
    assert len(server.requests) == validation.API_TRIES
    assert f"KFP API at {server.url} not reachable (ReadTimeoutError: " in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_dag_gives_its_check_every_parameter_and_itself(name):
    spec = json_format.MessageToDict(PIPELINES[name].pipeline_spec)
    inputs = body_tasks(spec)["check-config"]["inputs"]["parameters"]
    wired = {
        k: v["componentInputParameter"].removeprefix("pipelinechannel--")
        for k, v in inputs.items()
        if "componentInputParameter" in v
    }
    unread = {"notify_webhook", "skip_if_unchanged"}  # no stage config reads them
    assert wired == {p: p for p in spec["root"]["inputDefinitions"]["parameters"] if p not in unread}
    carried = unpack_spec(inputs["compiled_spec"]["runtimeValue"]["constant"])
    assert set(carried["root"]["dag"]["tasks"]) == set(spec["root"]["dag"]["tasks"]) - {"check-config"}
    assert "{{$" not in inputs["compiled_spec"]["runtimeValue"]["constant"]  # no backend resolves anything in it


@pytest.fixture
def kfp_local(tmp_path):
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    yield
    local.config.LocalExecutionConfig.instance = None


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task that uses custom")
def test_the_kfp_executor_runs_the_check_from_the_inputs_the_dag_compiled_in(
    kfp_local, monkeypatch, no_token, closed_port, capfd
):
    monkeypatch.setenv("POSTTRAIN_KFP_API", f"http://127.0.0.1:{closed_port}")
    assert check_config(**task_inputs("posttrain-sft", "r1", {"sft_overrides": ["lora.r=8"]})).output == 6
    assert "run r1: all 6 stage configs are valid (validated from the task's parameters" in capfd.readouterr().out
    with pytest.raises(RuntimeError, match="check-config.*FAILURE"):
        check_config(**task_inputs("posttrain-sft", "r2", {"sft_overrides": ["max_stepz=3"]}))
    assert "check config: task 'SFT' (posttrain sft): max_stepz: unknown key" in capfd.readouterr().out
