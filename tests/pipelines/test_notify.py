"""The exit task's notification: a real HTTP server stands for the webhook (one that answers, one that
hangs, one that answers 500); the component runs as the exit task of a small DAG under kfp.local."""

import json
import threading
import time

import pytest

from tests.http_helpers import serving
from trainer_lib.release import notify

TOKEN = "T0CANARY/B0CANARY/xoxbCanarySecret42"


class Hook:
    """A webhook: answers ``status`` after waiting for ``release`` when ``hang`` (at most 30 s)."""

    def __init__(self, status=200, hang=False):
        self.status, self.hang, self.release = status, hang, threading.Event()

    def handle(self, request):
        if self.hang:
            self.release.wait(30)
        return self.status, {"ok": self.status == 200}


@pytest.fixture
def metrics_run(tmp_path):
    """A run directory as kfp.local leaves it, with an evaluate step whose gate failed one rule."""
    results = tmp_path / "posttrain-dpo-2026" / "evaluate" / "results"
    results.mkdir(parents=True)
    gate = {
        "passed": False,
        "rules": [
            {"rule": "task_pass_rate>=baseline-0.02", "passed": False},
            {"rule": "harmless_rate>=0.8", "passed": True},
        ],
        "served": {"passed": True, "rules": [{"rule": "task_pass_rate>=candidate-0.02", "passed": True}]},
    }
    (results / "metrics.json").write_text(json.dumps({"gate": gate}))
    return tmp_path / "posttrain-dpo-2026"


def test_gated_off_run_posts_the_failed_rule_and_the_report(metrics_run, capsys):
    with serving(Hook()) as server:
        url = f"{server.url}/services/{TOKEN}"
        body = notify.notify(
            url, {"state": "SUCCEEDED"}, {"pipeline": "posttrain-dpo", "run_name": "r1"}, "", [str(metrics_run)]
        )
    (request,) = server.requests
    assert request.path == f"/services/{TOKEN}" and request.headers["content-type"] == "application/json"
    sent = request.json()
    assert sent == body
    assert sent["posttrain"]["outcome"] == "gated off"
    assert sent["posttrain"]["gate"]["failed_rules"] == ["task_pass_rate>=baseline-0.02"]
    assert "gated off: task_pass_rate>=baseline-0.02" in sent["text"]
    report = str(metrics_run / "evaluate" / "results" / "report.html")
    assert sent["posttrain"]["gate"]["report"] == report and report in sent["text"]
    fields = {f["title"]: f["value"] for f in sent["attachments"][0]["fields"]}
    assert fields["outcome"] == "gated off" and fields["gate"].startswith("failed")
    out = capsys.readouterr().out
    assert f"sent to the webhook at {server.url}" in out and "CANARY" not in out


