"""LLaMA-Factory's dataset formats, ``alpaca`` and ``sharegpt``, turned into our normalized rows.

Pure Python, like :mod:`trainer_lib.data.formats`, which detects them by their columns.

``alpaca``: ``instruction``, ``input`` (optional, appended to the instruction after a newline, as
LLaMA-Factory does), ``output``, optional ``system`` and ``history`` (earlier turns as
``[user, assistant]`` pairs)::

    {"instruction": "Add.", "input": "2 + 2", "output": "4", "history": [["Hi", "Hello!"]]}

``sharegpt``: ``conversations``, a list of ``{"from": ..., "value": ...}`` with roles ``human``,
``gpt``, ``system`` (first only), ``function_call`` (an assistant's tool call) and
``observation`` (the tool's answer), alternating user/assistant and ending with an assistant
turn; an optional ``system`` column. A ``value`` may be a list of text parts::

    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}

What the rows become (:func:`target_format`) follows the entry's columns, as in LLaMA-Factory:
``messages`` rows; with ``ranking: true`` (columns ``chosen``/``rejected``, for sharegpt each one
assistant message object answering a conversation that ends with a user turn) ``preference`` rows;
with a ``kto_tag`` column (true: desirable) ``unpaired_preference`` rows, the last assistant turn
being the completion; an alpaca entry whose ``columns`` name no ``response`` (``{"prompt": "text"}``,
LLaMA-Factory's pretraining corpora) ``text`` rows. A ``tools`` column (a JSON list of tool
definitions) is kept as a JSON string column ``tools``, which the chat template renders; an ``images``
column (LLaMA-Factory's ``mllm_demo``: ``"columns": {"messages": "messages", "images": "images"}``) becomes
the row's ``images`` (:mod:`trainer_lib.data.images`). Video and audio columns are refused.

Renamed columns are given like the ``columns`` (and, for sharegpt, ``tags``) of LLaMA-Factory's
``dataset_info.json``, in ``data.columns``: ``{"prompt": "question", "response": "answer"}``
(alpaca's own names ``instruction``/``input``/``output`` work as keys too) or
``{"messages": "dialog", "role_tag": "role", "content_tag": "text", "user_tag": "user"}``.

Datasets named in LLaMA-Factory's registry, ``dataset_info.json`` in ``data.dataset_dir``, resolve to
their files, formats and columns with :func:`registry_sources` (``data.dataset: identity,alpaca_en_demo``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping

from trainer_lib.data.formats import content_text, tool_calls
from trainer_lib.errors import DataError

#: dataset_info.json column names -> the column they default to.
ALPACA_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "system": "system",
    "history": "history",
}
#: alpaca's own column names, accepted as keys of ``data.columns`` too.
ALPACA_KEY_SYNONYMS = {"instruction": "prompt", "input": "query", "output": "response"}
SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system"}
SHAREGPT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
#: columns either format may name, read only when named: the two answers of a ranking (preference)
#: dataset, KTO's desirable/undesirable flag, the tools offered to the model (a JSON list), the row's
#: images (read as the ``images`` column, :mod:`trainer_lib.data.images`).
OPTIONAL_COLUMNS = ("chosen", "rejected", "kto_tag", "tools", "images")
#: LLaMA-Factory's other media columns, refused: posttrain reads images, not video or audio.
MEDIA_COLUMNS = ("videos", "audios")
SOURCE_FORMATS = ("alpaca", "sharegpt")


def source_format(columns: Mapping[str, str | None], fmt: str) -> str:
    """The format ``data.columns`` is for (``fmt``, or inferred from the keys when ``auto``);
    ``ValueError`` with the message for the ``data.columns`` setting otherwise."""
    keys = set(columns)
    sharegpt_keys = set(SHAREGPT_COLUMNS) | set(SHAREGPT_TAGS)
    alpaca_keys = set(ALPACA_COLUMNS) | set(ALPACA_KEY_SYNONYMS)
    if fmt == "auto":
        fmt = "sharegpt" if keys & (sharegpt_keys - alpaca_keys) else "alpaca"
    if fmt not in SOURCE_FORMATS:
        raise ValueError(f"renames the columns of alpaca or sharegpt data, not of data.format={fmt}")
    media = sorted(keys & set(MEDIA_COLUMNS))
    if media:
        raise ValueError(f"{media[0]}: names a media column; posttrain reads images, not video or audio")
    known = (alpaca_keys if fmt == "alpaca" else sharegpt_keys) | set(OPTIONAL_COLUMNS)
    unknown = sorted(keys - known)
    if unknown:
        raise ValueError(f"unknown name {unknown[0]!r} for {fmt} data (expected some of {', '.join(sorted(known))})")
    # response None: the entry names no response column (a pretraining corpus, see registry_sources)
    bad = [k for k, v in columns.items() if not (isinstance(v, str) and v) and not (k == "response" and v is None)]
    if bad:
        raise ValueError(f"{bad[0]}: expected a column name, got {columns[bad[0]]!r}")
    if ("chosen" in keys) != ("rejected" in keys):
        raise ValueError("chosen and rejected name the two answers of a ranking dataset: give both")
    if "kto_tag" in keys and "chosen" in keys:
        raise ValueError("kto_tag (unpaired rows) and chosen/rejected (pairs): a dataset is one or the other")
    return fmt


def target_format(fmt: str, columns: Mapping[str, str | None] | None, allowed: Iterable[str] | None = None) -> str:
    """The normalized format rows of LLaMA-Factory format ``fmt`` become, given their ``columns``:
    ``preference`` (ranking: chosen/rejected), ``unpaired_preference`` (``kto_tag``), ``text``
    (an alpaca corpus without a response column, LLaMA-Factory's pretraining data), else ``messages``,
    or ``prompt_completion`` (the last assistant turn the completion) for a stage that ``allowed``
    only that, as LLaMA-Factory's PPO reads the prompt of an SFT dataset."""
    columns = columns or {}
    if allowed is not None and "messages" not in allowed and "prompt_completion" in allowed:
        conversation = target_format(fmt, columns)
        return "prompt_completion" if conversation == "messages" else conversation
    if "chosen" in columns:
        return "preference"
    if "kto_tag" in columns:
        return "unpaired_preference"
    if fmt == "alpaca" and "response" in columns and columns["response"] is None:
        return "text"
    return "messages"


def converter(
    fmt: str, columns: Mapping[str, str | None] | None = None, target: str = ""
) -> Callable[[Mapping, str], dict]:
    """``convert(row, location) -> a row of target`` (default ``target_format(fmt, columns)``), other
    columns kept."""
    columns = dict(columns or {})
    target = target or target_format(fmt, columns)
    if fmt == "alpaca":
        names = {**ALPACA_COLUMNS, **{ALPACA_KEY_SYNONYMS.get(k, k): v for k, v in columns.items()}}

        def alpaca_parse(row, location):
            return alpaca_to_messages(row, location, names, with_response=target not in ("text", "preference"))

        return lambda row, location: _shape(row, location, target, names, alpaca_parse, _alpaca_answer)
    names = {**SHAREGPT_COLUMNS, **{k: v for k, v in columns.items() if k not in SHAREGPT_TAGS}}
    tags = {**SHAREGPT_TAGS, **{k: v for k, v in columns.items() if k in SHAREGPT_TAGS}}

    def sharegpt_parse(row, location):
        return sharegpt_to_messages(row, location, names, tags, ends_with_answer=target != "preference")

    def sharegpt_answer(value, column, location):
        return _sharegpt_answer(value, column, location, tags)

    return lambda row, location: _shape(row, location, target, names, sharegpt_parse, sharegpt_answer)


def _shape(row: Mapping, location: str, target: str, names: dict, parse: Callable, answer: Callable) -> dict:
    """The row in the columns of ``target`` from its conversation (``parse``), its ranked answers
    (``answer``: one chosen/rejected value as an assistant message) and its kto_tag."""
    if not isinstance(row, Mapping):
        raise DataError(location, None, "an object with named columns", row)
    messages = parse(row, location)
    if target == "text":
        out = {"text": messages[-1]["content"]}
    elif target == "messages":
        out = {"messages": messages}
    elif target == "prompt_completion":
        out = {"prompt": messages[:-1], "completion": messages[-1:]}
    elif target == "preference":
        chosen = answer(row.get(names["chosen"]), names["chosen"], location)
        rejected = answer(row.get(names["rejected"]), names["rejected"], location)
        out = {"prompt": messages, "chosen": [chosen], "rejected": [rejected]}
    else:
        label = row.get(names["kto_tag"])
        if not isinstance(label, bool):
            raise DataError(location, names["kto_tag"], "true or false (kto_tag: desirable or not)", label)
        out = {"prompt": messages[:-1], "completion": messages[-1:], "label": label}
    if names.get("tools"):
        out["tools"] = _tools(row.get(names["tools"]), names["tools"], location)
    if names.get("images"):  # renamed to the images column, which the normalizer checks
        out["images"] = row.get(names["images"])
    used = {v for v in names.values() if v}
    return {**out, **{k: v for k, v in row.items() if k not in used and k not in out}}


def _tools(value, column: str, location: str) -> str:
    """The tools column as a JSON string of a list of tool definitions ("" when the row offers none)."""
    if value in (None, "", []):
        return ""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            raise DataError(location, column, "a JSON list of tool definitions", value) from None
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not isinstance(parsed, list) or not all(isinstance(tool, dict) for tool in parsed):
        raise DataError(location, column, "a JSON list of tool definitions", value)
    return json.dumps(parsed, ensure_ascii=False)


def _text(row: Mapping, column: str, location: str, required: bool) -> str:
    value = row.get(column)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise DataError(location, column, "string" if required else "string or null", value)
    return value


def _alpaca_answer(value, column: str, location: str) -> dict:
    if not isinstance(value, str):
        raise DataError(location, column, "string (one answer of the ranked pair)", value)
    return {"role": "assistant", "content": value}


def alpaca_to_messages(row: Mapping, location: str, names: dict, with_response: bool = True) -> list[dict]:
    """System, history pairs and the user turn (instruction, then input after a newline), then the
    response when ``with_response``."""
    instruction = _text(row, names["prompt"], location, required=True)
    query = _text(row, names["query"], location, required=False)
    system = _text(row, names["system"], location, required=False)
    history = row.get(names["history"]) or []
    if not isinstance(history, list):
        raise DataError(location, names["history"], "a list of [user, assistant] pairs", history)
    messages = [{"role": "system", "content": system}] if system else []
    for i, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise DataError(location, f"{names['history']}[{i}]", "a [user, assistant] pair of strings", pair)
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    messages.append({"role": "user", "content": "\n".join(part for part in (instruction, query) if part)})
    if with_response:
        messages.append({"role": "assistant", "content": _text(row, names["response"], location, required=True)})
    return messages


def _sharegpt_answer(value, column: str, location: str, tags: dict) -> dict:
    role_tag, content_tag = tags["role_tag"], tags["content_tag"]
    answers = (tags["assistant_tag"], tags["function_tag"])
    if not isinstance(value, Mapping):
        raise DataError(location, column, f'a message {{"{role_tag}": ..., "{content_tag}": ...}}', value)
    if value.get(role_tag) not in answers:
        raise DataError(location, f"{column}.{role_tag}", f"one of {', '.join(answers)}", value.get(role_tag))
    return {"role": "assistant", "content": content_text(value.get(content_tag), f"{column}.{content_tag}", location)}


def _function_call(value: str, field: str, location: str) -> dict:
    """A function_call turn (JSON: one call or a list of calls) as an assistant message with tool calls."""
    try:
        calls = json.loads(value)
    except ValueError:
        calls = None
    if not isinstance(calls, (dict, list)) or not calls:
        raise DataError(location, field, 'a JSON tool call {"name": ..., "arguments": {...}}', value)
    return {"role": "assistant", "content": "", "tool_calls": tool_calls(calls, field, location)}


def sharegpt_to_messages(
    row: Mapping, location: str, names: dict, tags: dict, ends_with_answer: bool = True
) -> list[dict]:
    """The conversation (system first), its turns alternating user/assistant and ending with an
    assistant turn, or with a user turn when ``ends_with_answer`` is false (a ranking prompt)."""
    column = names["messages"]
    turns = row.get(column)
    if not isinstance(turns, list) or not turns:
        raise DataError(location, column, "a non-empty list of messages", turns)
    role_tag, content_tag = tags["role_tag"], tags["content_tag"]
    roles = {
        tags["user_tag"]: "user",
        tags["observation_tag"]: "tool",
        tags["assistant_tag"]: "assistant",
        tags["function_tag"]: "assistant",
    }
    asks, answers = (tags["user_tag"], tags["observation_tag"]), (tags["assistant_tag"], tags["function_tag"])
    system = _text(row, names["system"], location, required=False)
    messages = []
    for i, turn in enumerate(turns):
        where = f"{column}[{i}]"
        if not isinstance(turn, Mapping):
            raise DataError(location, where, f'a message {{"{role_tag}": ..., "{content_tag}": ...}}', turn)
        role = turn.get(role_tag)
        if i == 0 and role == tags["system_tag"]:
            system = content_text(turn.get(content_tag), f"{where}.{content_tag}", location)
            continue
        expected = asks if len(messages) % 2 == 0 else answers
        if role not in expected:
            kind = "user" if expected is asks else "assistant"
            raise DataError(
                location,
                f"{where}.{role_tag}",
                f"one of {', '.join(expected)} (turns alternate user/assistant, this one is the {kind}'s)",
                role,
            )
        content = content_text(turn.get(content_tag), f"{where}.{content_tag}", location)
        if role == tags["function_tag"]:
            messages.append(_function_call(content, f"{where}.{content_tag}", location))
        else:
            messages.append({"role": roles[role], "content": content})
    if not messages:
        raise DataError(location, column, "a user turn and an assistant turn", turns)
    if ends_with_answer and len(messages) % 2:
        raise DataError(
            location, column, f"to end with an assistant turn ({', '.join(answers)})", turns[-1].get(role_tag)
        )
    if not ends_with_answer and not len(messages) % 2:
        expected = f"to end with a user turn ({', '.join(asks)}), which chosen/rejected answer"
        raise DataError(location, column, expected, turns[-1].get(role_tag))
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return messages


# --------------------------------------------------------------------------- dataset_info.json

#: the entries of a dataset_info.json dataset that are followed.
REGISTRY_KEYS = ("file_name", "hf_hub_url", "formatting", "ranking", "columns", "tags", "file_sha1", "subset", "split")
REGISTRY_FILE = "dataset_info.json"


def read_registry(dataset_dir: str) -> tuple[str, dict]:
    """``(path of dataset_info.json, its mapping)``; ``ValueError`` with the reason otherwise."""
    info_file = os.path.join(dataset_dir or ".", REGISTRY_FILE)
    if not os.path.isfile(info_file):
        raise ValueError(
            f"names are looked up in {info_file} (LLaMA-Factory's dataset_dir), which does not exist; "
            f"set data.dataset_dir (dataset_dir), or data.path to a file"
        )
    try:
        with open(info_file, encoding="utf-8") as fh:
            info = json.load(fh)
    except ValueError as exc:
        raise ValueError(f"{info_file}: not valid JSON ({exc})") from None
    if not isinstance(info, dict):
        raise ValueError(f"{info_file}: expected a JSON object of dataset entries")
    return info_file, info


def registry_sources(names: list[str], dataset_dir: str) -> list[dict]:
    """One source per name of ``data.dataset``, read from ``dataset_dir/dataset_info.json``:
    ``{"name", "path", "format", "columns", "subset", "split"}``. A file is relative to
    ``dataset_dir``, as in LLaMA-Factory; a ``ValueError`` names the entry and what is wrong."""
    info_file, info = read_registry(dataset_dir)
    sources = []
    for name in names:
        entry = info.get(name)
        if not isinstance(entry, dict):
            raise ValueError(f"no dataset {name!r} in {info_file}")
        unsupported = sorted(set(entry) - set(REGISTRY_KEYS))
        if unsupported:
            raise ValueError(
                f"{name!r} in {info_file} uses {unsupported[0]!r}, which posttrain does not read "
                f"(it follows {', '.join(REGISTRY_KEYS)})"
            )
        if "file_name" in entry:
            path = os.path.join(dataset_dir, str(entry["file_name"]))
        elif "hf_hub_url" in entry:
            path = str(entry["hf_hub_url"])
        else:
            raise ValueError(f"{name!r} in {info_file} has neither file_name nor hf_hub_url")
        fmt = entry.get("formatting", "alpaca")
        if fmt not in SOURCE_FORMATS:
            raise ValueError(f"{name!r} in {info_file}: formatting {fmt!r} is not one of {', '.join(SOURCE_FORMATS)}")
        columns = {**(entry.get("columns") or {}), **(entry.get("tags") or {})}
        if fmt == "alpaca" and "columns" in entry and not {"response", "output"} & set(columns):
            columns["response"] = None  # as in LLaMA-Factory: named columns only; no response is a text corpus
        ranking = entry.get("ranking", False)
        if not isinstance(ranking, bool):
            raise ValueError(f"{name!r} in {info_file}: ranking: expected true or false, got {ranking!r}")
        if ranking:
            columns = {"chosen": "chosen", "rejected": "rejected", **columns}
        elif "chosen" in columns or "rejected" in columns:
            raise ValueError(
                f"{name!r} in {info_file}: columns name chosen/rejected, which are read only with ranking: true"
            )
        try:
            source_format(columns, fmt)
        except ValueError as exc:
            raise ValueError(f"{name!r} in {info_file}: columns: {exc}") from None
        sources.append(
            {
                "name": name,
                "path": path,
                "format": fmt,
                "columns": columns,
                "subset": str(entry.get("subset") or ""),
                "split": str(entry.get("split") or ""),
            }
        )
    return sources
