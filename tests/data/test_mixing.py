"""Several datasets of dataset_info.json, mixed as LLaMA-Factory mixes them (datasets.interleave_datasets' rules)."""

import json

import pytest

from trainer_lib.config import load_config
from trainer_lib.data.dataset import build_dataset
from trainer_lib.data.mixing import mix_indices
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.stages.training.sft import SFTConfig


def test_round_robin_rounds_follow_the_smallest_or_the_largest():
    # datasets of 3, 4 and 5 rows sit at offsets 0, 3, 7 (the example in datasets' own source)
    assert mix_indices([3, 4, 5], "concat") == list(range(12))
    assert mix_indices([3, 4, 5], "interleave_under") == [0, 3, 7, 1, 4, 8, 2, 5, 9]
    assert mix_indices([3, 4, 5], "interleave_over") == [0, 3, 7, 1, 4, 8, 2, 5, 9, 0, 6, 10, 1, 3, 11]


def test_random_draws_stop_at_the_first_or_the_last_dataset_to_run_out():
    under = mix_indices([2, 50], "interleave_under", [0.5, 0.5], seed=3)
    assert under[-1] == 1 and under.count(0) == 1 and sorted(i for i in under if i < 2) == [0, 1]  # stops at row 1
    over = mix_indices([2, 50], "interleave_over", [0.5, 0.5], seed=3)
    assert set(range(52)) <= set(over) and over.count(50 + 1) == 1  # every row once; the small one oversampled
    assert over.count(0) > 5 and mix_indices([2, 50], "interleave_over", [0.5, 0.5], seed=3) == over  # seeded
    shares = mix_indices([1000, 1000], "interleave_under", [0.8, 0.2], seed=0)
    assert 0.75 < sum(i < 1000 for i in shares) / len(shares) < 0.85
    assert mix_indices([3, 4], "interleave_over", [1.0, 0.0]) == [0, 1, 2]  # probability 0: never drawn
    with pytest.raises(ValueError, match="mix strategy: expected concat"):
        mix_indices([1], "shuffle")


@pytest.fixture
def registry(tmp_path):
    alpaca = [{"instruction": f"Question {i}?", "input": "", "output": f"Answer {i}."} for i in range(6)]
    sharegpt = [
        {"conversations": [{"from": "human", "value": f"Hi {i}"}, {"from": "gpt", "value": f"Hello {i}"}]}
        for i in range(2)
    ]
    (tmp_path / "qa.json").write_text(json.dumps(alpaca))
    (tmp_path / "chat.json").write_text(json.dumps(sharegpt))
    info = {"qa": {"file_name": "qa.json"}, "chat": {"file_name": "chat.json", "formatting": "sharegpt"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    return tmp_path


def _data(registry, *overrides):
    keys = ["model.path=m", "output_dir=o", f"data.dataset_dir={registry}", "data.eval_fraction=0", *overrides]
    return load_config(SFTConfig, None, keys).data


@pytest.mark.parametrize(
    "overrides, rows, mix_rows",
    [
        ([], 8, 8),
        (["data.mix_strategy=interleave_under"], 4, 4),  # 2 rounds of the 2-row dataset
        (["data.mix_strategy=interleave_over"], 12, 12),  # 6 rounds, the small one 3 times over
        (["data.max_rows=1", "data.mix_strategy=interleave_over"], 2, 2),
    ],
)
def test_two_formats_of_one_kind_mix(registry, overrides, rows, mix_rows):
    dd, stats = build_dataset(_data(registry, "data.dataset=qa,chat", *overrides), seed=0)
    assert len(dd["train"]) == rows and stats["mix"]["rows"] == mix_rows
    assert [m["name"] for m in stats["mix"]["datasets"]] == ["qa", "chat"]
    assert stats["format"] == "messages" and stats["source_format"] is None  # alpaca and sharegpt, both messages
    firsts = [row["messages"][0]["content"] for row in dd["train"]]
    assert firsts[0] == "Question 0?" and "Hi 0" in firsts


def test_registry_errors_name_the_entry(registry):
    (registry / "prefs.json").write_text(json.dumps([{"prompt": "p", "chosen": "a", "rejected": "b"}]))
    info = json.loads((registry / "dataset_info.json").read_text())
    info["prefs"] = {"file_name": "prefs.json", "columns": {"prompt": "prompt", "response": "output"}}
    (registry / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ConfigError, match="data.dataset: no dataset 'nope' in .*dataset_info.json"):
        _data(registry, "data.dataset=qa,nope")
    with pytest.raises(ConfigError, match="data.interleave_probs: expected one probability per dataset"):
        _data(registry, "data.dataset=qa,chat", "data.mix_strategy=interleave_under", "data.interleave_probs=[1.0]")
    with pytest.raises(ConfigError, match="data.interleave_probs: read only with data.mix_strategy interleave"):
        _data(registry, "data.dataset=qa,chat", "data.interleave_probs=[0.5, 0.5]")
    with pytest.raises(ConfigError, match="data.format: with data.dataset, each dataset's entry"):
        _data(registry, "data.dataset=qa", "data.format=alpaca")
    with pytest.raises(UserError, match=r"/prefs.json:1: field 'output': expected string, got null"):
        build_dataset(_data(registry, "data.dataset=qa,prefs"), seed=0)


def test_trl_dataset_mixture_concatenates_its_sources(registry, tmp_path):
    """TRL's `datasets:` list of several: data.sources, read each with its own split and mixed like data.dataset."""
    layer = {
        "model_name_or_path": "m",
        "output_dir": "o",
        "datasets": [{"path": str(registry / "qa.json")}, {"path": str(registry / "chat.json"), "split": "train"}],
        "data": {"eval_fraction": 0},
    }
    data = load_config(SFTConfig, [layer]).data
    assert [s["path"] for s in data.sources] == [str(registry / "qa.json"), str(registry / "chat.json")]
    dd, stats = build_dataset(data, seed=0)
    assert len(dd["train"]) == 8 and stats["mix"]["strategy"] == "concat"
    assert [m["rows"] for m in stats["mix"]["datasets"]] == [6, 2]
    # a later layer's data.path replaces them; a source without a path, or with an unknown key, is refused
    assert load_config(SFTConfig, [layer, {"data": {"path": "d.jsonl"}}]).data.sources == []
    sources = {"sources": [{"path": "a"}, {"path": "b", "files": 1}]}
    with pytest.raises(ConfigError, match=r"data.sources\[1\]: unknown key 'files'; expected path, subset"):
        load_config(SFTConfig, [{"model_name_or_path": "m", "output_dir": "o", "data": sources}])
    with pytest.raises(ConfigError, match=r"data.sources: name the datasets, but data.split is set too"):
        load_config(SFTConfig, [{**layer, "data": {"split": "train"}}])
