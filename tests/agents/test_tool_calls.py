"""Reading the model's tool calls: Hermes/Qwen tags, Llama 3 JSON, structured calls, and each malformed case."""

from __future__ import annotations

import json

import pytest

from trainer_lib.agents import MalformedCall, ToolCall, parse_tool_calls, tool_message

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
]


def hermes(payload) -> str:
    return f"<tool_call>\n{payload if isinstance(payload, str) else json.dumps(payload)}\n</tool_call>"


def test_several_hermes_calls_in_one_message_in_order():
    text = (
        "Let me compute and look it up.\n"
        + hermes({"name": "calculator", "arguments": {"expression": "6*7"}})
        + "\n"
        + hermes({"name": "search", "arguments": {"query": "meaning of life", "k": 2}})
    )
    parsed = parse_tool_calls({"role": "assistant", "content": text}, TOOLS)
    assert parsed.items == [
        ToolCall("calculator", {"expression": "6*7"}),
        ToolCall("search", {"query": "meaning of life", "k": 2}),
    ]
    assert parsed.has_calls and not parsed.malformed


def test_a_plain_answer_has_no_calls():
    for text in ("The answer is 42.", "{x | x > 0} is the set", "", "[1, 2, 3]"):
        assert not parse_tool_calls({"role": "assistant", "content": text}, TOOLS).has_calls, text
    assert not parse_tool_calls({"role": "assistant", "content": None}, TOOLS).has_calls


@pytest.mark.parametrize(
    "payload, error",
    [
        ('{"name": "calculator", "arguments": {"expression": "1+1"}', "not valid JSON"),
        ({"arguments": {"expression": "1"}}, "has no 'name'"),
        ({"name": "weather", "arguments": {}}, "unknown tool 'weather' (the tools are: calculator, search)"),
        ({"name": "calculator", "arguments": ["1+1"]}, "the arguments of 'calculator' must be a JSON object"),
        ({"name": "calculator", "arguments": {}}, "calculator: missing required argument expression"),
        ({"name": "calculator", "arguments": {"expression": "1", "x": 2}}, "calculator: unknown argument x"),
        ('"calculator"', "must be a JSON object with a name"),
    ],
)
def test_each_malformed_hermes_call_says_what_is_wrong(payload, error):
    text = "ok " + hermes(payload) + hermes({"name": "calculator", "arguments": {"expression": "2"}})
    parsed = parse_tool_calls(text, TOOLS)
    assert len(parsed.items) == 2
    bad, good = parsed.items
    assert isinstance(bad, MalformedCall) and error in bad.error
    assert good == ToolCall("calculator", {"expression": "2"})  # one bad call does not spoil the others


def test_the_name_of_a_malformed_call_is_kept_when_it_has_one():
    bad = parse_tool_calls(hermes({"name": "calculator", "arguments": {}}), TOOLS).malformed[0]
    assert bad.name == "calculator"
    assert parse_tool_calls(hermes("{oops"), TOOLS).malformed[0].name is None


def test_hermes_leniencies_a_cut_closing_tag_a_string_of_arguments_and_thinking():
    cut = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3"}}'  # stopped at </tool_call>
    assert parse_tool_calls(cut, TOOLS).items == [ToolCall("calculator", {"expression": "3"})]
    unfinished = parse_tool_calls('<tool_call>\n{"name": "calcul', TOOLS).malformed[0]
    assert "no closing </tool_call>" in unfinished.error
    as_string = hermes({"name": "calculator", "arguments": json.dumps({"expression": "4"})})
    assert parse_tool_calls(as_string, TOOLS).calls == [ToolCall("calculator", {"expression": "4"})]
    considered = hermes({"name": "search", "arguments": {"query": "x"}})
    thinking = f"<think>maybe {considered}? no</think>The answer is 5."
    assert not parse_tool_calls(thinking, TOOLS).has_calls


def test_llama3_json_calls():
    plain = '{"name": "search", "parameters": {"query": "llamas"}}'
    assert parse_tool_calls(plain, TOOLS).items == [ToolCall("search", {"query": "llamas"})]
    tagged = '<|python_tag|>{"name": "calculator", "parameters": {"expression": "2**8"}}<|eom_id|>'
    assert parse_tool_calls(tagged, TOOLS).items == [ToolCall("calculator", {"expression": "2**8"})]
    several = json.dumps(
        [
            {"name": "calculator", "parameters": {"expression": "1"}},
            {"name": "search", "parameters": {"query": "two"}},
        ]
    )
    assert parse_tool_calls(several, TOOLS).items == [
        ToolCall("calculator", {"expression": "1"}),
        ToolCall("search", {"query": "two"}),
    ]


@pytest.mark.parametrize(
    "text, error",
    [
        ('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1"}', "not valid JSON"),
        ("<|python_tag|>print(1)", "not valid JSON"),
        ('{"name": "", "parameters": {}}', "has no 'name'"),
        ('{"name": "shell", "parameters": {"cmd": "ls"}}', "unknown tool 'shell'"),
        ('{"name": "search", "parameters": "llamas"}', "the arguments of 'search' must be a JSON object"),
        ('{"name": "search", "parameters": {"k": 3}}', "search: missing required argument query"),
    ],
)
def test_each_malformed_llama3_call_says_what_is_wrong(text, error):
    parsed = parse_tool_calls(text, TOOLS)
    assert not parsed.calls
    assert len(parsed.malformed) == 1 and error in parsed.malformed[0].error


def test_structured_calls_of_an_openai_style_message():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"query": "q"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "nope", "arguments": "{}"}},
        ],
    }
    parsed = parse_tool_calls(message, TOOLS)
    assert parsed.calls == [ToolCall("search", {"query": "q"}, id="call_1")]
    assert "unknown tool 'nope'" in parsed.malformed[0].error


def test_a_tool_result_is_the_message_the_templates_expect():
    assert tool_message("calculator", "42") == {"role": "tool", "name": "calculator", "content": "42"}
    assert tool_message("search", "x", call_id="call_1") == {
        "role": "tool",
        "name": "search",
        "content": "x",
        "tool_call_id": "call_1",
    }
