"""Hub datasets: data.subset, data.split, data.eval_split and data.revision reach datasets.load_dataset.

No hub here: a local directory laid out like a hub dataset repository (a README whose ``configs``
name the data files of each configuration and split) is read by the same load_dataset call.
"""

import json
import os
import subprocess
import sys

import pytest

from trainer_lib import cli
from trainer_lib.config import DataConfig, load_config
from trainer_lib.data.dataset import build_dataset
from trainer_lib.errors import UserError
from trainer_lib.stages.lifecycle.prepare import PrepareConfig

CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train.jsonl
---
# A tiny dataset with two configurations
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A gsm8k-shaped dataset repository: configurations main (train, test) and socratic (train)."""
    root = tmp_path_factory.mktemp("hub") / "gsm-tiny"
    (root / "main").mkdir(parents=True)
    (root / "socratic").mkdir()
    (root / "README.md").write_text(CARD)
    for config, split, count in (("main", "train", 6), ("main", "test", 3), ("socratic", "train", 5)):
        with open(root / config / f"{split}.jsonl", "w") as fh:
            for i in range(count):
                fh.write(json.dumps({"prompt": f"{config} {split} question {i}", "completion": f"answer {i}"}) + "\n")
    return str(root)


def _data(repo, **keys):
    return load_config(
        PrepareConfig, None, {"data": {"path": repo, "eval_fraction": 0.0, **keys}, "output_dir": "unused"}
    ).data


def _prompts(dd, split):
    return [row["prompt"] for row in dd[split]]


def test_a_subset_is_one_configuration_with_its_own_splits(repo):
    dd, stats = build_dataset(_data(repo, subset="main"), seed=0)
    assert _prompts(dd, "train") == [f"main train question {i}" for i in range(6)]
    assert _prompts(dd, "eval") == [f"main test question {i}" for i in range(3)]  # its test split held out
    assert stats["eval_source"] == f"{repo}[test]"

    dd, _ = build_dataset(_data(repo, subset="socratic", eval_fraction=0.4), seed=0)
    assert {p.split(" question")[0] for p in _prompts(dd, "train") + _prompts(dd, "eval")} == {"socratic train"}
    assert len(dd["eval"]) == 2  # no eval split: data.eval_fraction of its train split


def test_split_and_eval_split_choose_the_splits(repo):
    dd, stats = build_dataset(_data(repo, subset="main", split="test", eval_split="train"), seed=0)
    assert _prompts(dd, "train") == [f"main test question {i}" for i in range(3)]
    assert len(dd["eval"]) == 6 and stats["eval_source"] == f"{repo}[train]"


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"subset": "nope"}, "data.path: could not load '{repo}', subset 'nope' with datasets.load_dataset"),
        ({"subset": "socratic", "split": "test"}, "data.split: {repo} has no split 'test' (it has train)"),
        ({"subset": "main", "eval_split": "validation"}, "data.eval_split: {repo} has no split 'validation'"),
        ({"subset": "main", "split": "test", "eval_split": "test"}, "data.eval_split: 'test' is also data.split"),
        ({"revision": "v2"}, "data.path: {repo} is not a hub dataset, so data.revision ('v2') cannot pin it"),
    ],
)
def test_bad_hub_settings_name_the_setting(repo, keys, message):
    with pytest.raises(UserError) as exc:
        build_dataset(_data(repo, **keys), seed=0)
    assert message.format(repo=repo) in str(exc.value)


def test_a_single_file_is_all_train(repo, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))
    dd, _ = build_dataset(_data(str(path), split="train", eval_fraction=0.25), seed=0)
    assert len(dd["train"]) == 3
    with pytest.raises(UserError, match="data.split: .* has no named splits"):
        build_dataset(_data(str(path), split="test"), seed=0)
    with pytest.raises(UserError, match="subset .* not of a single file"):
        build_dataset(_data(str(path), subset="main"), seed=0)


def test_a_hub_revision_is_asked_for(tmp_path):
    """Offline, the hub cannot answer; the error says which revision of which dataset was asked for."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_lib.cli",
            "prepare",
            "data.path=no-such-org/no-such-dataset",
            "data.subset=main",
            "data.revision=v2.1",
            f"output_dir={tmp_path / 'out'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "could not load 'no-such-org/no-such-dataset', subset 'main', revision 'v2.1'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_eval_split_and_eval_path_exclude_each_other():
    with pytest.raises(Exception, match="data.eval_split: .*data.eval_path"):
        DataConfig(path="x", eval_split="test", eval_path="y.jsonl").validate()


def test_prepare_reads_a_subset(repo, tmp_path, capsys):
    out = tmp_path / "prepared"
    assert cli.main(["prepare", f"data.path={repo}", "data.subset=main", "data.split=train", f"output_dir={out}"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["rows"] == {"train": 6, "eval": 3} and stats["format"] == "prompt_completion"
    capsys.readouterr()
    assert cli.main(["prepare", f"data.path={repo}", "data.subset=nope", f"output_dir={tmp_path / 'x'}"]) == 2
    assert "subset 'nope'" in capsys.readouterr().err and not (tmp_path / "x").exists()