def test_release_of_this_run_means_succeeded_and_released(tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    record = {
        "gate": {"passed": True, "rules": [{"rule": "a>=0", "passed": True}]},
        "lineage": {"kfp": {"run_id": "r9"}},
    }
    (release / "release.json").write_text(json.dumps(record))
    found = notify.outcome("SUCCEEDED", "", notify.released_gate(str(release), "r9"), [], {"run_id": "r9"})
    body = notify.message(found)
    assert body["posttrain"]["gate"]["released"] is True and "succeeded (released)" in body["text"]
    assert notify.released_gate(str(release), "another-run") is None  # an earlier run's release says nothing


def test_a_run_that_stopped_because_nothing_changed_says_so(tmp_path):
    check = tmp_path / "posttrain-dpo-2026" / "check-changes"
    check.mkdir(parents=True)
    (check / "executor_output.json").write_text(json.dumps({"parameterValues": {"Output": ""}}))
    body = notify.notify("", {"state": "SUCCEEDED"}, {"pipeline": "posttrain-dpo"}, run_dirs=[str(check.parent)])
    assert body["posttrain"]["unchanged"] is True and "nothing changed since the latest release" in body["text"]
    (check / "executor_output.json").write_text(json.dumps({"parameterValues": {"Output": "{}"}}))  # it trained
    body = notify.notify("", {"state": "SUCCEEDED"}, {"pipeline": "posttrain-dpo"}, run_dirs=[str(check.parent)])
    assert "unchanged" not in body["posttrain"] and "succeeded (finished)" in body["text"]


def test_failed_run_names_the_failed_task():
    found = notify.outcome("FAILED", "Task exit-handler-1 failed.", None, ["DPO"], {"pipeline": "p", "run_name": "r"})
    body = notify.message(found)
    assert body["text"] == ":x: p r failed at DPO" and body["attachments"][0]["color"] == "danger"
    without = notify.message(notify.outcome("FAILED", "", None, [], {}))
    assert "failed at a task the run's log names" in without["text"]


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_a_hanging_webhook_is_given_up_within_the_bound(capsys):
    hook = Hook(hang=True)
    with serving(hook) as server:
        started = time.monotonic()
        body = notify.notify(
            f"{server.url}/hook/{TOKEN}", {"state": "SUCCEEDED"}, {"run_name": "r"}, timeout_s=0.3, tries=2
        )
        took = time.monotonic() - started
        hook.release.set()
    assert body["posttrain"]["outcome"] == "succeeded"
    assert len(server.requests) >= 1 and took < 0.3 * 2 + 1.0 + 1.5  # two timeouts, one backoff, slack
    out = capsys.readouterr().out
    assert "warning: the webhook at http://127.0.0.1" in out and "2 tries" in out and "CANARY" not in out


def test_a_webhook_answering_500_is_retried_then_reported(capsys):
    with serving(Hook(status=500)) as server:
        delivered, why = notify.post(f"{server.url}/{TOKEN}", {"text": "x"}, timeout_s=2, tries=3, backoff_s=0.05)
    assert not delivered and len(server.requests) == 3 and "HTTP 500" in why and "CANARY" not in why
    with serving(Hook(status=403)) as server:  # refused for good: no retry
        delivered, why = notify.post(f"{server.url}/{TOKEN}", {"text": "x"}, tries=3, backoff_s=0.05)
    assert not delivered and len(server.requests) == 1 and "HTTP 403" in why


def test_a_closed_port_or_bad_url_is_one_line_without_the_url():
    with serving(Hook()) as server:
        url = server.url
    delivered, why = notify.post(f"{url}/{TOKEN}", {"text": "x"}, timeout_s=1, tries=2, backoff_s=0.05)
    assert not delivered and "CANARY" not in why and "ConnectionRefusedError" in why
    delivered, why = notify.post(f"hooks.example.com/{TOKEN}", {"text": "x"})
    assert not delivered and "CANARY" not in why


@pytest.mark.serial  # timed against a wall-clock bound: run alone
@pytest.mark.filterwarnings("ignore:.*non-Python base image")
def test_the_exit_task_posts_success_and_failure_under_kfp_local(tmp_path):
    """The real component as the exit task of a two-task DAG (the same wiring as pipelines/dag.py)."""
    from kfp import dsl, local

    from components.notify import notify as notify_task

    @dsl.component(install_kfp_package=False)
    def work(fail: bool) -> str:
        if fail:
            raise RuntimeError("the body failed")
        return "done"

    @dsl.pipeline(name="notified")
    def notified(webhook: str, fail: bool):
        exit_task = notify_task(
            webhook=webhook,
            pipeline="notified",
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
            pipeline_root=dsl.PIPELINE_ROOT_PLACEHOLDER,
            timeout_s=0.5,
            tries=1,
        )
        with dsl.ExitHandler(exit_task):
            work(fail=fail)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path), raise_on_error=False)
    with serving(Hook()) as server:
        notified(webhook=f"{server.url}/{TOKEN}", fail=False)
        notified(webhook=f"{server.url}/{TOKEN}", fail=True)
    ok, failed = (r.json()["posttrain"] for r in server.requests)
    assert ok["outcome"] == "succeeded" and ok["pipeline"] == "notified" and ok["run_name"].startswith("notified-")
    assert failed["outcome"] == "failed" and failed["state"] == "FAILED"
    # a webhook that hangs: the exit task still succeeds, in about its timeout
    hook = Hook(hang=True)
    with serving(hook) as server:
        started = time.monotonic()
        notified(webhook=f"{server.url}/{TOKEN}", fail=False)
        took = time.monotonic() - started
        hook.release.set()
    assert took < 15
    last = max(tmp_path.glob("notified-*"), key=lambda d: d.name)
    assert (last / "notify" / "executor_output.json").is_file()  # the exit task finished, and succeeded


@pytest.mark.extended
@pytest.mark.filterwarnings("ignore:.*non-Python base image")
def test_a_local_sft_run_posts_succeeded_to_the_webhook(tmp_path, capfd):
    from pipelines.commands import posttrain
    from tests.pipelines.test_local_run import SMALL

    with serving(Hook()) as server:
        argv = ["pipeline", "run", "--root", str(tmp_path / "local"), *SMALL, "sft_max_steps=1"]
        rc = posttrain([*argv, f"notify_webhook={server.url}/services/{TOKEN}"])
    out = capfd.readouterr().out
    assert rc == 0, out[-3000:]
    (request,) = server.requests
    sent = request.json()
    assert sent["posttrain"]["outcome"] == "succeeded" and sent["posttrain"]["pipeline"] == "posttrain-sft"
    assert sent["text"].startswith(":white_check_mark: posttrain-sft posttrain-sft-")
    record = (tmp_path / "latest" / "run.json").read_text()
    ours = [line for line in out.splitlines() if "notify:" in line]
    assert ours and "CANARY" not in record and not [line for line in ours if "CANARY" in line]
    # (KFP's executor prints every task input, the webhook parameter too: docs/pipelines.md says to use the Secret)
    assert json.loads(record)["outputs"]["model"]["path"].endswith("output_model")  # the SFT task's model
