"""Tools: schemas from functions and dicts, the calculator, BM25 search and the sandboxed python tool."""

from __future__ import annotations

import json

import pytest

from trainer_lib.agents import (
    Refused,
    calculator,
    calculator_tool,
    evaluate_arithmetic,
    python_tool,
    read_corpus,
    search_tool,
    tool_from_function,
    tool_from_schema,
)
from trainer_lib.errors import ConfigError, DataError
from trainer_lib.sandbox import Sandbox, SandboxConfig


def get_weather(city: str, days: int = 1) -> str:
    """Get the weather forecast for a city.

    Args:
        city: The city's name, for example "Paris".
        days: How many days ahead to forecast.
    """
    return f"{city}: sunny for {days} day(s)"


def test_a_typed_documented_function_gives_its_schema():
    tool = tool_from_function(get_weather)
    assert tool.name == "get_weather"
    assert tool.schema["type"] == "function"
    function = tool.schema["function"]
    assert function["name"] == "get_weather"
    assert function["description"] == "Get the weather forecast for a city."
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": 'The city\'s name, for example "Paris".'},
            "days": {"type": "integer", "description": "How many days ahead to forecast."},
        },
        "required": ["city"],
    }
    assert tool(city="Oslo", days=2) == "Oslo: sunny for 2 day(s)"
    assert tool_from_function(get_weather, name="forecast").schema["function"]["name"] == "forecast"


def test_a_function_without_documented_arguments_is_a_config_error():
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match="undocumented"):
        tool_from_function(undocumented)


def test_a_json_schema_is_taken_as_given():
    schema = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    }
    tool = tool_from_schema(schema, lambda word: {"word": word, "length": len(word)})
    assert tool.name == "lookup" and tool.schema is schema
    assert json.loads(tool(word="abc")) == {"word": "abc", "length": 3}  # a non-string result becomes JSON
    inner = tool_from_schema(schema["function"], lambda word: word)
    assert inner.schema == schema
    with pytest.raises(ConfigError, match="'name'"):
        tool_from_schema({"description": "no name"}, print)
    with pytest.raises(ConfigError, match="type object"):
        tool_from_schema({"name": "f", "parameters": {"type": "array"}}, print)


@pytest.mark.parametrize(
    "expression, value",
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("1.5 * 4", "6.0"),
        ("-(3 - 5)", "2"),
        ("2 ** -1", "0.5"),
        ("0.1 + 0.2", "0.30000000000000004"),
    ],
)
def test_the_calculator_computes(expression, value):
    assert calculator(expression) == value
    assert calculator_tool()(expression=expression) == value


@pytest.mark.parametrize(
    "expression, says",
    [
        ("x + 1", "names are not allowed (x)"),
        ("abs(-3)", "function calls are not allowed"),
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("'a' * 3", "Constant is not allowed"),
        ("True + 1", "Constant is not allowed"),
        ("2**10**10", "exponent 10000000000 is beyond 1000"),
        ("(2**1000)**5", "would exceed 4096 bits"),
        ("1 / 0", "division by zero"),
        ("1e308 * 10", "not finite"),
        ("(-8) ** 0.5", "not a real number"),
        ("2 +", "not an arithmetic expression"),
        ("1 + " * 200 + "1", "longer than 500 characters"),
    ],
)
def test_the_calculator_refuses_with_an_error_string(expression, says):
    answer = calculator(expression)
    assert answer.startswith("error: ") and says in answer
    with pytest.raises(Refused):
        evaluate_arithmetic(expression)


def test_the_calculator_schema_tells_the_model_what_to_pass():
    parameters = calculator_tool().parameters
    assert parameters["required"] == ["expression"]
    assert parameters["properties"]["expression"]["type"] == "string"


CORPUS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "The Great Wall of China stretches thousands of kilometres.",
    "Paris is the capital and most populous city of France.",
]


def test_search_finds_the_relevant_document_first(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS[:2]) + "\n\n" + "\n".join(CORPUS[2:]) + "\n")
    assert read_corpus(str(path)) == CORPUS  # the blank line is no document
    search = search_tool(str(path), top_k=2)
    answer = search(query="how do plants make chemical energy from light")
    assert answer.startswith("[1] Photosynthesis converts light energy")
    assert search(query="great wall china").startswith("[1] The Great Wall")
    assert search(query="zyzzyva quux") == "no document matches the query"


def test_search_reads_a_jsonl_corpus_and_names_a_bad_line(tmp_path):
    good = tmp_path / "corpus.jsonl"
    good.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(CORPUS)))
    assert search_tool(str(good), top_k=1)(query="Eiffel tower").startswith("[1] The Eiffel Tower")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'text': expected a string"):
        read_corpus(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        read_corpus(str(tmp_path / "missing.txt"))


@pytest.fixture(scope="module")
def box():
    # As tests/sandbox: a small memory limit and timeout, the same under root (own uid) and without.
    with Sandbox(SandboxConfig(timeout=1.0, memory_mb=256), max_workers=1) as sandbox:
        yield sandbox


def test_the_python_tool_runs_code_in_the_sandbox(box):
    python = python_tool(box, timeout=1.0)
    assert python.name == "python"
    assert python(code="print(2+3)").strip() == "5"
    assert python(code="x = 1") == "(no output)"


def test_the_python_tool_reports_errors_and_timeouts(box):
    python = python_tool(box, timeout=1.0)
    raised = python(code="print('before')\n1/0")
    assert raised.startswith("before\n") and "[error:" in raised and "ZeroDivisionError" in raised
    assert python(code="while True:\n    pass") == "[timeout: exceeded the 1 s wall-clock limit]"


def test_the_python_tool_returns_a_cut_start_of_huge_output(box):
    printed = python_tool(box, timeout=1.0)(code="print('x' * 10**6)")
    assert printed.startswith("xxxx") and printed.endswith("[cut]")
    assert len(printed) <= SandboxConfig().keep_output_bytes + 10
