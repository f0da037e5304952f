"""skip_if_unchanged: a run compares its sources' fingerprint and parameters with the latest release's."""

import json
import os
import shutil
import time

import pytest
from google.protobuf import json_format

from components.fingerprint import check_changes, record_inputs
from pipelines.commands import posttrain
from pipelines.dag import PIPELINES
from trainer_lib import storage
from trainer_lib.release.lineage import combined_fingerprint
from trainer_lib.release.retrain import INPUTS_FILE, changes, record

PARAMS = {"sft_max_steps": 3, "dpo_overrides": ["beta=0.2"], "release_uri": "x", "notify_webhook": "", "seed": 0}


def released(tmp_path, data_file, params, run_id="run-1"):
    """A release at ``tmp_path/release`` as the release stage and record-inputs leave it; returns its URI and
    the sources fingerprint (the fingerprint step's, of ``data_file`` as the run's dataset)."""
    uri = str(tmp_path / "release")
    os.makedirs(uri, exist_ok=True)
    sources = combined_fingerprint([(str(data_file), storage.fingerprint(str(data_file)))])
    lineage = {"sources_fingerprint": sources, "kfp": {"run_id": run_id}}
    storage.write_text(os.path.join(uri, "release.json"), json.dumps({"gate": {"passed": True}, "lineage": lineage}))
    record(uri, run_id, sources, params)
    return uri, sources


