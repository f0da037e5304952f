"""The model's tool calls, read from the text its chat template taught it to write, and checked.

Two formats, the ones the open chat templates use:

- Hermes / Qwen: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>``, any number per message,
  with text around them (Qwen2.5, Qwen3, Hermes 2/3; Qwen3's ``<think>...</think>`` is skipped).
- Llama 3.1+: the whole message is ``{"name": "f", "parameters": {...}}``, optionally after
  ``<|python_tag|>`` (or a JSON list of such objects).

A message may also carry structured calls in ``tool_calls`` (an OpenAI-style server parsed them already);
they are read the same way. Every call is checked against the tools' schemas: a call with bad JSON, no
name, an unknown tool, arguments that are not an object, or arguments missing a required key (or naming
one the schema does not have) is a :class:`MalformedCall` with an error the model can read. Parsing never
raises: the model's text is untrusted and a bad call is feedback for it, not a crash of ours.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence

HERMES_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
THINKING = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|im_end|>")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A call that names a known tool with arguments its schema accepts (``id`` when the message gave one)."""

    name: str
    arguments: dict
    id: str | None = None


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """A call the model tried to make but that cannot run: ``text`` is what it wrote, ``error`` says why,
    ``name`` is the tool it named, when it named one."""

    text: str
    error: str
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class ParsedMessage:
    """An assistant message's calls, well-formed and not, in the order they were written."""

    items: list[ToolCall | MalformedCall]

    @property
    def calls(self) -> list[ToolCall]:
        return [item for item in self.items if isinstance(item, ToolCall)]

    @property
    def malformed(self) -> list[MalformedCall]:
        return [item for item in self.items if isinstance(item, MalformedCall)]

    @property
    def has_calls(self) -> bool:
        """Whether the model tried to call a tool at all (a message without is its final answer)."""
        return bool(self.items)


def parse_tool_calls(message: dict | str, tools: Sequence[dict]) -> ParsedMessage:
    """The tool calls of an assistant ``message`` (a chat message or its text), checked against ``tools``
    (schemas in the "function" format, as the template was given them)."""
    schemas = {schema_name(s): s for s in tools}
    text = message if isinstance(message, str) else (message.get("content") or "")
    structured = [] if isinstance(message, str) else (message.get("tool_calls") or [])
    raw = [_from_structured(call) for call in structured] + _raw_calls(THINKING.sub("", text))
    return ParsedMessage(items=[_check(call, schemas) for call in raw])


def schema_name(schema: dict) -> str:
    """The tool name of a schema in the "function" format (or its inner part)."""
    return schema.get("function", schema).get("name", "")


def _raw_calls(text: str) -> list[tuple[str, object, str]]:
    """``(written text, decoded JSON or a decoding error, arguments key)`` for each call in ``text``."""
    if "<tool_call>" in text:
        found = []
        for match in HERMES_CALL.finditer(text):
            body = match.group(1).strip()
            decoded = _decode(body)
            # An engine that stops at "</tool_call>" may cut it off: an unclosed call is fine if its JSON is.
            if isinstance(decoded, ValueError) and not match.group(2):
                decoded = ValueError(f"{decoded} and no closing </tool_call>")
            found.append((body, decoded, "arguments"))
        return found
    body = text.strip()
    for token in END_TOKENS:
        body = body.removesuffix(token).rstrip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    # Untagged, only a message that is a JSON object naming a function is a call: "{x | x > 0}" is an answer.
    if not tagged and not (body.startswith(("{", "[")) and '"name"' in body):
        return []
    decoded = _decode(body)
    if isinstance(decoded, list) and decoded:
        return [(json.dumps(item), item, "parameters") for item in decoded]
    return [(body, decoded, "parameters")]


def _from_structured(call: object) -> tuple[str, object, str]:
    """An OpenAI-style ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    function = call.get("function", call) if isinstance(call, dict) else call
    text = json.dumps(call, default=str)[:1000]
    if not isinstance(function, dict):
        return text, ValueError("a tool call must be a JSON object"), "arguments"
    decoded = {"name": function.get("name"), "arguments": function.get("arguments")}
    if isinstance(call, dict) and call.get("id") is not None:
        decoded["id"] = str(call["id"])
    return text, decoded, "arguments"


def _decode(body: str) -> object:
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        return ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})")


def _check(raw: tuple[str, object, str], schemas: dict[str, dict]) -> ToolCall | MalformedCall:
    text, decoded, arguments_key = raw
    if isinstance(decoded, ValueError):
        return MalformedCall(text, str(decoded))
    if not isinstance(decoded, dict):
        return MalformedCall(text, "a tool call must be a JSON object with a name")
    name = decoded.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(text, "the tool call has no 'name'")
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        return MalformedCall(text, f"unknown tool '{name}' (the tools are: {known})", name)
    # Llama writes "parameters", Hermes "arguments"; either is accepted in both formats.
    arguments = decoded.get(arguments_key, decoded.get("arguments", decoded.get("parameters", {})))
    if isinstance(arguments, str):  # the OpenAI wire format: the arguments as a JSON string
        arguments = _decode(arguments) if arguments.strip() else {}
    if arguments is None:  # a function without arguments, written as null
        arguments = {}
    if not isinstance(arguments, dict):
        return MalformedCall(text, f"the arguments of '{name}' must be a JSON object", name)
    problem = argument_problem(arguments, schemas[name])
    if problem:
        return MalformedCall(text, f"{name}: {problem}", name)
    call_id = decoded.get("id")
    return ToolCall(name=name, arguments=arguments, id=None if call_id is None else str(call_id))


def argument_problem(arguments: dict, schema: dict) -> str | None:
    """What is wrong with ``arguments`` for a tool's ``schema`` (a required key missing, a key it does not
    have), or None. Types are left to the tool: a wrong one is a readable error when it runs."""
    parameters = schema.get("function", schema).get("parameters") or {}
    properties = parameters.get("properties") or {}
    missing = [key for key in parameters.get("required", []) if key not in arguments]
    if missing:
        return f"missing required argument{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    if parameters.get("additionalProperties") is not True:
        unknown = [key for key in arguments if key not in properties]
        if unknown:
            return f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
    return None


def tool_message(name: str, content: str, call_id: str | None = None) -> dict:
    """A tool's result as the chat message the templates expect after a call: ``{"role": "tool",
    "name": ..., "content": ...}`` (with ``tool_call_id`` when the call had an id)."""
    message = {"role": "tool", "name": name, "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message
