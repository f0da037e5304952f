"""Tools a model may call: a name, the JSON schema its chat template shows, and the function that runs.

A schema is in the OpenAI / Hugging Face "function" format (``{"type": "function", "function": {"name",
"description", "parameters"}}``), the form ``apply_chat_template(tools=...)`` renders. It comes from a typed
Python function with a Google-style docstring through ``transformers.utils.get_json_schema`` (the same
builder the chat templates are tested with, so the model sees what Hugging Face would show it), or is given
as a dict.

The built-in tools: ``calculator`` (arithmetic through ``ast``, never ``eval``), ``python`` (model-written
code run in :mod:`trainer_lib.sandbox`) and ``search`` (BM25 over a local corpus, with ``bm25s``). A tool
returns text; what it raises, how long it runs and how much it returns are the environment's to bound
(:mod:`trainer_lib.agents.tool_env`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainer_lib.errors import ConfigError, DataError

if TYPE_CHECKING:
    from trainer_lib.sandbox import Sandbox


@dataclasses.dataclass(frozen=True)
class Tool:
    """A callable the model may use: ``schema`` is what the model sees, ``fn(**arguments)`` what runs."""

    name: str
    schema: dict
    fn: Callable[..., Any]

    @property
    def parameters(self) -> dict:
        """The JSON schema of the arguments (an object schema)."""
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}

    def __call__(self, **arguments) -> str:
        """Run the tool and give its result as text: a string as it is, anything else as JSON."""
        value = self.fn(**arguments)
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value, default=str)


def tool_from_function(fn: Callable[..., Any], name: str | None = None) -> Tool:
    """A tool from a Python function with type hints and a Google-style docstring (``Args:`` for each
    argument), its schema built by ``transformers.utils.get_json_schema``; ``name`` overrides the function's."""
    from transformers.utils import chat_template_utils, get_json_schema

    try:
        schema = get_json_schema(fn)
    except (chat_template_utils.DocstringParsingException, chat_template_utils.TypeHintParsingException) as exc:
        raise ConfigError(f"tool {getattr(fn, '__name__', fn)!r}: {exc}") from None
    if name:
        schema["function"]["name"] = name
    return Tool(name=schema["function"]["name"], schema=schema, fn=fn)


def tool_from_schema(schema: dict, fn: Callable[..., Any]) -> Tool:
    """A tool from a JSON schema given as it is: the "function" format, or its inner ``{"name",
    "description", "parameters"}`` (wrapped); a ConfigError when it has no name or its parameters are no
    object schema."""
    inner = schema.get("function", schema) if schema.get("type") == "function" else schema
    name = inner.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"tool schema: expected a 'name', got {json.dumps(schema)[:200]}")
    parameters = inner.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ConfigError(f"tool schema '{name}': 'parameters' must be a JSON schema of type object")
    full = schema if inner is not schema else {"type": "function", "function": schema}
    return Tool(name=name, schema=full, fn=fn)


# --------------------------------------------------------------------------- calculator

