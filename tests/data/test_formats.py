"""Format detection, normalization, implicit prompts and row errors (pure Python)."""

import pytest

from trainer_lib.data.formats import (
    FORMATS,
    canonical_key,
    detect_format,
    extract_prompt,
    is_conversational,
    is_empty,
    normalize_row,
    row_format,
)
from trainer_lib.errors import DataError


def conv(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


@pytest.mark.parametrize(
    "columns, fmt",
    [
        (["text"], "text"),
        (["text", "kind"], "text"),
        (["prompt", "completion"], "prompt_completion"),
        (["prompt", "completion", "tests", "entry_point"], "prompt_completion"),
        (["messages"], "messages"),
        (["messages", "task_id"], "messages"),
        (["prompt", "chosen", "rejected"], "preference"),
        (["chosen", "rejected", "margin"], "preference"),
        (["prompt", "completion", "label"], "unpaired_preference"),
        (["prompt"], "prompt_only"),
        (["prompt", "tests", "entry_point"], "prompt_only"),
        (["question", "answer"], "gsm8k"),
        (["prompt", "question", "answer"], "prompt_only"),
        (["text", "code", "test_list", "test_setup_code", "task_id"], "mbpp"),
    ],
)
def test_detect_format(columns, fmt):
    assert detect_format(columns) == fmt
    assert detect_format(dict.fromkeys(columns)) == fmt


def test_detect_unknown_columns():
    with pytest.raises(DataError) as exc:
        detect_format({"query": 1, "response": 2}, "d.jsonl:1")
    assert str(exc.value).startswith("d.jsonl:1: expected the columns of a known format: text | ")
    assert str(exc.value).endswith("got list ['query', 'response']")


def test_formats_constant():
    assert FORMATS["preference"] == ("prompt", "chosen", "rejected")
    assert FORMATS["unpaired_preference"] == ("prompt", "completion", "label")
    assert set(FORMATS) == {"text", "prompt_completion", "messages", "preference", "unpaired_preference", "prompt_only"}


def test_is_conversational():
    assert is_conversational(conv(("user", "hi"), ("assistant", "yo")))
    assert not is_conversational("hi")
    assert not is_conversational([])
    assert not is_conversational([{"role": "bot", "content": "x"}])
    assert not is_conversational([{"role": "user", "content": None}])


def test_normalize_plain_formats_keep_extras():
    row = {"prompt": "def f():", "completion": " return 1", "tests": "assert f() == 1", "entry_point": "f"}
    out = normalize_row(row, "prompt_completion", "x:1")
    assert out == row and list(out) == ["prompt", "completion", "tests", "entry_point"]
    assert normalize_row({"kind": "a", "text": "t"}, "text", "x:1") == {"text": "t", "kind": "a"}
    assert list(normalize_row({"kind": "a", "text": "t"}, "text", "x:1")) == ["text", "kind"]
    assert normalize_row({"prompt": "p", "task_id": 3}, "prompt_only", "x:1") == {"prompt": "p", "task_id": 3}


def test_normalize_messages_keeps_role_and_content_only():
    msgs = [
        {"role": "system", "content": "s", "name": "x"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t"},
    ]
    out = normalize_row({"messages": msgs}, "messages", "x:1")
    assert out["messages"] == conv(("system", "s"), ("user", "u"), ("assistant", "a"), ("tool", "t"))


def test_normalize_conversational_prompt_completion_and_prompt_only():
    p, c = conv(("user", "2+2?")), conv(("assistant", "4"))
    assert normalize_row({"prompt": p, "completion": c}, "prompt_completion", "x:1") == {"prompt": p, "completion": c}
    assert normalize_row({"prompt": p}, "prompt_only", "x:1") == {"prompt": p}


def test_explicit_preference():
    row = {"prompt": "Q", "chosen": "good", "rejected": "bad", "margin": 0.5}
    assert normalize_row(row, "preference", "x:1") == row


def test_implicit_prompt_plain():
    row = {"chosen": "Q: what is 2+2? A: 4", "rejected": "Q: what is 2+2? A: 5"}
    assert normalize_row(row, "preference", "x:1") == {"prompt": "Q: what is 2+2? A:", "chosen": " 4", "rejected": " 5"}
    # cut at the start of the word where they differ, like TRL keeps the space on the answer
    assert extract_prompt("The answer is 42", "The answer is 43") == ("The answer is", " 42", " 43")
    # one is a prefix of the other
    assert extract_prompt("Hello world", "Hello world!!") == ("Hello", " world", " world!!")
    # no whitespace in the shared part: cut at the first difference
    assert extract_prompt("abc", "abd") == ("ab", "c", "d")


def test_implicit_prompt_conversational():
    chosen = conv(("system", "be nice"), ("user", "hi"), ("assistant", "hello!"))
    rejected = conv(("system", "be nice"), ("user", "hi"), ("assistant", "go away"), ("user", "?"))
    out = normalize_row({"chosen": chosen, "rejected": rejected, "kind": "k"}, "preference", "x:1")
    assert out == {"prompt": chosen[:2], "chosen": chosen[2:], "rejected": rejected[2:], "kind": "k"}
    assert list(out) == ["prompt", "chosen", "rejected", "kind"]
    # identical pairs still keep one message on each side
    p, c, r = extract_prompt(chosen, chosen)
    assert p == chosen[:2] and c == r == chosen[2:]


def test_implicit_prompt_without_common_prefix():
    with pytest.raises(DataError) as exc:
        normalize_row({"chosen": "yes", "rejected": "no"}, "preference", "d.jsonl:4")
    assert str(exc.value).startswith("d.jsonl:4: field 'rejected': expected to start with the same prompt as 'chosen'")
    with pytest.raises(ValueError):
        extract_prompt(conv(("user", "a")), conv(("user", "b")))


def test_unpaired_preference_labels():
    base = {"prompt": "p", "completion": "c"}
    assert normalize_row({**base, "label": True}, "unpaired_preference", "x:1")["label"] is True
    assert normalize_row({**base, "label": 0}, "unpaired_preference", "x:1")["label"] is False
    assert normalize_row({**base, "label": 1}, "unpaired_preference", "x:1")["label"] is True
    for bad, got in [("yes", "str 'yes'"), (2, "int 2"), (None, "null")]:
        with pytest.raises(DataError) as exc:
            normalize_row({**base, "label": bad}, "unpaired_preference", "u.jsonl:3")
        assert str(exc.value) == f"u.jsonl:3: field 'label': expected bool (true/false or 0/1), got {got}"


@pytest.mark.parametrize(
    "row, fmt, conversational, message",
    [
        (
            {"prompt": "p", "chosen": None, "rejected": "r"},
            "preference",
            None,
            "field 'chosen': expected string, got null",
        ),
        ({"chosen": "a b", "rejected": None}, "preference", None, "field 'rejected': expected string, got null"),
        ({"text": 5}, "text", None, "field 'text': expected string, got int 5"),
        ({"text": None}, "text", None, "field 'text': expected string, got null"),
        (
            {"prompt": "p", "completion": conv(("assistant", "x"))},
            "prompt_completion",
            None,
            "field 'completion': expected string, got list [{'role': 'assistant', 'content': 'x'}]",
        ),
        (
            {"prompt": None, "completion": None},
            "prompt_completion",
            None,
            "field 'prompt': expected string or list of messages, got null",
        ),
        (
            {"prompt": "p", "completion": "c"},
            "prompt_completion",
            True,
            "field 'prompt': expected list of messages, got str 'p'",
        ),
        ({"messages": "hi"}, "messages", None, "field 'messages': expected list of messages, got str 'hi'"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            "messages",
            None,
            "field 'messages[1].role': expected one of system, user, assistant, tool, got str 'bot'",
        ),
        (
            {"messages": [{"role": "user", "content": None}]},
            "messages",
            None,
            "field 'messages[0].content': expected string or list of text parts, got null",
        ),
        (
            {"messages": ["hi"]},
            "messages",
            None,
            "field 'messages[0]': expected a message {\"role\": ..., \"content\": ...}, got str 'hi'",
        ),
    ],
)
def test_row_errors_name_location_and_field(row, fmt, conversational, message):
    with pytest.raises(DataError) as exc:
        normalize_row(row, fmt, "data.jsonl:7", conversational)
    assert str(exc.value) == f"data.jsonl:7: {message}"


def test_row_format_mixed_and_missing():
    assert row_format({"messages": []}, "messages", "d:2", "d:1") == "messages"
    with pytest.raises(DataError) as exc:
        row_format({"text": "x"}, "messages", "d.jsonl:7", "d.jsonl:1")
    assert str(exc.value) == (
        "d.jsonl:7: expected a 'messages' row like d.jsonl:1 (one format per file), got a 'text' row with columns text"
    )
    # a preference row missing 'rejected' is a missing field, not another format
    assert row_format({"prompt": "p", "chosen": "c"}, "preference", "d:2", "d:1") == "preference"
    with pytest.raises(DataError):
        row_format({"prompt": "p", "completion": "c"}, "prompt_only", "d:2", "d:1")


def test_is_empty_and_canonical_key():
    assert is_empty({"text": "  \n"}, "text")
    assert not is_empty({"text": "x"}, "text")
    assert is_empty({"prompt": "p", "chosen": "", "rejected": "r"}, "preference")
    assert is_empty({"messages": conv(("user", " "), ("assistant", ""))}, "messages")
    assert is_empty({"messages": []}, "messages")
    assert not is_empty({"prompt": "p", "completion": "c", "label": False}, "unpaired_preference")
    a = canonical_key({"prompt": "p", "completion": "c", "x": 1}, "prompt_completion")
    b = canonical_key({"completion": "c", "prompt": "p", "x": 2}, "prompt_completion")
    assert a == b
    assert a != canonical_key({"prompt": "p", "completion": "d"}, "prompt_completion")
