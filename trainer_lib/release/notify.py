"""Tell the team how a pipeline run ended: one JSON message to a webhook (Slack-compatible).

The pipelines' exit task (``components/notify.py``) runs after every other task, whether they succeeded
or not, and calls :func:`notify`. The message says whether the run succeeded, failed (at which task, where
that can be known) or was gated off (which rules failed), and where the report is:

* ``text``: one line a chat client shows as it is (Slack, Mattermost and Rocket.Chat incoming webhooks
  read ``text``);
* ``attachments``: the same facts as Slack's ``fields`` (title, value);
* ``posttrain``: the outcome as data (state, failed task, gate, rules, report, run), for other receivers.

Where the facts come from:

* state: KFP's final status of the run's tasks (``dsl.PipelineTaskFinalStatus``);
* the failed task: the KFP API's task details of the run (``$POSTTRAIN_KFP_API``, as ``check config``
  reads it); without the API (``kfp.local``) the message says the run's log names it;
* the gate: the release's ``release.json`` when this run published one, else the evaluate step's
  ``metrics.json`` found under the run's artifacts (``{pipeline_root}/{run name}`` under ``kfp.local``,
  ``{pipeline_root}/{pipeline}/{run id}`` on KFP).

A notification never fails the run: each try waits at most ``timeout_s`` for the webhook, there are
``tries`` of them with a short backoff, then one line says it was not delivered. Webhook URLs often carry
their token in the path, so no log line or message shows more of it than its scheme and host, and every
other text passes through :func:`trainer_lib.storage.redact`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from trainer_lib import storage

#: Seconds one try waits for the webhook (connect and answer), tries, and the pause before a retry.
TIMEOUT_S = 5.0
TRIES = 3
BACKOFF_S = 1.0
#: Seconds to wait for the KFP API's task details.
API_TIMEOUT_S = 10.0


def public(url: str) -> str:
    """``scheme://host`` of a webhook URL: all of it a log may show (tokens live in paths and queries)."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "?") + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme or '?'}://{host}"


def post(url: str, body: dict, timeout_s: float = TIMEOUT_S, tries: int = TRIES, backoff_s: float = BACKOFF_S):
    """POST ``body`` as JSON to ``url``; ``(True, "")`` on a 2xx answer, else ``(False, why)`` after
    ``tries`` tries. Never raises; ``why`` names the webhook by scheme and host only."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return False, "the webhook is not an http(s) URL (not shown: it may hold a token); nothing sent"
    data = json.dumps(body).encode()
    why = "not tried"
    for attempt in range(max(1, tries)):
        if attempt:
            time.sleep(backoff_s * attempt)
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                answer.read(4096)
                return True, ""
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}"
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                break  # refused for good (bad token, bad body): a retry will not help
        except (urllib.error.URLError, OSError) as exc:  # refused, timed out, no such host
            reason = getattr(exc, "reason", exc)
            why = f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
            why = why.replace(url, public(url))
        except ValueError:  # a URL urllib cannot use (its message would show the URL)
            why = "not a URL urllib can send to"
    return False, storage.redact(f"the webhook at {public(url)} did not take the message ({why}; {tries} tries)")


# --------------------------------------------------------------------------- what happened


def _gate(metrics: dict, report: str, released: bool) -> dict:
    gate = metrics.get("gate") or {}
    failed = [r.get("rule") for r in gate.get("rules", []) if not r.get("passed")]
    served = gate.get("served") or {}
    failed += [f"served: {r.get('rule')}" for r in served.get("rules", []) if not r.get("passed")]
    return {"passed": bool(gate.get("passed")), "failed_rules": failed, "report": report, "released": released}


def released_gate(release_uri: str, run_id: str) -> dict | None:
    """The gate of the release this run published at ``release_uri`` (its ``release.json`` names the run),
    else None."""
    if not release_uri:
        return None
    marker = storage.join(release_uri, "release.json")
    try:
        record = json.loads(storage.read_text(marker))
    except (ValueError, OSError, RuntimeError):  # missing, unreadable, the store failing
        return None
    if run_id and ((record.get("lineage") or {}).get("kfp") or {}).get("run_id") != run_id:
        return None  # an earlier run's release
    return _gate({"gate": record.get("gate")}, storage.redact(marker), released=True)


def evaluated_gate(run_dirs: list[str]) -> dict | None:
    """The gate of the first evaluate step's ``metrics.json`` under one of ``run_dirs`` (the run's artifacts)."""
    for run_dir in run_dirs:
        try:
            files = storage.list_files(run_dir) if run_dir else []
        except (OSError, ValueError, RuntimeError):  # no such directory or prefix, the store failing
            continue
        found = [f for f in files if f.startswith("evaluate") and f.endswith("/results/metrics.json")]
        for name in found:
            path = storage.join(run_dir, name)
            try:
                metrics = json.loads(storage.read_text(path))
            except (ValueError, OSError, RuntimeError):  # missing, unreadable, the store failing
                continue
            if "gate" in metrics:
                report = path[: -len("metrics.json")] + "report.html"
                return _gate(metrics, storage.redact(report), released=False)
    return None


def skipped(run_dirs: list[str]) -> bool:
    """Whether ``check changes`` stopped the run (``skip_if_unchanged``: nothing changed), as far as the run's
    directories show it (kfp.local keeps each task's outputs there; KFP on a cluster does not: False)."""
    for run_dir in run_dirs:
        path = storage.join(run_dir, "check-changes", "executor_output.json") if run_dir else ""
        try:
            written = json.loads(storage.read_text(path)) if path and not storage.is_remote(path) else {}
        except (ValueError, OSError, RuntimeError):
            continue
        if (written.get("parameterValues") or {}).get("Output") == "":  # its output: "" when nothing changed
            return True
    return False


def failed_tasks(run_id: str, host: str) -> list[str]:
    """Names of the failed tasks of KFP run ``run_id``, read from the KFP API at ``host`` (v2beta1); empty
    when it cannot be read. Sends the pod's projected API token where there is one."""
    import os

    if not (run_id and host):
        return []
    url = f"{host.rstrip('/')}/apis/v2beta1/runs/{urllib.parse.quote(run_id)}"
    headers = {}
    token_path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "/var/run/secrets/kubeflow/pipelines/token")
    if os.path.isfile(token_path):
        with open(token_path, encoding="utf-8") as fh:
            headers["Authorization"] = f"Bearer {fh.read().strip()}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=API_TIMEOUT_S) as answer:
            run = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    details = (run.get("run_details") or {}).get("task_details") or []
    return [
        t.get("display_name") or t.get("task_id") or "?"
        for t in details
        if t.get("state") == "FAILED" and not str(t.get("display_name", "")).startswith(("exit-handler", "root"))
    ]


