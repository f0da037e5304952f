"""trainer_lib.runner.dispatch: a config built once is handed over once and read back equal, wherever it runs.

The N-process cases replace only torchrun: the fake launcher runs the worker's own command line
(``posttrain <stage> --config FILE``) in this process with ``--print-config``, so what a worker builds
from the file is what the test compares. The node cases stop at the TrainJob the launcher would create.
"""

import json
import os

import pytest
import yaml

from trainer_lib.cli import main
from trainer_lib.engine import launch
from trainer_lib.engine.checkpoint import stable_checkpoint_dir
from trainer_lib.engine.preemption import PREEMPTED_EXIT, Preempted
from trainer_lib.errors import UserError
from trainer_lib.runner import dispatch as runner
from trainer_lib.runner import trainjob
from trainer_lib.runner.dispatch import Where, dispatch, exit_when_preempted, launch_processes
from trainer_lib.runner.stage_api import config_text, stage_config

WHERE_IT_IS = {"model.path": "s3://b/models/base", "data.path": "s3://b/data/sft.jsonl", "output_dir": "/tmp/out"}
#: per stage, override layers that set every kind of value: lists, dicts, None, text that looks like a number
#: or a boolean, numbers, TRL's and LLaMA-Factory's key names, and the keys two ways of saying a thing share
CASES = {
    "sft": [
        WHERE_IT_IS,
        {
            "num_epochs": 2.5,  # with max_steps at its default beside it
            "lr_scheduler_kwargs": {"power": 2.0, "label": "123", "flag": "yes", "none": None},
            "data.columns": {"prompt": "question", "response": "true"},
            "storage.region": "123",
            "storage.endpoint_url": "http://minio:9000",
            "model.tokenizer_path": "1e5",
            "lora.target_modules": ["q_proj", "v_proj"],
            "report_to": [],
        },
        "learning_rate=2e-5",
        "seed=7",
    ],
    "dpo": [WHERE_IT_IS, {"loss": "ipo", "beta": 0.5, "max_steps": 7, "data.eval_path": None}],
    "reward": [WHERE_IT_IS, "per_device_train_batch_size=2", "num_train_epochs=0", "max_steps=3"],
    "ppo": [WHERE_IT_IS, {"objective": "a2c", "reward.functions": ["length"]}],
    "grpo": [
        WHERE_IT_IS,
        {"reward.functions": ["length", "pkg.rewards:score"], "reward.weights": [1.0, 0.5], "rollout.n": "4"},
    ],
    "evaluate": [
        {"models": ["base=org/base", "sft=s3://b/sft", "true=s3://b/x"], "output_dir": "/tmp/eval"},
        {
            "gate.rules": ["humaneval_pass@1>=baseline", "humaneval_pass@1>=0.2"],
            "candidate": "sft",
            "baseline": "base",
            "seed": 3,
        },
    ],
}


def as_worker_reads_it(stage: str, path: str, capsys) -> object:
    """The config a worker builds from ``path``: its own command line, printed and read back."""
    capsys.readouterr()
    assert main([stage, "--config", path, "--print-config"]) == 0
    return stage_config(stage, [], capsys.readouterr().out)


@pytest.mark.parametrize("stage", list(CASES))
def test_a_config_reads_back_equal_from_its_text(stage):
    cfg = stage_config(stage, CASES[stage])
    text = config_text(cfg)
    assert stage_config(stage, [], text) == cfg
    if stage == "sft":  # the values that YAML could misread stay what they were
        assert (cfg.storage.region, cfg.model.tokenizer_path, cfg.num_epochs, cfg.lr) == ("123", "1e5", 2.5, 2e-5)
        assert cfg.lr_scheduler_kwargs == {"power": 2.0, "label": "123", "flag": "yes", "none": None}
    if stage == "ppo":  # resolved when the config is built, so it travels as it is
        assert cfg.ppo_epochs == 1 and yaml.safe_load(text)["ppo_epochs"] == 1


class Workers:
    """launch_workers without torchrun: runs one worker's command line here and returns its status."""

    def __init__(self, capsys, status: int = 0):
        self.capsys, self.status, self.calls = capsys, status, []

    def __call__(self, nproc, worker_args, env=None):
        module, stage, option, path = worker_args[1:]
        assert (worker_args[0], module, option) == ("-m", "trainer_lib.cli", "--config")
        self.calls.append(dict(nproc=nproc, env=env, path=path, cfg=as_worker_reads_it(stage, path, self.capsys)))
        return self.status


@pytest.mark.parametrize("stage", list(CASES))
def test_n_processes_read_the_config_that_was_built(stage, capsys, monkeypatch):
    workers = Workers(capsys)
    monkeypatch.setattr(launch, "launch_workers", workers)
    cfg = stage_config(stage, CASES[stage])
    assert launch_processes(stage, cfg, 2) == 0
    (call,) = workers.calls
    assert call["cfg"] == cfg and call["nproc"] == 2
    assert not os.path.exists(call["path"])  # the file lives as long as the workers


def test_posttrain_nproc_hands_its_config_over_the_same_way(capsys, monkeypatch, tmp_path):
    workers = Workers(capsys)
    monkeypatch.setattr(launch, "launch_workers", workers)
    (tmp_path / "sft.yaml").write_text("learning_rate: 3.0e-5\nlora:\n  r: 4\n")
    argv = [str(tmp_path / "sft.yaml"), "--nproc", "2", *(f"{k}={v}" for k, v in WHERE_IT_IS.items()), "seed=5"]
    assert main(["sft", *argv]) == 0
    (call,) = workers.calls
    expected = stage_config("sft", [WHERE_IT_IS, "seed=5"], config_files=[str(tmp_path / "sft.yaml")])
    assert call["cfg"] == expected and (call["cfg"].lr, call["cfg"].lora.r) == (3e-5, 4)


