"""Dataset formats (the ones TRL users already have), detection and row normalization.

Pure Python, no heavy imports: this module is used for validation before anything is loaded.

Formats and the columns of a normalized row (extra columns are kept after them, as they were):

=======================  =================================  ===========================================
format                   columns                            values
=======================  =================================  ===========================================
``text``                 text                               str
``prompt_completion``    prompt, completion                 both str, or both conversations
``messages``             messages                           conversation
``preference``           prompt, chosen, rejected           all str, or all conversations
``unpaired_preference``  prompt, completion, label          str/conversations + bool label
``prompt_only``          prompt                             str or conversation
=======================  =================================  ===========================================

LLaMA-Factory's ``alpaca`` and ``sharegpt`` (see :mod:`trainer_lib.data.llamafactory`) and three public
datasets' own shapes, ``hh_rlhf``, ``gsm8k`` and ``mbpp`` (see :mod:`trainer_lib.data.public_datasets`), are
detected here too (:data:`SOURCE_FORMATS`); their rows are converted to a normalized format first.

A conversation is a list of ``{"role": ..., "content": str}`` with roles in :data:`ROLES`;
normalized messages keep exactly those two keys, and an assistant's ``tool_calls`` (:func:`tool_calls`;
a row's ``tools`` column, a JSON string, lists the tools offered, which the chat template renders). A
content may also be a list of parts, as in the OpenAI format and LLaMA-Factory's newer demos
(``[{"type": "text", "text": ...}]``): the text parts are joined into one string; any other part (an
image, audio) is refused, as posttrain trains text-only models (:func:`content_text`).
Preference rows without a ``prompt`` (implicit prompt) get one extracted from the common
prefix of ``chosen`` and ``rejected`` (see :func:`extract_prompt`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from trainer_lib.data.public_datasets import is_hh_dialogue
from trainer_lib.errors import DataError

#: format name -> columns of a normalized row, in order.
FORMATS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion"),
    "messages": ("messages",),
    "preference": ("prompt", "chosen", "rejected"),
    "unpaired_preference": ("prompt", "completion", "label"),
    "prompt_only": ("prompt",),
}

#: formats that are converted to a normalized format before normalization -> that format.
SOURCE_FORMATS: dict[str, str] = {
    "alpaca": "messages",
    "sharegpt": "messages",
    "hh_rlhf": "preference",
    "gsm8k": "prompt_completion",
    "mbpp": "prompt_completion",
}

#: columns that must be present in a raw row for each format (preference: prompt is optional).
REQUIRED: dict[str, tuple[str, ...]] = {
    **FORMATS,
    "preference": ("chosen", "rejected"),
    "alpaca": ("instruction", "output"),
    "sharegpt": ("conversations",),
    "hh_rlhf": ("chosen", "rejected"),
    "gsm8k": ("question", "answer"),
    "mbpp": ("text", "code", "test_list"),
}

#: columns that identify a format; a row that has one of them but misses another required
#: column is reported as a missing field rather than as another format.
_DISTINCTIVE: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "prompt_completion": ("completion",),
    "messages": ("messages",),
    "preference": ("chosen", "rejected"),
    "unpaired_preference": ("label",),
    "prompt_only": ("prompt",),
    "alpaca": ("instruction", "output"),
    "sharegpt": ("conversations",),
    "hh_rlhf": ("chosen", "rejected"),
    "gsm8k": ("question", "answer"),
    "mbpp": ("code", "test_list"),
}

#: formats told apart from another by their values, not their columns -> that other format. A row
#: of either in a file of the other is read as the file's format.
_BY_VALUES: dict[str, str] = {"hh_rlhf": "preference"}

ROLES = ("system", "user", "assistant", "tool")

#: the value of ``data.format`` that means "detect from the columns".
AUTO = "auto"

_DETECT_HELP = (
    "the columns of a known format: text | prompt+completion | messages | "
    "prompt+chosen+rejected (or chosen+rejected) | prompt+completion+label | prompt | "
    "instruction+output (alpaca) | conversations (sharegpt) | question+answer (gsm8k) | "
    "text+code+test_list (mbpp)"
)


# --------------------------------------------------------------------------- detection


def detect_format(columns: Iterable[str] | Mapping[str, Any], location: str = "data") -> str:
    """Format name for a row's columns (a dict's keys or a list of names).

    Priority: preference > unpaired_preference > messages > sharegpt > prompt_completion > alpaca >
    mbpp > text > gsm8k > prompt_only (sharegpt ``conversations`` with ``chosen``/``rejected``: sharegpt,
    LLaMA-Factory's ranked pairs; a row's ``chosen`` that is an HH-RLHF dialogue, without a ``prompt``:
    hh_rlhf); other columns are extras. Raises :class:`DataError` when no format matches.
    """
    cols = set(columns.keys() if isinstance(columns, Mapping) else columns)
    if {"chosen", "rejected"} <= cols:
        if "conversations" in cols:
            return "sharegpt"  # LLaMA-Factory's ranked pairs
        if isinstance(columns, Mapping) and "prompt" not in cols and is_hh_dialogue(columns["chosen"]):
            return "hh_rlhf"
        return "preference"
    if "chosen" in cols or "rejected" in cols:  # half a pair is not prompt-only (or other) data
        missing = "rejected" if "chosen" in cols else "chosen"
        raise DataError(
            location,
            missing,
            "a value: a preference row needs both 'chosen' and "
            f"'rejected' (this row has columns {', '.join(sorted(cols))})",
        )
    if {"prompt", "completion", "label"} <= cols:
        return "unpaired_preference"
    if "messages" in cols:
        return "messages"
    if "conversations" in cols:
        return "sharegpt"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    if {"text", "code", "test_list"} <= cols:
        return "mbpp"
    if "text" in cols:
        return "text"
    if {"question", "answer"} <= cols and "prompt" not in cols:
        return "gsm8k"
    if "prompt" in cols:
        return "prompt_only"
    raise DataError(location, None, _DETECT_HELP, sorted(cols))


def row_format(row: Mapping[str, Any], fmt: str, location: str, first_location: str) -> str:
    """Check that ``row`` (from an auto-detected file of format ``fmt``) is of that format.

    A row that lacks a required column but has a column that identifies ``fmt`` is treated
    as ``fmt`` (normalization then names the missing field); a row of another format is an
    error naming both rows (one format per file).
    """
    try:
        got = detect_format(row, location)
    except DataError:  # e.g. an alpaca row without 'output': a missing field, named later
        if set(row) & set(_DISTINCTIVE[fmt]):
            return fmt
        raise
    if got == fmt or fmt == _BY_VALUES.get(got) or got == _BY_VALUES.get(fmt):
        return fmt
    keys = set(row)
    if not set(REQUIRED[fmt]) <= keys and keys & set(_DISTINCTIVE[fmt]):
        return fmt
    raise DataError(
        location,
        None,
        f"a '{fmt}' row like {first_location} (one format per file), got a '{got}' "
        f"row with columns {', '.join(sorted(keys))}",
    )


# --------------------------------------------------------------------------- conversations


def is_message(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("role") in ROLES and isinstance(value.get("content"), str)


def is_conversational(value: Any) -> bool:
    """True for a non-empty list of ``{"role", "content"}`` dicts with known roles."""
    return isinstance(value, list) and bool(value) and all(is_message(m) for m in value)


def content_text(content: Any, field: str, location: str) -> str:
    """A message's content as one string: a string as it is, a list of text parts joined (without a
    separator, as chat templates render consecutive text parts). Anything else is a DataError naming
    ``field`` (``messages[1].content``, or the part: ``messages[1].content[2].type``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DataError(location, field, "string or list of text parts", content)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            expected = "a text part (posttrain trains text-only models)" if kind else 'a part {"type": "text", ...}'
            raise DataError(location, f"{field}[{j}].type", expected, kind if kind else part)
        if not isinstance(part.get("text"), str):
            raise DataError(location, f"{field}[{j}].text", "string", part.get("text"))
        texts.append(part["text"])
    return "".join(texts)


def tool_calls(value: Any, field: str, location: str) -> list[dict]:
    """An assistant's tool calls as ``[{"type": "function", "function": {"name", "arguments"}}]``, the
    arguments kept as a JSON string (one Arrow type whatever the tool). Each call may be OpenAI's
    ``{"type": "function", "function": {...}}`` or LLaMA-Factory's ``{"name": ..., "arguments": ...}``."""
    calls = value if isinstance(value, list) else [value]
    out = []
    for j, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise DataError(location, f"{field}[{j}]", 'a tool call {"name": ..., "arguments": {...}}', call)
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _check_conversation(value: Any, field: str, location: str) -> list[dict]:
    if not isinstance(value, list):
        raise DataError(location, field, "list of messages", value)
    out = []
    for i, msg in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(msg, Mapping):
            raise DataError(location, where, 'a message {"role": ..., "content": ...}', msg)
        role = msg.get("role")
        if role not in ROLES:
            raise DataError(location, f"{where}.role", f"one of {', '.join(ROLES)}", role)
        calls = msg.get("tool_calls")
        if calls and role == "assistant":  # an assistant's tool calls (OpenAI's layout): content may be null
            content = msg.get("content")
            text = "" if content is None else content_text(content, f"{where}.content", location)
            out.append(
                {"role": role, "content": text, "tool_calls": tool_calls(calls, f"{where}.tool_calls", location)}
            )
        else:
            out.append({"role": role, "content": content_text(msg.get("content"), f"{where}.content", location)})
    return out


# --------------------------------------------------------------------------- implicit prompt


def _common_prefix_len(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def extract_prompt(chosen, rejected) -> tuple[Any, Any, Any]:
    """Split an implicit-prompt pair into ``(prompt, chosen, rejected)``.

    Like TRL's ``extract_prompt``: the prompt is the longest common prefix of both.
    Conversations split at a message boundary; strings at the last whitespace before the
    first difference (so the continuations start with it, e.g. ``" 42"``/``" 43"``), or at
    the first difference when the shared part has no whitespace. Both continuations keep
    at least one message/character. Raises ``ValueError`` when there is no common prefix.
    """
    n = _common_prefix_len(chosen, rejected)
    if isinstance(chosen, str):
        space = max(chosen.rfind(c, 0, n) for c in (" ", "\n", "\t", "\r"))
        cut = space if space > 0 else n
    else:
        cut = n
    cut = min(cut, len(chosen) - 1, len(rejected) - 1)
    if cut <= 0:
        raise ValueError("chosen and rejected share no prompt prefix")
    return chosen[:cut], chosen[cut:], rejected[cut:]


# --------------------------------------------------------------------------- normalization


def _kind(value: Any) -> bool | None:
    """True for a list (conversation attempt), False for a string, None otherwise."""
    if isinstance(value, str):
        return False
    if isinstance(value, list):
        return True
    return None


def _field(row: Mapping, name: str, conversational: bool | None, location: str):
    value = row.get(name)
    if conversational is None:
        raise DataError(location, name, "string or list of messages", value)
    if conversational:
        return _check_conversation(value, name, location)
    if not isinstance(value, str):
        raise DataError(location, name, "string", value)
    return value


def _label(value: Any, location: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise DataError(location, "label", "bool (true/false or 0/1)", value)


def normalize_row(row: Mapping[str, Any], fmt: str, location: str, conversational: bool | None = None) -> dict:
    """Validate ``row`` as format ``fmt`` and return it normalized (see module doc).

    ``conversational`` pins whether the text fields must be strings (False) or conversations
    (True), e.g. to what the first row of a file had; ``None`` decides from this row.
    Raises :class:`DataError` naming ``location`` and the field.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    if not isinstance(row, Mapping):
        raise DataError(location, None, "an object with named columns", row)
    out: dict[str, Any] = {}
    if fmt == "text":
        out["text"] = _field(row, "text", False, location)
    elif fmt == "messages":
        out["messages"] = _check_conversation(row.get("messages"), "messages", location)
        if not out["messages"]:
            raise DataError(location, "messages", "a non-empty list of messages", [])
    else:
        names = [c for c in FORMATS[fmt] if c != "label"]
        if fmt == "preference" and row.get("prompt") is None:
            names = ["chosen", "rejected"]  # implicit prompt
        conv = conversational
        if conv is None:
            conv = next((k for k in (_kind(row.get(n)) for n in names) if k is not None), None)
        for name in names:
            out[name] = _field(row, name, conv, location)
        if fmt == "preference" and "prompt" not in out:
            out = _implicit_preference(out, location)
        if fmt == "preference" and out["chosen"] == out["rejected"] and not _blank(out["chosen"]):
            # nothing to learn from a tie, and every preference loss is constant on it
            raise DataError(location, "rejected", "a response different from 'chosen'", out["rejected"])
        if fmt == "unpaired_preference":
            out["label"] = _label(row.get("label"), location)
        out = {c: out[c] for c in FORMATS[fmt]}
    for key, value in row.items():
        if key not in out:
            out[key] = value
    return out


def _implicit_preference(pair: dict, location: str) -> dict:
    chosen, rejected = pair["chosen"], pair["rejected"]
    if _blank(chosen) or _blank(rejected):  # no prompt to extract; dropped as empty
        return {"prompt": "" if isinstance(chosen, str) else [], "chosen": chosen, "rejected": rejected}
    try:
        prompt, chosen, rejected = extract_prompt(chosen, rejected)
    except ValueError:
        raise DataError(
            location,
            "rejected",
            "to start with the same prompt as 'chosen' (no 'prompt' column, so the prompt is their common prefix)",
            rejected,
        ) from None
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def row_is_conversational(row: Mapping[str, Any], fmt: str) -> bool:
    """Whether a normalized row's text fields are conversations."""
    return isinstance(row[FORMATS[fmt][0]], list)


# --------------------------------------------------------------------------- filters helpers


def _blank(value: Any) -> bool:
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list):
        return all(not m["content"].strip() for m in value)
    return False


def is_empty(row: Mapping[str, Any], fmt: str) -> bool:
    """A normalized row with an empty/whitespace-only text field (or conversation)."""
    return any(_blank(row[c]) for c in FORMATS[fmt] if c != "label")


def canonical_key(row: Mapping[str, Any], fmt: str) -> str:
    """Canonical JSON of a normalized row's format fields (and its images' content hashes, when it has
    images); equal for exact duplicates."""
    key = {c: row[c] for c in FORMATS[fmt]}
    if row.get("images"):  # the same text about another image is another row
        key["images"] = [image.get("sha256") for image in row["images"]]
    return json.dumps(key, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def generated_text(completion) -> str:
    """The generated text of a completion (a string or a list of messages)."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if m.get("role") == "assistant")
    return completion