def test_nothing_changed_only_when_sources_and_parameters_equal_the_release(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    uri, sources = released(tmp_path, data, PARAMS)
    assert changes(uri, sources, PARAMS) == []
    # as kfp.local hands a dict parameter's values over (text), and where things go or who is told: the same
    as_text = {**PARAMS, "sft_max_steps": "3.0", "dpo_overrides": '["beta=0.2"]', "seed": "0"}
    assert changes(uri, sources, {**as_text, "release_uri": "elsewhere", "notify_webhook": "http://h/x"}) == []
    assert changes(uri, sources, {**PARAMS, "dpo_overrides": ["beta=0.3"]}) == ["parameters changed: dpo_overrides"]
    assert changes(uri, sources, {**PARAMS, "lr": 1e-3}) == ["parameters changed: lr"]
    time.sleep(0.01)
    data.write_text('{"prompt": "a", "completion": "c"}\n')  # one row changed
    now = combined_fingerprint([(str(data), storage.fingerprint(str(data)))])
    assert changes(uri, now, PARAMS) == ["the base model or data changed (sources fingerprint)"]


def test_no_release_or_no_record_of_its_run_means_train(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    assert changes("", "f", PARAMS) == ["no release_uri: no earlier release to compare with"]
    assert changes(str(tmp_path / "none"), "f", PARAMS)[0].startswith("no release at")
    uri, sources = released(tmp_path, data, PARAMS)
    record(uri, "another-run", sources, PARAMS)  # a record that is not the release's own
    assert "has no inputs.json of the run that made it" in changes(uri, sources, PARAMS)[0]
    os.remove(os.path.join(uri, INPUTS_FILE))
    assert "has no inputs.json" in changes(uri, sources, PARAMS)[0]


def test_the_components_check_and_record(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    given = {k: v for k, v in PARAMS.items() if k not in ("release_uri", "notify_webhook")}
    uri, sources = released(tmp_path, data, given)

    def check(skip: bool, **changed):
        wired = {**given, **changed}
        found = check_changes.python_func(sources, sorted(wired), uri, skip_if_unchanged=skip, **wired)
        assert found == "" or json.loads(found) == wired  # (what record_inputs gets)
        return found != ""

    assert check(False) is True
    assert check(True) is False
    assert "nothing changed since the latest release" in capsys.readouterr().out
    assert check(True, seed=1) is True
    assert "training: parameters changed: seed" in capsys.readouterr().out

    class Released:
        metadata = {"released": False}

    os.remove(os.path.join(uri, INPUTS_FILE))
    record_inputs.python_func(Released(), "run-1", sources, json.dumps(given), uri)  # gate failed: no record
    assert not os.path.exists(os.path.join(uri, INPUTS_FILE))
    Released.metadata = {"released": True}
    record_inputs.python_func(Released(), "run-1", sources, json.dumps(given), uri)
    assert json.loads(open(os.path.join(uri, INPUTS_FILE)).read())["parameters"]["sft_max_steps"] == 3.0
    assert check(True) is False


def _dags(spec):
    return [spec["root"], *spec["components"].values()]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_release_records_its_inputs_and_training_waits_for_the_check(name):
    spec = json_format.MessageToDict(PIPELINES[name].pipeline_spec)
    tasks = {n: t for c in _dags(spec) for n, t in (c.get("dag") or {}).get("tasks", {}).items()}
    releases = [n for n, t in tasks.items() if t["componentRef"]["name"].startswith("comp-release")]
    records = [n for n, t in tasks.items() if t["componentRef"]["name"].startswith("comp-record-inputs")]
    assert len(records) == len(releases)
    if name == "posttrain-sft":  # no release to compare with: no option, no check
        assert (
            "check-changes" not in tasks and "skip_if_unchanged" not in spec["root"]["inputDefinitions"]["parameters"]
        )
        return
    check = tasks["check-changes"]
    assert check["dependentTasks"] == ["check-config", "fingerprint"]
    assert check["inputs"]["parameters"]["sources_fingerprint"]["taskOutputParameter"]["producerTask"] == "fingerprint"
    changed = tasks["condition-2"]  # (inside the exit handler) the branch every later task is in
    assert (
        changed["triggerPolicy"]["condition"]
        == "inputs.parameter_values['pipelinechannel--check-changes-Output'] != ''"
    )
    inside = spec["components"]["comp-condition-2"]["dag"]["tasks"]
    assert {"bootstrap", "training-resources"} <= set(inside)
    body = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert set(body) == {"check-config", "fingerprint", "check-changes", "condition-2"}


def test_schedule_turns_it_on_unless_given(monkeypatch, tmp_path, capsys):
    import kfp

    from tests.http_helpers import serving
    from tests.pipelines.test_submit_http import KfpApi, posts

    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "no-context.json"))
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    with serving(KfpApi()) as server:
        base = ["pipeline", "schedule", "--host", server.url, "--cron", "0 3 * * 0", "--pipeline", "posttrain-dpo"]
        assert posttrain(base) == 0
        assert posttrain([*base, "skip_if_unchanged=false"]) == 0
    on, off = (r.json()["runtime_config"]["parameters"] for r in posts(server, "recurringruns"))
    assert on == {"skip_if_unchanged": True} and off == {"skip_if_unchanged": False}
    assert "skip_if_unchanged=true: runs stop early" in capsys.readouterr().out


SMALL = [
    'demo_overrides=["n_code_train=40", "n_code_eval=4", "n_safety_train=12", "n_safety_sft=12", "n_safety_eval=4"]',
    'tiny_model_overrides=["hidden_size=32", "num_layers=1", "vocab_size=300"]',
    "max_length=128",
    "batch_size=2",
    "sft_max_steps=1",
    "dpo_max_steps=1",
    "humaneval_limit=1",
    'evaluate_overrides=["safety.limit=2", "tasks.limit=2"]',
    'gate_rules=["task_pass_rate>=0"]',
    "served_gate_rules=[]",
]


@pytest.mark.extended
@pytest.mark.filterwarnings("ignore:.*non-Python base image")
def test_a_second_unchanged_run_skips_and_a_changed_row_trains(tmp_path, demo_dir, capfd):
    data = tmp_path / "sft.jsonl"
    shutil.copy(os.path.join(demo_dir, "sft.jsonl"), data)
    release = tmp_path / "release"
    argv = ["pipeline", "run", "--pipeline", "posttrain-dpo", "--root", str(tmp_path / "local"), *SMALL]
    argv += [f"dataset={data}", f"release_uri={release}", "skip_if_unchanged=true"]

    def run() -> tuple[float, dict, str]:
        started = time.monotonic()
        rc = posttrain(argv)
        out = capfd.readouterr().out
        assert rc == 0, out[-3000:]
        return time.monotonic() - started, json.loads((tmp_path / "latest" / "run.json").read_text()), out

    took, first, out = run()
    assert "check changes: training: no release at" in out and (release / "release.json").is_file()
    assert any(t.startswith("train") for t in first["tasks"])
    recorded = json.loads((release / INPUTS_FILE).read_text())
    assert recorded["run_id"] == json.loads((release / "release.json").read_text())["lineage"]["kfp"]["run_id"]

    took, second, out = run()
    assert "nothing changed since the latest release" in out
    assert not any(t.startswith(("bootstrap", "train", "release")) for t in second["tasks"]) and took < 30

    rows = data.read_text().splitlines()
    rows[0] = rows[0].replace("def ", "def  ", 1) if "def " in rows[0] else rows[0][:-1] + ', "x": 1}'
    data.write_text("\n".join(rows) + "\n")
    took, third, out = run()
    assert "check changes: training: the base model or data changed" in out
    assert any(t.startswith("train") for t in third["tasks"])
