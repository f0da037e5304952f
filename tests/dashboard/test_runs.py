"""Reading runs for the dashboard: what a damaged folder still shows, and what it names."""

import json
import shutil

from trainer_lib.dashboard.runs import config_differences, detail, find_runs, samples, summarize


def test_every_stage_output_is_found_with_its_state(dashboard_runs):
    rows = {run_id: summarize(run) for run_id, run in find_runs([str(dashboard_runs)]).items()}
    assert set(rows) == {"0/pipeline-a/grpo", "0/pipeline-a/grpo-lr", "0/pipeline-a/evaluate", "0/pipeline-b/broken"}
    grpo = rows["0/pipeline-a/grpo"]
    assert (grpo["stage"], grpo["status"], grpo["step"], grpo["total_steps"], grpo["pipeline"]) == (
        "grpo",
        "finished",
        4,
        4,
        "pipeline-a",
    )
    logged = [json.loads(line) for line in open(dashboard_runs / "pipeline-a" / "grpo" / "metrics.jsonl")]
    assert grpo["key_metric"] == {"name": "reward", "split": "train", "value": logged[-1]["reward"]}
    assert rows["0/pipeline-a/evaluate"]["stage"] == "evaluate" and rows["0/pipeline-a/evaluate"]["gate"] == {
        "passed": False
    }
    assert rows["0/pipeline-b/broken"]["status"] == "stale"  # its heartbeat stopped 500 s ago


def test_a_damaged_run_shows_what_is_readable_and_names_the_rest(dashboard_runs, tmp_path):
    broken = shutil.copytree(dashboard_runs / "pipeline-b" / "broken", tmp_path / "broken")
    (broken / "samples.jsonl").write_text('{"step": 1, "kind": "rollout", "reward": 0.5}\n{"step": 2, "ki')
    (broken / "lineage.json").write_text('{"stages": [{"stage": "sf')  # half-written
    run = find_runs([str(tmp_path)])["0/broken"]
    page = detail(run)
    assert [r["step"] for r in page["metrics"]] == [1, 2, 3]  # the truncated 4th line is left out...
    assert any("metrics.jsonl: line 4" in p for p in page["problems"])  # ...and named
    assert any(p.startswith("lineage.json: not valid JSON") for p in page["problems"])
    assert page["checkpoints"] == ["checkpoints/step-00000002: no COMPLETE marker (half-written; a resume skips it)"]
    assert page["summary"] is None and page["config"] == {"lr": 1e-4} and page["stage"] == "sft"
    shown = samples(run)
    assert [r["step"] for r in shown["rows"]] == [1] and "samples.jsonl: line 2" in shown["problems"][0]
    (broken / "heartbeat.json").unlink()
    assert summarize(find_runs([str(tmp_path)])["0/broken"])["status"] == "unknown"


