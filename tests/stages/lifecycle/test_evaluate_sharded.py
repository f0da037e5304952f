"""posttrain evaluate on two real processes (torchrun via --nproc, gloo): the prompts shared out across the
ranks, each model whole on every rank or partitioned across them with ZeRO-3, give the one-process
numbers and outputs exactly, greedy and sampled (HumanEval with n=2)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env
from tests.export.helpers import trained_model_dir  # noqa: F401  (a fixture)
from trainer_lib.cli import main

pytestmark = pytest.mark.distributed


def _args(tiny_model_dir, trained, demo_dir, out):
    # batches of 2 sequences: HumanEval 3 problems x 2 samples and 5 code tasks are 3 batches each, so
    # the ranks compute 2 and 1 (under ZeRO-3 the second rank repeats one and drops it), safety 3 is 2
    return [
        "evaluate",
        f"models=base={tiny_model_dir},tuned={trained}",
        "baseline=base",
        f"data_dir={demo_dir}",
        f"output_dir={out}",
        "humaneval.limit=3",
        "humaneval.n=2",
        "humaneval.k=1,2",
        "humaneval.max_new_tokens=8",
        "tasks.limit=5",
        "tasks.max_new_tokens=10",
        "safety.limit=3",
        "safety.max_new_tokens=8",
        "batch_size=2",
        "sandbox_workers=1",
        "gate.rules=task_pass_rate>=baseline,harmless_rate>=0",
    ]


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, trained_model_dir, demo_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("evaluate-1") / "out"
    assert main(_args(tiny_model_dir, trained_model_dir, demo_dir, out)) == 0
    return out


def _two_processes(args: list[str], tmp_path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer_lib.cli", args[0], "--nproc", "2", *args[1:]],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _files(out) -> dict[str, bytes]:
    folder = os.path.join(out, "per_problem")
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("placement", ["replica", "zero3"])
def test_two_ranks_give_the_one_process_numbers_exactly(
    placement,
    one_process,
    tiny_model_dir,
    trained_model_dir,  # noqa: F811
    demo_dir,
    tmp_path,
):
    out = tmp_path / "out"
    printed = _two_processes(
        [*_args(tiny_model_dir, trained_model_dir, demo_dir, out), f"placement={placement}"], tmp_path
    )
    assert printed.count('"stage": "evaluate"') == 1  # only rank 0 reports

    single, sharded = (json.loads((folder / "metrics.json").read_text()) for folder in (one_process, out))
    assert sharded["generation"] == {"engine": "torch", "placement": placement, "precision": "fp32", "ranks": 2}
    assert single["generation"]["ranks"] == 1
    assert sharded["models"] == single["models"] and sharded["gate"] == single["gate"]
    assert set(single["models"]["tuned"]) >= {"humaneval_pass@2", "task_pass_rate", "harmless_rate"}
    assert _files(out) == _files(one_process)  # every generated text, in order

    samples = [json.loads(line) for line in (out / "per_problem" / "tuned_humaneval.jsonl").read_text().splitlines()]
    completions = [s["completion"] for row in samples for s in row["samples"]]
    assert len(completions) == 6 and len(set(completions)) > 3  # sampled: the two samples of a problem differ