def test_workers_status_becomes_the_outcome(capsys, monkeypatch, tmp_path):
    cfg = stage_config("sft", [{**WHERE_IT_IS, "output_dir": str(tmp_path)}])
    (tmp_path / "summary.json").write_text(json.dumps({"stage": "sft", "steps": 3}))
    monkeypatch.setattr(launch, "launch_workers", Workers(capsys))
    assert dispatch("sft", cfg, Where(processes=2)) == {"stage": "sft", "steps": 3}  # rank 0's summary

    monkeypatch.setattr(launch, "launch_workers", Workers(capsys, PREEMPTED_EXIT))
    with pytest.raises(Preempted, match="stopped by SIGTERM after its checkpoint"):
        dispatch("sft", cfg, Where(processes=2))
    with pytest.raises(SystemExit) as stopped:
        with exit_when_preempted():
            dispatch("sft", cfg, Where(processes=2))
    assert stopped.value.code == PREEMPTED_EXIT and "preempted: posttrain sft --nproc 2" in capsys.readouterr().out

    monkeypatch.setattr(launch, "launch_workers", Workers(capsys, 1))
    with pytest.raises(RuntimeError, match=r"posttrain sft --nproc 2 failed \(see the workers' log above\)"):
        dispatch("sft", cfg, Where(processes=2))

    evaluated = stage_config("evaluate", [{**CASES["evaluate"][0], "output_dir": str(tmp_path)}])
    (tmp_path / "metrics.json").write_text(json.dumps({"gate": {"passed": True}}))
    monkeypatch.setattr(launch, "launch_workers", Workers(capsys))
    assert dispatch("evaluate", evaluated, Where(processes=2)) == {"gate": {"passed": True}}  # evaluate's own file


def test_every_way_of_running_uses_the_same_checkpoint_location(capsys, monkeypatch, tmp_path):
    root = "minio://mlpipeline/v2/artifacts"
    cfg = stage_config("sft", [{**WHERE_IT_IS, "output_dir": str(tmp_path)}])
    expected = stable_checkpoint_dir(cfg, root, "sft")
    assert expected.startswith("s3://mlpipeline/v2/artifacts/checkpoints/sft-") and cfg.checkpoint_dir is None
    (tmp_path / "summary.json").write_text("{}")
    ran, seen = [], {}
    monkeypatch.setattr(runner, "run_config", lambda stage, built: ran.append(built) or {"stage": stage})
    assert dispatch("sft", cfg, Where(checkpoint_root=root)) == {"stage": "sft"}
    seen["here"] = ran[-1]

    workers = Workers(capsys)
    monkeypatch.setattr(launch, "launch_workers", workers)
    dispatch("sft", cfg, Where(processes=2, checkpoint_root=root))
    seen["processes"] = workers.calls[0]["cfg"]

    def launched(stage, built, **options):
        seen["nodes"], seen["options"] = built, options
        return trainjob.TrainJobResult("job", "ns", {}, built.output_dir, built.checkpoint_dir, False)

    monkeypatch.setattr(trainjob, "launch_stage", launched)
    monkeypatch.setattr(runner.storage, "download_dir", lambda source, target: None)
    dispatch("sft", cfg, Where(processes=4, nodes=2, checkpoint_root=root, image="img"))

    assert {seen[way].checkpoint_dir for way in ("here", "processes", "nodes")} == {expected}
    assert cfg.checkpoint_dir is None  # the caller's config is left as it was
    # the job's output sits beside its checkpoints and its name follows from them: a retry finds both again
    assert seen["nodes"].output_dir == expected.replace("/checkpoints/", "/jobs/") + "/output"
    assert seen["options"]["run_id"] == expected.rsplit("-", 1)[-1] and seen["options"]["task"] == "sft"
    assert (seen["options"]["num_nodes"], seen["options"]["nproc_per_node"]) == (2, 4)

    own = stage_config("sft", [{**WHERE_IT_IS, "checkpoint_dir": "s3://b/mine"}])
    dispatch("sft", own, Where(checkpoint_root=root))
    assert ran[-1].checkpoint_dir == "s3://b/mine"  # a config's own checkpoint_dir wins


@pytest.mark.parametrize(
    "extra, root, message",
    [
        ({"data.path": "/home/me/sft.jsonl"}, "s3://b/root", "data.path: '/home/me/sft.jsonl' is a path on the"),
        ({"model.tokenizer_path": "./tok"}, "s3://b/root", "model.tokenizer_path: './tok' is a path on the"),
        ({"checkpoint_dir": "/ckpt"}, "s3://b/root", "checkpoint_dir: a TrainJob writes to an object-store"),
        ({}, "/pipeline/root", "nodes=2: the pipeline root must be an object store every node reaches"),
        ({}, "", "nodes=2: the pipeline root must be an object store every node reaches"),
    ],
)
def test_a_local_path_where_a_node_would_read_or_write_is_refused(extra, root, message, monkeypatch):
    monkeypatch.setattr(trainjob, "api_client", lambda: pytest.fail("no request before the check"))
    cfg = stage_config("sft", [WHERE_IT_IS, extra])
    with pytest.raises(UserError, match=message):
        dispatch("sft", cfg, Where(processes=8, nodes=2, checkpoint_root=root, image="img"))