def outcome(state: str, error: str, gate: dict | None, failed: list[str], run: dict, unchanged: bool = False) -> dict:
    """The run's outcome: ``succeeded``, ``gated off`` (the gate failed: nothing released or deployed) or
    ``failed``, with what is known of why and where the report is; ``unchanged``: it stopped early, nothing
    having changed since the latest release."""
    kind = "failed" if state != "SUCCEEDED" else "gated off" if gate and not gate["passed"] else "succeeded"
    found = {"outcome": kind, "state": state or "UNKNOWN", **{k: v for k, v in run.items() if v}}
    if unchanged and kind == "succeeded":
        found["unchanged"] = True
    if kind == "failed":
        found["failed_tasks"] = failed
        found["error"] = storage.redact(error or "")
    if gate:
        found["gate"] = gate
    return found


def message(found: dict) -> dict:
    """The webhook body of an outcome: ``text``, Slack ``attachments`` fields and ``posttrain`` (the data)."""
    run = found.get("run_name") or found.get("run_id") or "a run"
    pipeline = found.get("pipeline") or "posttrain"
    gate = found.get("gate") or {}
    if found["outcome"] == "failed":
        where = ", ".join(found.get("failed_tasks") or []) or "a task the run's log names"
        text = f":x: {pipeline} {run} failed at {where}"
    elif found["outcome"] == "gated off":
        text = f":no_entry: {pipeline} {run} was gated off: {', '.join(gate['failed_rules']) or 'the gate failed'}"
    else:
        done = "released" if gate.get("released") else "gate passed" if gate else "finished"
        done = "nothing changed since the latest release: not retrained" if found.get("unchanged") else done
        text = f":white_check_mark: {pipeline} {run} succeeded ({done})"
    if gate.get("report"):
        text += f"; report: {gate['report']}"
    fields = [
        {"title": "outcome", "value": found["outcome"], "short": True},
        {"title": "pipeline", "value": pipeline, "short": True},
        {"title": "run", "value": run, "short": True},
    ]
    if found.get("failed_tasks"):
        fields.append({"title": "failed at", "value": ", ".join(found["failed_tasks"]), "short": True})
    if gate:
        rules = ", ".join(gate["failed_rules"]) or "all held"
        fields.append({"title": "gate", "value": f"{'passed' if gate['passed'] else 'failed'} ({rules})"})
        fields.append({"title": "report", "value": gate.get("report") or "?"})
    color = {"succeeded": "good", "gated off": "warning"}.get(found["outcome"], "danger")
    return {"text": text, "attachments": [{"color": color, "fields": fields}], "posttrain": found}


def notify(webhook: str, status: dict, run: dict, release_uri: str = "", run_dirs=(), **sending) -> dict:
    """Work out the run's outcome from KFP's final ``status`` (``state``, ``error_message``), ``run``
    (``pipeline``, ``run_id``, ``run_name``), the release and the run's artifacts under ``run_dirs``, and
    post it to ``webhook`` (empty: only print it). ``sending``: :func:`post`'s ``timeout_s``, ``tries``.
    Returns the body; never raises for the webhook's sake."""
    import os

    state = str(status.get("state") or "")
    gate = released_gate(release_uri, run.get("run_id", "")) or evaluated_gate(list(run_dirs))
    failed = (
        [] if state == "SUCCEEDED" else failed_tasks(run.get("run_id", ""), os.environ.get("POSTTRAIN_KFP_API", ""))
    )
    error = str(status.get("error_message") or "")
    body = message(outcome(state, error, gate, failed, run, unchanged=state == "SUCCEEDED" and skipped(list(run_dirs))))
    print(f"notify: {storage.redact(body['text'])}", flush=True)
    if not webhook:
        print("notify: no webhook given (notify_webhook): nothing sent", flush=True)
        return body
    delivered, why = post(webhook, body, **sending)
    print(f"notify: sent to the webhook at {public(webhook)}" if delivered else f"notify: warning: {why}", flush=True)
    return body
