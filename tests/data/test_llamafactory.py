"""LLaMA-Factory's alpaca and sharegpt data: detected, converted to messages, trained on; bad rows named."""

import json

import pytest

from tests.conftest import CHAT_ROWS
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.data.dataset import build_dataset
from trainer_lib.data.formats import detect_format
from trainer_lib.data.llamafactory import converter
from trainer_lib.errors import ConfigError, DataError
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = ["model.path=m", "output_dir=o"]


def msg(role, content):
    return {"role": role, "content": content}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _data_cfg(path, *extra):
    return load_config(SFTConfig, None, [*REQUIRED, f"data.path={path}", *extra]).data


def test_detected_by_their_columns():
    assert detect_format(["instruction", "input", "output"]) == "alpaca"
    assert detect_format(["instruction", "output", "system", "history", "id"]) == "alpaca"
    assert detect_format(["conversations", "system"]) == "sharegpt"
    assert detect_format(["messages", "conversations"]) == "messages"  # TRL's own name first


def test_alpaca_rows_become_messages():
    convert = converter("alpaca")
    row = {
        "instruction": "Add the numbers.",
        "input": "2 + 2",
        "output": "4",
        "system": "Be brief.",
        "history": [["Hi", "Hello!"]],
        "id": 7,
    }
    assert convert(row, "d:1") == {
        "messages": [
            msg("system", "Be brief."),
            msg("user", "Hi"),
            msg("assistant", "Hello!"),
            msg("user", "Add the numbers.\n2 + 2"),
            msg("assistant", "4"),
        ],
        "id": 7,
    }
    assert convert({"instruction": "Say hi.", "input": "", "output": "Hi"}, "d:1")["messages"] == [
        msg("user", "Say hi."),
        msg("assistant", "Hi"),
    ]
    renamed = converter("alpaca", {"prompt": "question", "response": "answer"})
    assert renamed({"question": "Q?", "answer": "A."}, "d:1") == {
        "messages": [msg("user", "Q?"), msg("assistant", "A.")]
    }
    assert converter("alpaca", {"instruction": "q", "output": "a"})({"q": "Q?", "a": "A."}, "d:1") == {
        "messages": [msg("user", "Q?"), msg("assistant", "A.")]
    }


CALL = {"type": "function", "function": {"name": "weather", "arguments": "{}"}}


def test_sharegpt_rows_become_messages():
    convert = converter("sharegpt")
    row = {
        "conversations": [
            {"from": "system", "value": "Use tools."},
            {"from": "human", "value": "Weather?"},
            {"from": "function_call", "value": '{"name": "weather"}'},
            {"from": "observation", "value": "sunny"},
            {"from": "gpt", "value": "It is sunny."},
        ],
        "source": "x",
    }
    assert convert(row, "d:1") == {
        "messages": [
            msg("system", "Use tools."),
            msg("user", "Weather?"),
            {"role": "assistant", "content": "", "tool_calls": [CALL]},  # rendered by the template's tool support
            msg("tool", "sunny"),
            msg("assistant", "It is sunny."),
        ],
        "source": "x",
    }
    with_column = {
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}],
        "system": "Be kind.",
    }
    assert convert(with_column, "d:1")["messages"][0] == msg("system", "Be kind.")
    openai_style = converter(
        "sharegpt",
        {
            "messages": "messages",
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
        },
    )
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    assert openai_style(row, "d:1") == {"messages": [msg("user", "Hi"), msg("assistant", "Yo")]}


