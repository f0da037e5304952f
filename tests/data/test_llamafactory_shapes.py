"""LLaMA-Factory's other data shapes: ranked pairs, kto_tag, tools, .txt corpora, content parts; each
with a bad row whose error names the file, the row and the field."""

import json

import pytest

from trainer_lib.config import load_config
from trainer_lib.data.dataset import build_dataset
from trainer_lib.data.formats import normalize_row
from trainer_lib.data.llamafactory import converter, registry_sources, target_format
from trainer_lib.data.tokenize import IGNORE, tokenize_sft
from trainer_lib.errors import DataError, UserError
from trainer_lib.stages.training.sft import SFTConfig


def _registry(tmp_path, files: dict, info: dict):
    for name, rows in files.items():
        path = tmp_path / name
        path.write_text(rows if isinstance(rows, str) else json.dumps(rows, indent=1), encoding="utf-8")
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    return tmp_path


def _build(registry, names: str, allowed=None):
    keys = ["model.path=m", "output_dir=o", f"data.dataset_dir={registry}", f"data.dataset={names}"]
    cfg = load_config(SFTConfig, None, [*keys, "data.eval_fraction=0"]).data
    return build_dataset(cfg, seed=0, allowed_formats=allowed)


def _turn(role, value):
    return {"from": role, "value": value}


RANKED = {
    "conversations": [_turn("human", "Name a colour.")],
    "chosen": _turn("gpt", "Blue."),
    "rejected": _turn("gpt", "Seven."),
}


def test_ranked_sharegpt_rows_become_preference_pairs(tmp_path):
    info = {"pairs": {"file_name": "pairs.json", "ranking": True, "formatting": "sharegpt"}}
    registry = _registry(tmp_path, {"pairs.json": [RANKED, {**RANKED, "chosen": _turn("gpt", "Red.")}]}, info)
    (entry,) = registry_sources(["pairs"], str(registry))
    assert entry["columns"] == {"chosen": "chosen", "rejected": "rejected"}  # ranking's default columns
    dd, stats = _build(registry, "pairs", allowed=("preference",))
    assert stats["format"] == "preference" and stats["conversational"] is True
    row = dd["train"][0]
    assert row["prompt"] == [{"role": "user", "content": "Name a colour."}]
    assert (row["chosen"], row["rejected"]) == (
        [{"role": "assistant", "content": "Blue."}],
        [{"role": "assistant", "content": "Seven."}],
    )
    (tmp_path / "direct.jsonl").write_text(json.dumps(RANKED) + "\n")  # data.path, no registry: detected
    cfg = load_config(SFTConfig, None, ["model.path=m", "output_dir=o", f"data.path={tmp_path / 'direct.jsonl'}"])
    dd, stats = build_dataset(cfg.data, seed=0, allowed_formats=("preference",))
    assert (stats["source_format"], stats["format"]) == ("sharegpt", "preference") and dd["train"][0] == row
    alpaca = converter("alpaca", {"chosen": "good", "rejected": "bad"})
    assert alpaca({"instruction": "Add.", "input": "1+1", "good": "2", "bad": "3"}, "d:1") == {
        "prompt": [{"role": "user", "content": "Add.\n1+1"}],
        "chosen": [{"role": "assistant", "content": "2"}],
        "rejected": [{"role": "assistant", "content": "3"}],
    }

    bad = {**RANKED, "conversations": [_turn("human", "Hi"), _turn("gpt", "Hello")]}
    (tmp_path / "pairs.json").write_text(json.dumps([RANKED, bad], indent=1))
    with pytest.raises(DataError, match=r"pairs.json:18: field 'conversations': expected to end with a user turn"):
        _build(registry, "pairs")
    (tmp_path / "pairs.json").write_text(json.dumps([{**RANKED, "rejected": _turn("human", "No.")}], indent=1))
    with pytest.raises(DataError, match=r"pairs.json:2: field 'rejected.from': expected one of gpt, function_call"):
        _build(registry, "pairs")
    info["pairs"] = {"file_name": "pairs.json", "formatting": "sharegpt", "columns": {"chosen": "c", "rejected": "r"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="columns name chosen/rejected, which are read only with ranking: true"):
        registry_sources(["pairs"], str(registry))


KTO_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


def test_kto_tag_rows_become_unpaired_preference(tmp_path):
    def row(answer, label):
        return {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": answer}], "tag": label}

    info = {
        "kto": {
            "file_name": "kto.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "tag"},
        }
    }
    info["kto"]["tags"] = KTO_TAGS
    registry = _registry(tmp_path, {"kto.json": [row("Yes.", True), row("No.", False)]}, info)
    dd, stats = _build(registry, "kto")
    assert stats["format"] == "unpaired_preference"
    assert dd["train"]["label"] == [True, False]
    assert dd["train"][1]["prompt"] == [{"role": "user", "content": "Q?"}]
    assert dd["train"][1]["completion"] == [{"role": "assistant", "content": "No."}]
    columns = json.dumps({"messages": "messages", "kto_tag": "tag", **KTO_TAGS})  # data.path: the same keys
    keys = ["model.path=m", "output_dir=o", f"data.path={tmp_path / 'kto.json'}", f"data.columns={columns}"]
    _, stats = build_dataset(load_config(SFTConfig, None, [*keys, "data.eval_fraction=0"]).data, seed=0)
    assert (stats["source_format"], stats["format"], stats["rows"]["train"]) == ("sharegpt", "unpaired_preference", 2)
    (tmp_path / "kto.json").write_text(json.dumps([row("Yes.", True), row("No.", "bad")], indent=1))
    with pytest.raises(DataError, match=r"kto.json:15: field 'tag': expected true or false \(kto_tag"):
        _build(registry, "kto")


def test_txt_corpus_and_alpaca_text_columns_become_text_rows(tmp_path):
    corpus = "The first document.\n\nThe second one.\n"
    info = {"wiki": {"file_name": "wiki.txt", "columns": {"prompt": "text"}}}
    registry = _registry(tmp_path, {"wiki.txt": corpus}, info)
    assert target_format("alpaca", registry_sources(["wiki"], str(registry))[0]["columns"]) == "text"
    dd, stats = _build(registry, "wiki")
    assert stats["format"] == "text" and stats["dropped"]["empty"] == 1  # one row per line, as datasets' text builder
    assert dd["train"]["text"] == ["The first document.", "The second one."]
    (tmp_path / "wiki.txt").write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(DataError, match=r"wiki.txt:2: .*not valid UTF-8"):
        _build(registry, "wiki")
    (tmp_path / "c4.jsonl").write_text('{"text": "a"}\n{"text": 7}\n')
    info["c4"] = {"file_name": "c4.jsonl", "columns": {"prompt": "text"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"c4.jsonl:2: field 'text': expected string, got int 7"):
        _build(registry, "c4")


def test_content_parts_are_joined_and_other_parts_refused():
    parts = [{"type": "text", "text": "Look at "}, {"type": "text", "text": "this."}]
    row = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "Nice."}]}
    assert normalize_row(row, "messages", "d.jsonl:1")["messages"][0] == {"role": "user", "content": "Look at this."}
    sharegpt = converter("sharegpt")({"conversations": [_turn("human", parts), _turn("gpt", "Ok.")]}, "d.json:1")
    assert sharegpt["messages"][0]["content"] == "Look at this."
    image = [{"type": "text", "text": "What is it?"}, {"type": "image_url", "image_url": {"url": "x.png"}}]
    row["messages"][0]["content"] = image
    with pytest.raises(DataError) as err:
        normalize_row(row, "messages", "d.jsonl:3")
    assert str(err.value) == (
        "d.jsonl:3: field 'messages[0].content[1].type': expected a text part (posttrain trains text-only models), "
        "got str 'image_url'"
    )


TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GLAIVE_ROW = {
    "conversations": [
        _turn("human", "Weather in Oslo?"),
        _turn("function_call", '{"name": "weather", "arguments": {"city": "Oslo"}}'),
        _turn("observation", '{"temp": 3}'),
        _turn("gpt", "It is 3 degrees."),
    ],
    "tools": '[{"name": "weather", "description": "Current weather", "parameters": {"type": "object"}}]',
}


def test_tools_and_tool_calls_go_through_the_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    row = converter("sharegpt", {"tools": "tools"})(GLAIVE_ROW, "glaive.json:1")
    assert row["tools"] == json.dumps(json.loads(GLAIVE_ROW["tools"]))
    row = normalize_row(row, "messages", "glaive.json:1")
    assert row["messages"][1]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_TEMPLATE
    example = tokenize_sft(row, "messages", tokenizer, 512)
    text = tokenizer.decode(example["input_ids"])
    assert 'Tools: [{"description": "Current weather"' in text or 'Tools: [{"name": "weather"' in text
    assert '<call>weather {"city": "Oslo"}</call>' in text  # the arguments as a mapping, as templates expect
    trained = tokenizer.decode([t for t in example["labels"] if t != IGNORE])
    assert '<call>weather {"city": "Oslo"}</call>' in trained and "It is 3 degrees." in trained
    assert "Weather in Oslo?" not in trained and "temp" not in trained  # the user's turn and the tool's answer
    # an RL prompt with tools: the policy sees them too
    from trainer_lib.rl.experience import prompt_inputs

    prompt = [{"role": "user", "content": "Weather in Oslo?"}]
    _, ids, columns = prompt_inputs([{"prompt": prompt, "tools": row["tools"]}], tokenizer, 2)
    assert 'Tools: [{"' in tokenizer.decode(ids[0]) and columns["tools"] == [row["tools"]] * 2

    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(UserError, match="the chat template has no tool support"):
        tokenize_sft(row, "messages", tokenizer, 512)
    bad = {**GLAIVE_ROW, "conversations": [_turn("human", "Hi"), _turn("function_call", "weather please")]}
    with pytest.raises(DataError, match=r"glaive.json:2: field 'conversations\[1\].value': expected a JSON tool call"):
        converter("sharegpt", {"tools": "tools"})(bad, "glaive.json:2")
    with pytest.raises(DataError, match=r"glaive.json:3: field 'tools': expected a JSON list of tool definitions"):
        converter("sharegpt", {"tools": "tools"})({**GLAIVE_ROW, "tools": "not json"}, "glaive.json:3")


def test_media_columns_are_refused_as_text_only(tmp_path):
    info = {"mm": {"file_name": "mm.json", "formatting": "sharegpt", "columns": {"videos": "videos"}}}
    registry = _registry(tmp_path, {"mm.json": []}, info)
    with pytest.raises(ValueError, match="videos: names a media column; posttrain reads images, not video or audio"):
        registry_sources(["mm"], str(registry))
