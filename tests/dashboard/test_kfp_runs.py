"""posttrain dashboard --kfp-host: the runs of a KFP API (a stand-in on 127.0.0.1, kfp's own client talking
to it) with their files read from the pipeline root in the object store (the local S3 server)."""

import uuid

import kfp
import pytest

from tests.http_helpers import serving
from trainer_lib.dashboard.kfp_runs import as_storage_url
from trainer_lib.dashboard.web import Dashboard

API = "/apis/v2beta1"


class RunsApi:
    """The KFP API's run listing: runs with a pipeline spec, a state and (or not) a pipeline root."""

    def __init__(self, runs):
        self.runs = runs

    def handle(self, request):
        if (request.method, request.path) == ("GET", f"{API}/healthz"):  # (kfp.Client asks first)
            return 200, {"commit_sha": "test", "tag_name": "2.17.0", "multi_user": False}
        if (request.method, request.path) == ("GET", f"{API}/runs"):
            assert request.query.get("sort_by") == "created_at desc"
            return 200, {"runs": self.runs, "total_size": len(self.runs)}
        return 404, {"code": 5, "message": f"no route {request.method} {request.path}"}


@pytest.fixture
def no_kfp_context(monkeypatch, tmp_path):
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "no-context.json"))
    monkeypatch.delenv("KFP_TOKEN", raising=False)


def kfp_run(run_id, name, state, root=None):
    run = {
        "run_id": run_id,
        "display_name": name,
        "state": state,
        "created_at": "2026-12-04T03:00:00Z",
        "pipeline_spec": {"pipelineInfo": {"name": "posttrain-all"}},
        "runtime_config": {"parameters": {}},
    }
    if root:
        run["runtime_config"]["pipeline_root"] = root
    return run


def test_kfp_runs_show_with_their_tasks_from_the_pipeline_root(dashboard_runs, s3_bucket, no_kfp_context):
    from trainer_lib import storage

    nightly, older = str(uuid.uuid4()), str(uuid.uuid4())
    root = f"s3://{s3_bucket}/v2/artifacts"
    # what KFP v2's launcher writes: <pipeline root>/<pipeline name>/<run id>/<task>/<output>
    storage.upload_dir(
        str(dashboard_runs / "pipeline-a" / "grpo"), f"{root}/posttrain-all/{nightly}/train/output_model"
    )
    storage.upload_dir(
        str(dashboard_runs / "pipeline-a" / "evaluate"), f"{root}/posttrain-all/{older}/evaluate/results"
    )
    runs = [kfp_run(nightly, "nightly retrain", "RUNNING", root), kfp_run(older, "first run", "SUCCEEDED")]
    with serving(RunsApi(runs)) as api:
        dashboard = Dashboard(
            [], kfp={"host": api.url, "namespace": None, "pipeline_root": f"minio://{s3_bucket}/v2/artifacts"}
        )
        rows = {row["id"]: row for row in dashboard.answer("/api/runs", {})["runs"]}
    assert set(rows) == {f"kfp-{nightly}/train/output_model", f"kfp-{older}/evaluate/results"}
    trained = rows[f"kfp-{nightly}/train/output_model"]
    assert (trained["stage"], trained["status"], trained["pipeline"], trained["pipeline_state"]) == (
        "grpo",
        "finished",
        "nightly retrain",
        "RUNNING",
    )
    assert trained["location"] == f"{root}/posttrain-all/{nightly}/train/output_model"
    evaluated = rows[f"kfp-{older}/evaluate/results"]  # no pipeline root of its own: --kfp-pipeline-root's
    assert evaluated["gate"] == {"passed": False} and evaluated["pipeline"] == "first run"
    page = dashboard.answer("/api/run", {"id": [f"kfp-{nightly}/train/output_model"]})
    assert page["metrics"] and page["has"] == ["lineage.json", "metrics.jsonl", "samples.jsonl"]


def test_an_unreachable_kfp_api_is_named_and_the_other_roots_still_show(dashboard_runs, no_kfp_context):
    dashboard = Dashboard([str(dashboard_runs)], kfp={"host": "http://127.0.0.1:9", "pipeline_root": "s3://x/y"})
    answer = dashboard.answer("/api/runs", {})
    assert len(answer["runs"]) == 4 and answer["kfp_error"]  # (port 9: nothing listens)


def test_minio_roots_read_as_the_s3_bucket():
    assert as_storage_url("minio://mlpipeline/v2/artifacts") == "s3://mlpipeline/v2/artifacts"
    assert as_storage_url("gs://bucket/root") == "gs://bucket/root"