@pytest.mark.parametrize(
    "rows, extra, message",
    [
        (
            [{"instruction": "a", "output": "b"}, {"instruction": "a", "output": None}],
            [],
            "alpaca.jsonl:2: field 'output': expected string, got null",
        ),
        (
            [{"instruction": "a", "output": "b"}, {"instruction": "a", "input": 3, "output": "b"}],
            [],
            "alpaca.jsonl:2: field 'input': expected string or null, got int 3",
        ),
        (
            [{"instruction": "a", "output": "b"}, {"output": "b"}],
            [],
            "alpaca.jsonl:2: field 'instruction': expected string, got null",
        ),
        (
            [{"instruction": "a", "output": "b", "history": [["u", "a"], ["only one"]]}],
            [],
            "alpaca.jsonl:1: field 'history[1]': expected a [user, assistant] pair of strings, got list ['only one']",
        ),
        (
            [{"question": "q", "answer": "a"}, {"question": "q"}],
            ['data.columns={"prompt": "question", "response": "answer"}'],
            "alpaca.jsonl:2: field 'answer': expected string, got null",
        ),
        (
            [
                {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
                {"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]},
            ],
            [],
            "alpaca.jsonl:2: field 'conversations[1].from': expected one of gpt, function_call (turns alternate "
            "user/assistant, this one is the assistant's), got str 'human'",
        ),
        (
            [{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": None}]}],
            [],
            "alpaca.jsonl:1: field 'conversations[1].value': expected string or list of text parts, got null",
        ),
        (
            [{"conversations": [{"from": "human", "value": "a"}]}],
            [],
            "alpaca.jsonl:1: field 'conversations': expected to end with an assistant turn (gpt, function_call)",
        ),
        (
            [{"conversations": "hello"}],
            ["data.format=sharegpt"],
            "alpaca.jsonl:1: field 'conversations': expected a non-empty list of messages, got str 'hello'",
        ),
    ],
)
def test_malformed_rows_name_file_line_and_field(tmp_path, rows, extra, message):
    path = _write_jsonl(tmp_path / "alpaca.jsonl", rows)
    with pytest.raises(DataError) as err:
        build_dataset(_data_cfg(path, *extra), seed=0)
    assert str(err.value).startswith(str(tmp_path / message))


def test_columns_setting_is_checked_with_the_config():
    cfg = load_config(SFTConfig, None, [*REQUIRED, "data.path=d", 'data.columns={"prompt": "q", "response": "a"}'])
    assert cfg.data.columns == {"prompt": "q", "response": "a"}
    with pytest.raises(ConfigError, match="data.columns: unknown name 'answer' for alpaca data"):
        load_config(SFTConfig, None, [*REQUIRED, "data.path=d", 'data.columns={"answer": "a"}'])
    with pytest.raises(
        ConfigError, match="data.columns: renames the columns of alpaca or sharegpt data, not of data.format=messages"
    ):
        load_config(SFTConfig, None, [*REQUIRED, "data.path=d", "data.format=messages", 'data.columns={"prompt": "q"}'])


def _alpaca_rows():
    return [{"instruction": q, "input": "", "output": a} for q, a in CHAT_ROWS] * 4


def _sharegpt_rows():
    return [
        {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}], "system": "You are terse."}
        for q, a in CHAT_ROWS
    ] * 4


def _sft(tiny_model_dir, out, *args):
    assert (
        main(
            [
                "sft",
                f"model.path={tiny_model_dir}",
                f"output_dir={out}",
                "max_steps=3",
                "batch_size=2",
                "data.max_length=64",
                "lr=3e-3",
                "save_steps=0",
                *args,
            ]
        )
        == 0
    )
    return json.loads((out / "summary.json").read_text())


def test_alpaca_and_sharegpt_files_train(tiny_model_dir, tmp_path):
    alpaca = tmp_path / "alpaca.json"  # LLaMA-Factory's files are JSON lists
    alpaca.write_text(json.dumps(_alpaca_rows(), indent=2))
    dd, stats = build_dataset(_data_cfg(alpaca), seed=0)
    assert (stats["format"], stats["source_format"]) == ("messages", "alpaca")
    assert dd["train"][0]["messages"][0]["role"] == "user"
    assert _sft(tiny_model_dir, tmp_path / "a", f"data.path={alpaca}")["format"] == "messages"

    sharegpt = _write_jsonl(tmp_path / "sharegpt.jsonl", _sharegpt_rows())
    dd, stats = build_dataset(_data_cfg(sharegpt, "data.format=sharegpt"), seed=0)
    assert stats["source_format"] == "sharegpt"
    assert [m["role"] for m in dd["train"][0]["messages"]] == ["system", "user", "assistant"]
    assert _sft(tiny_model_dir, tmp_path / "s", f"data.path={sharegpt}")["steps"] == 3


def test_a_llamafactory_config_with_dataset_info_trains(tiny_model_dir, tmp_path, capsys):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    rows = [{"question": q, "answer": a} for q, a in CHAT_ROWS] * 4
    (data_dir / "qa.json").write_text(json.dumps(rows))
    (data_dir / "dataset_info.json").write_text(
        json.dumps({"my_qa": {"file_name": "qa.json", "columns": {"prompt": "question", "response": "answer"}}})
    )
    cfg_file = tmp_path / "lf.yaml"
    cfg_file.write_text(
        f"stage: sft\ndo_train: true\nmodel_name_or_path: {tiny_model_dir}\n"
        f"dataset: my_qa\ndataset_dir: {data_dir}\ncutoff_len: 64\nfinetuning_type: full\n"
        f"output_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 2\nmax_steps: 3\n"
        f"learning_rate: 3.0e-3\nsave_steps: 0\n"
    )
    assert main(["sft", "--config", str(cfg_file)]) == 0
    assert "config: dataset -> data.dataset\n" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["train_examples"] > 0
    (data_dir / "dataset_info.json").write_text(json.dumps({"my_qa": {"file_name": "qa.json", "num_samples": 5}}))
    with pytest.raises(ConfigError, match="data.dataset: 'my_qa' in .* uses 'num_samples', which posttrain does not"):
        load_config(SFTConfig, str(cfg_file), stage="sft")
