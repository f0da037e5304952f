"""posttrain dashboard over HTTP: a real server process, tokens beyond loopback, headers, S3 prefixes."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from tests.conftest import REPO


def get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, dict(response.headers), response.read()


def status_of(url, headers=None) -> int:
    try:
        return get(url, headers)[0]
    except urllib.error.HTTPError as error:
        return error.code


def test_a_bind_beyond_loopback_needs_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "POSTTRAIN_DASHBOARD_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "dashboard", "--runs", str(tmp_path), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "POSTTRAIN_DASHBOARD_TOKEN" in proc.stderr and "--token-file" in proc.stderr
    empty = tmp_path / "token"
    empty.write_text("\n")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", "dashboard", "--host", "0.0.0.0", "--token-file", str(empty)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2 and "is empty" in proc.stderr


def test_with_a_token_every_request_must_carry_it(dashboard_runs, dashboard, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-dashboard-token\n")
    server = dashboard("--runs", str(dashboard_runs), "--host", "0.0.0.0", "--token-file", str(token_file))
    for path in ("", "api/runs", "static/app.js", "static/plotly.min.js"):
        assert status_of(server.url + path) == 401
    assert status_of(server.url + "api/runs", {"Authorization": "Bearer wrong"}) == 401
    code, _, body = get(server.url + "api/runs", {"Authorization": "Bearer s3cret-dashboard-token"})
    assert code == 200 and len(json.loads(body)["runs"]) == 4
    code, headers, _ = get(server.url + "?token=s3cret-dashboard-token")  # the page's address, once
    cookie = headers["Set-Cookie"].split(";")[0]
    assert code == 200 and "HttpOnly" in headers["Set-Cookie"]
    assert status_of(server.url + "api/runs", {"Cookie": cookie}) == 200


def test_answers_forbid_scripts_from_elsewhere_and_plotly_comes_from_the_package(dashboard_runs, dashboard):
    from importlib.resources import files

    server = dashboard("--runs", str(dashboard_runs))
    code, headers, page = get(server.url)
    assert code == 200 and b'src="/static/plotly.min.js"' in page and b"http" not in page  # nothing from a CDN
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"
    _, _, script = get(server.url + "static/plotly.min.js")
    assert script == (files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    _, headers, report = get(server.url + "report?id=0/pipeline-a/evaluate")
    assert headers["Content-Security-Policy"].startswith("default-src 'none'") and b"<html" in report.lower()
    assert "script-src" not in headers["Content-Security-Policy"]  # the report page runs no script at all
    for path in ("api/run?id=../../etc", "api/run?id=0/pipeline-a", "static/../web.py", "api/nothing"):
        assert status_of(server.url + path) == 404, path
    _, _, body = get(server.url + "api/compare?id=0/pipeline-a/grpo&id=0/pipeline-a/grpo-lr")
    compared = json.loads(body)
    assert [d["key"] for d in compared["differences"]] == ["lr", "output_dir"]


def test_an_s3_prefix_is_read_through_the_storage_layer(dashboard_runs, dashboard, s3_bucket, s3_server):
    from trainer_lib import storage

    storage.upload_dir(str(dashboard_runs / "pipeline-a" / "grpo"), f"s3://{s3_bucket}/team/runs/grpo")
    env = {"AWS_ENDPOINT_URL": s3_server.endpoint_url}
    server = dashboard("--runs", f"s3://{s3_bucket}/team/runs", env=env)
    _, _, body = get(server.url + "api/runs")
    [row] = json.loads(body)["runs"]
    assert (row["id"], row["stage"], row["status"], row["location"]) == (
        "0/grpo",
        "grpo",
        "finished",
        f"s3://{s3_bucket}/team/runs/grpo",
    )
    _, _, body = get(server.url + "api/samples?id=0/grpo&step=4")
    rows = json.loads(body)["rows"]
    assert len(rows) == 8 and all(r["step"] == 4 for r in rows)
    local = [json.loads(line) for line in open(dashboard_runs / "pipeline-a" / "grpo" / "metrics.jsonl")]
    _, _, body = get(server.url + "api/run?id=0/grpo")
    assert json.loads(body)["metrics"] == local


def test_metrics_after_gives_only_the_new_records(dashboard_runs, dashboard):
    server = dashboard("--runs", str(dashboard_runs))
    local = [json.loads(line) for line in open(dashboard_runs / "pipeline-a" / "grpo" / "metrics.jsonl")]
    for after in (0, 3, len(local)):
        _, _, body = get(server.url + f"api/metrics?id=0/pipeline-a/grpo&after={after}")
        answer = json.loads(body)
        assert answer["records"] == local[after:] and answer["count"] == len(local)
        assert answer["status"] == "finished"
