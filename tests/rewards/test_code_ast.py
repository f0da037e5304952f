"""The ``code_ast`` reward: each check's share by hand, the entry point from the row, hostile inputs."""

import time

import pytest

from trainer_lib.rewards.functions import code_ast, resolve
from trainer_lib.rewards.syntax_tree import Signature, expected_calls

TESTS = ["assert add_one(1) == 2", "assert add_one(x=0) == 1"]


def one(code, tests=TESTS, entry_point=None, **limits):
    return code_ast(["q"], [code], tests=[tests], entry_point=[entry_point], **limits)[0]


def test_each_check_is_a_quarter():
    assert one("def add_one(x):\n    return x + 1") == 1.0
    assert one("def add_one(x, y):\n    return x + y") == 0.75  # parses, defined, clean; arity wrong
    assert one("def other(x):\n    return x") == 0.5  # parses, clean
    assert one("import os\ndef add_one(x):\n    return x + 1") == 0.75  # defined and fits, not clean
    assert one("def add_one(x):\n    return eval('x + 1')") == 0.75
    assert one("def add_one(x:\n    return x") == 0.0  # no syntax, nothing else
    assert one("") == 0.5  # parses (empty module), clean; defines nothing


def test_forbidden_names_and_imports():
    for code in (
        "import subprocess",
        "import os.path",
        "from sys import argv",
        "from socket import socket",
        "x = open('f')",
        "f = exec",
        "__import__('os')",
    ):
        assert one(code, tests=[]) == 0.5, code  # parses, not clean (no entry point: halves)
    for code in ("import json", "from .os import x", "def f(open_file):\n    return open_file", "x.open()"):
        assert one(code, tests=[]) == 1.0, code


def test_code_comes_from_the_fence_and_chat_messages():
    text = "Here you go:\n```python\ndef add_one(x):\n    return x + 1\n```\nIt adds one."
    chat = [{"role": "assistant", "content": text}]
    assert code_ast([[{"role": "user", "content": "q"}]], [chat], tests=[TESTS]) == [1.0]


def test_entry_point_column_or_first_called_name():
    calls = ((2, frozenset()), (0, frozenset({"a"})))
    assert expected_calls(("assert len(f(1, 2)) == 3", "assert f(a=1) == 0"), None) == ("f", calls)
    assert expected_calls(("assert f(1) == g(2)",), "g") == ("g", ((1, frozenset()),))
    assert expected_calls(("not python (",), None) == (None, ())
    # entry_point given, no tests: defined counts, every (zero) call fits
    assert one("def solve(a, b):\n    return a", tests=None, entry_point="solve") == 1.0
    assert one("class solve:\n    pass", tests=["assert solve(1, 2)"], entry_point="solve") == 1.0
    # no tests and no entry point: parses and clean, a half each
    assert code_ast(["q", "q"], ["x = 1", "x = ("]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "signature, call, fits",
    [
        ("def f(x): pass", (1, frozenset()), True),
        ("def f(x): pass", (0, frozenset({"x"})), True),
        ("def f(x): pass", (2, frozenset()), False),
        ("def f(x, y=1): pass", (1, frozenset()), True),
        ("def f(x, *args): pass", (5, frozenset()), True),
        ("def f(x, *, key): pass", (1, frozenset()), False),
        ("def f(x, *, key): pass", (1, frozenset({"key"})), True),
        ("def f(x, **kw): pass", (1, frozenset({"other"})), True),
        ("def f(x): pass", (1, frozenset({"other"})), False),
    ],
)
def test_arity(signature, call, fits):
    import ast

    assert Signature.of(ast.parse(signature).body[0]).accepts(call) is fits


def test_limits_on_size_and_nesting():
    code = "def add_one(x):\n    return x + 1"
    assert one(code, max_nodes=5) == 0.75  # every check but clean
    assert one(code, max_depth=2) == 0.75
    assert one(code, max_chars=10) == 0.0


HOSTILE = {
    "nested parentheses": "(" * 5_000 + "1" + ")" * 5_000,
    "nested lists": "x = " + "[" * 3_000 + "]" * 3_000,
    "deep unary": "x = " + "-" * 15_000 + "1",
    "long sum": "x = " + "+".join(["1"] * 6_000),
    "deep attribute chain": "x = a" + ".b" * 9_000,
    "deep blocks": "".join(" " * i + "if x:\n" for i in range(100)) + " " * 100 + "pass\n",
    "huge integer": "x = " + "9" * 19_000,
    "huge string": "x = '" + "a" * 19_000 + "'",
    "very long completion": "def add_one(x):\n    return x + 1\n" + "#" * 10_000_000,
    "null bytes": "def add_one(x):\x00\n    return x",
    "lone surrogate": "x = '\ud800'",
    "bad fence": "```python\n" * 50_000,
}


@pytest.mark.serial  # timed against a wall-clock bound: run alone
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completions_neither_crash_nor_hang(name):
    start = time.perf_counter()
    value = one(HOSTILE[name])
    assert 0.0 <= value <= 1.0
    assert time.perf_counter() - start < 5.0  # generous: a hang, not a speed test (see benchmarks/)


def test_registered_as_a_builtin():
    name, fn = resolve("code_ast")
    assert name == "code_ast" and fn(["q"], ["def add_one(x):\n    return x"], tests=[TESTS]) == [1.0]