def test_samples_filter_by_reward_and_step(dashboard_runs):
    run = find_runs([str(dashboard_runs)])["0/pipeline-a/grpo"]
    everything = samples(run)
    assert everything["steps"] == [4, 3, 2, 1] and everything["total"] == 4 * 8
    rewards = sorted(r["reward"] for r in everything["rows"])
    middle = rewards[len(rewards) // 2]
    high = samples(run, min_reward=middle)
    assert high["rows"] and all(r["reward"] >= middle for r in high["rows"])
    assert high["total"] == sum(1 for r in rewards if r >= middle)
    assert {r["step"] for r in samples(run, step=3)["rows"]} == {3}


def test_config_differences_list_only_what_differs():
    diffs = config_differences({"a": {"lr": 0.1, "seed": 1, "x": [1]}, "b": {"lr": 0.2, "seed": 1, "x": [1]}})
    assert diffs == [{"key": "lr", "values": {"a": 0.1, "b": 0.2}}]
    assert config_differences({"a": {"only": 1}, "b": {}}) == [{"key": "only", "values": {"a": 1, "b": None}}]


def test_a_growing_file_is_read_from_where_it_grew_and_a_replaced_one_anew(tmp_path):
    import os

    from trainer_lib.dashboard.runs import LineCache

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "spl')  # a writer mid-line
    cache = LineCache()
    assert cache.read(str(path)) == ([{"step": 1}, {"step": 2}], [3])
    with open(path, "a") as fh:
        fh.write('it": "train"}\n{"step": 4}\n')
    assert cache.read(str(path)) == ([{"step": 1}, {"step": 2}, {"step": 3, "split": "train"}, {"step": 4}], [])
    replaced = tmp_path / "new.jsonl"  # what a resumed run's truncation does: a new file put in place
    replaced.write_text('{"step": 1}\n{"step": 2, "again": true}\n[1]\n')
    os.replace(replaced, path)
    assert cache.read(str(path)) == ([{"step": 1}, {"step": 2, "again": True}], [3])


def test_a_long_run_is_thinned_evenly_keeping_eval_records_and_the_last_step():
    from trainer_lib.dashboard.runs import thinned

    records = [{"step": s, "split": "train"} for s in range(1, 10_001)]
    records += [{"step": s, "split": "eval"} for s in (5000, 10000)]
    shown, stride = thinned(records, limit=1000)
    train = [r["step"] for r in shown if r["split"] == "train"]
    assert stride == 10 and train[:3] == [1, 11, 21] and train[-1] == 10_000 and len(train) == 1001
    assert [r["step"] for r in shown if r["split"] == "eval"] == [5000, 10000]
    assert thinned(records[:500], limit=1000) == (records[:500], 1)


def test_a_pipeline_roots_tasks_show_with_their_outputs(tmp_path, dashboard_runs):
    """kfp.local (and a pipeline root in the object store) leaves each task's executor_output.json: a task
    folder is an entry of its own, unless a stage output lies in it (train/output_model shows that task)."""
    root = tmp_path / "posttrain-all-2026"
    (root / "prepare").mkdir(parents=True)
    output = {
        "artifacts": {
            "metrics": {
                "artifacts": [
                    {"name": "metrics", "uri": str(root / "prepare/metrics"), "metadata": {"rows_read": 2200}}
                ]
            },
            "prepared": {"artifacts": [{"name": "prepared", "uri": str(root / "prepare/prepared"), "metadata": {}}]},
        }
    }
    (root / "prepare" / "executor_output.json").write_text(json.dumps(output))
    shutil.copytree(dashboard_runs / "pipeline-a" / "grpo", root / "train" / "output_model")
    (root / "train" / "executor_output.json").write_text(json.dumps({"parameterValues": {"Output": ""}}))
    runs = find_runs([str(tmp_path)])
    assert set(runs) == {"0/posttrain-all-2026/prepare", "0/posttrain-all-2026/train/output_model"}
    prepare = detail(runs["0/posttrain-all-2026/prepare"])
    assert (prepare["stage"], prepare["status"], prepare["pipeline"]) == ("prepare", "finished", "posttrain-all-2026")
    assert prepare["key_metric"] == {"name": "rows_read", "split": "task", "value": 2200}
    assert [o["name"] for o in prepare["task_outputs"]] == ["metrics", "prepared"]
    assert summarize(runs["0/posttrain-all-2026/train/output_model"])["stage"] == "grpo"


def test_a_root_that_cannot_be_listed_is_named_and_the_others_still_show(dashboard_runs, tmp_path):
    problems = []
    runs = find_runs([str(tmp_path / "nowhere"), str(dashboard_runs)], problems)
    assert len(runs) == 4 and all(run_id.startswith("1/") for run_id in runs)
    assert problems == [f"{tmp_path / 'nowhere'}: cannot be listed (no folder {tmp_path / 'nowhere'})"]


def test_a_release_shows_what_made_it(dashboard_runs, tmp_path, tiny_model_dir):
    """The real release stage on the tiny GRPO run: the dashboard reads its release.json (base model, data,
    the stages behind it, the gate) beside the model's lineage."""
    from trainer_lib.cli import main

    evaluation = tmp_path / "metrics.json"
    passed = {"passed": True, "candidate": "grpo", "rules": [{"rule": "task_pass_rate>=0", "passed": True}]}
    evaluation.write_text(
        json.dumps({"candidate": "grpo", "models": {"grpo": {"task_pass_rate": 0.5}}, "gate": passed})
    )
    prompts = dashboard_runs.parent / "prompts.jsonl"
    args = [
        "release",
        f"model_path={dashboard_runs / 'pipeline-a' / 'grpo'}",
        f"release_uri={tmp_path / 'runs' / 'v1'}",
    ]
    args += [f"evaluation={evaluation}", f"lineage.sources=base_model={tiny_model_dir},prompt_dataset={prompts}"]
    assert main(args) == 0
    page = detail(find_runs([str(tmp_path / "runs")])["0/v1"])
    assert (page["stage"], page["status"]) == ("release", "finished")
    lineage = page["release"]["lineage"]
    assert lineage["base_model"]["location"] == tiny_model_dir and "prompt_dataset" in lineage["data"]
    assert [s["stage"] for s in lineage["stages"]] == ["grpo"] and page["release"]["gate"]["passed"] is True


def test_a_half_written_release_json_is_named(dashboard_runs, tmp_path):
    release = shutil.copytree(dashboard_runs / "pipeline-a" / "grpo", tmp_path / "v2")
    (release / "release.json").write_text('{"source": "s3://b/m", "lin')
    page = detail(find_runs([str(tmp_path)])["0/v2"])
    assert page["release"] is None and any(p.startswith("release.json: not valid JSON") for p in page["problems"])


def test_a_running_evaluation_shows_before_its_metrics(tmp_path):
    """evaluate's heartbeat.json (written from its start) lists it as running, with its progress."""
    from trainer_lib.loop.heartbeat import Heartbeat

    out = tmp_path / "runs" / "evaluate"
    out.mkdir(parents=True)
    beat = Heartbeat(str(out), "evaluate", 4)
    beat.start(0)
    beat.step(1)
    beat.write()
    try:
        (row,) = [summarize(run) for run in find_runs([str(tmp_path / "runs")]).values()]
        assert (row["stage"], row["status"], row["step"], row["total_steps"]) == ("evaluate", "running", 1, 4)
    finally:
        beat.end("finished")