#: Bounds on what an expression may cost: its length, an exponent, and the size of any integer on the way.
MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_INT_BITS = 4096
BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class Refused(ValueError):
    """An expression the calculator will not evaluate (a name, a call, a huge power)."""


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression: ``+ - * / // % **`` and parentheses over int and float
    literals. Everything else (names, calls, attributes, strings) and anything too costly (an exponent
    beyond ``MAX_EXPONENT``, an integer beyond ``MAX_INT_BITS`` bits) raises :class:`Refused`."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise Refused(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise Refused(f"not an arithmetic expression ({exc.msg})") from None
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _bounded(BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise Refused("division by zero") from None
        except OverflowError:
            raise Refused("the result is too large") from None
    if isinstance(node, ast.Name):
        raise Refused(f"names are not allowed ({node.id})")
    if isinstance(node, ast.Call):
        raise Refused("function calls are not allowed")
    raise Refused(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise Refused(f"exponent {exponent} is beyond {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        if abs(base).bit_length() * exponent > MAX_INT_BITS:  # refused before it is computed
            raise Refused(f"the result would exceed {MAX_INT_BITS} bits")


def _bounded(value: Any) -> int | float:
    if isinstance(value, complex):
        raise Refused("the result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise Refused(f"the result would exceed {MAX_INT_BITS} bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise Refused("the result is not finite")
    return value


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: The expression, for example "(3 + 4) * 12 / 7".
    """
    try:
        return str(evaluate_arithmetic(expression))
    except Refused as exc:
        return f"error: {exc}"


def calculator_tool() -> Tool:
    """The ``calculator`` tool: safe arithmetic, refusals as ``error: ...`` text the model can read."""
    return tool_from_function(calculator)


# --------------------------------------------------------------------------- python


def python_tool(sandbox: Sandbox, timeout: float = 5.0) -> Tool:
    """The ``python`` tool: the model's code runs as a program in ``sandbox`` (its own process, killed at
    ``timeout`` seconds), and the model reads its output (stdout and stderr, as much as the sandbox keeps:
    ``SandboxConfig.keep_output_bytes``), followed by the status when it did not finish cleanly."""
    from trainer_lib.sandbox import Program

    def python(code: str) -> str:
        """Run Python code in a fresh, isolated interpreter and return what it prints.

        Args:
            code: A complete Python program; use print() to show results.
        """
        result = sandbox.run(Program(code), timeout=timeout)
        if result.status == "passed":
            return result.output or "(no output)"
        note = f"[{result.status}: {result.detail}]" if result.detail else f"[{result.status}]"
        return f"{result.output}\n{note}" if result.output else note

    return tool_from_function(python)


# --------------------------------------------------------------------------- search


def read_corpus(path: str) -> list[str]:
    """The documents of a local corpus: a ``.jsonl`` file's ``text`` fields, else one document per line
    (blank lines skipped)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"search corpus: cannot read {path} ({type(exc).__name__})") from None
    if not path.endswith(".jsonl"):
        return [line.strip() for line in lines if line.strip()]
    documents = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line).get("text")
        except (json.JSONDecodeError, AttributeError):
            raise DataError(f"{path}:{number}", None, "a JSON object") from None
        if not isinstance(text, str):
            raise DataError(f"{path}:{number}", "text", "a string", text)
        documents.append(text)
    return documents


class Bm25Index:
    """BM25 (Robertson and Zaragoza, 2009) over a list of documents, with ``bm25s``'s sparse index;
    English stopwords are dropped, nothing is stemmed."""

    def __init__(self, documents: Sequence[str]):
        import bm25s

        if not documents:
            raise ConfigError("search corpus: no documents")
        self.documents = list(documents)
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(self.documents, return_ids=False, show_progress=False), show_progress=False)

    def search(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """``(document index, score)`` of the best ``k`` documents sharing a term with ``query``, best first."""
        import bm25s
        import numpy as np

        tokens = bm25s.tokenize([query], return_ids=False, show_progress=False)[0]
        if not tokens:
            return []
        scores = self.retriever.get_scores(tokens)
        best = np.argsort(-scores, kind="stable")[:k]
        return [(int(i), float(scores[i])) for i in best if scores[i] > 0]


def search_tool(corpus: str | Sequence[str], top_k: int = 3, max_document_chars: int = 1000) -> Tool:
    """The ``search`` tool over ``corpus`` (a path for :func:`read_corpus`, or the documents): the ``top_k``
    best documents by BM25, numbered, each cut to ``max_document_chars``. The index is built once, here."""
    index = Bm25Index(read_corpus(corpus) if isinstance(corpus, str) else corpus)

    def search(query: str) -> str:
        """Search the document collection and return the most relevant documents.

        Args:
            query: Keywords to search for.
        """
        hits = index.search(query, top_k)
        if not hits:
            return "no document matches the query"
        return "\n\n".join(f"[{n}] {index.documents[i][:max_document_chars]}" for n, (i, _) in enumerate(hits, 1))

    return tool_from_function(search)
