"""LLaMA-Factory's dataset formats, ``alpaca`` and ``sharegpt``, turned into ``messages`` rows.

Pure Python, like :mod:`trainer_lib.data.formats`, which detects them by their columns.

``alpaca``: ``instruction``, ``input`` (optional, appended to the instruction after a newline, as
LLaMA-Factory does), ``output``, optional ``system`` and ``history`` (earlier turns as
``[user, assistant]`` pairs)::

    {"instruction": "Add.", "input": "2 + 2", "output": "4", "history": [["Hi", "Hello!"]]}

``sharegpt``: ``conversations``, a list of ``{"from": ..., "value": ...}`` with roles ``human``,
``gpt``, ``system`` (first only), ``function_call`` (an assistant's tool call) and
``observation`` (the tool's answer), alternating user/assistant and ending with an assistant
turn; an optional ``system`` column::

    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}

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
from collections.abc import Callable, Mapping

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
SOURCE_FORMATS = ("alpaca", "sharegpt")


def source_format(columns: Mapping[str, str], fmt: str) -> str:
    """The format ``data.columns`` is for (``fmt``, or inferred from the keys when ``auto``);
    ``ValueError`` with the message for the ``data.columns`` setting otherwise."""
    keys = set(columns)
    sharegpt_keys = set(SHAREGPT_COLUMNS) | set(SHAREGPT_TAGS)
    alpaca_keys = set(ALPACA_COLUMNS) | set(ALPACA_KEY_SYNONYMS)
    if fmt == "auto":
        fmt = "sharegpt" if keys & (sharegpt_keys - alpaca_keys) else "alpaca"
    if fmt not in SOURCE_FORMATS:
        raise ValueError(f"renames the columns of alpaca or sharegpt data, not of data.format={fmt}")
    known = alpaca_keys if fmt == "alpaca" else sharegpt_keys
    unknown = sorted(keys - known)
    if unknown:
        raise ValueError(f"unknown name {unknown[0]!r} for {fmt} data (expected some of {', '.join(sorted(known))})")
    bad = [k for k, v in columns.items() if not isinstance(v, str) or not v]
    if bad:
        raise ValueError(f"{bad[0]}: expected a column name, got {columns[bad[0]]!r}")
    return fmt


def converter(fmt: str, columns: Mapping[str, str] | None = None) -> Callable[[Mapping, str], dict]:
    """``convert(row, location) -> {"messages": [...], <other columns>}`` for ``fmt``."""
    columns = dict(columns or {})
    if fmt == "alpaca":
        names = {**ALPACA_COLUMNS, **{ALPACA_KEY_SYNONYMS.get(k, k): v for k, v in columns.items()}}
        return lambda row, location: alpaca_to_messages(row, location, names)
    names = {**SHAREGPT_COLUMNS, **{k: v for k, v in columns.items() if k in SHAREGPT_COLUMNS}}
    tags = {**SHAREGPT_TAGS, **{k: v for k, v in columns.items() if k in SHAREGPT_TAGS}}
    return lambda row, location: sharegpt_to_messages(row, location, names, tags)


def _text(row: Mapping, column: str, location: str, required: bool) -> str:
    value = row.get(column)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise DataError(location, column, "string" if required else "string or null", value)
    return value


def _rest(row: Mapping, used: set[str]) -> dict:
    return {k: v for k, v in row.items() if k not in used and k != "messages"}


def alpaca_to_messages(row: Mapping, location: str, names: dict[str, str]) -> dict:
    instruction = _text(row, names["prompt"], location, required=True)
    query = _text(row, names["query"], location, required=False)
    response = _text(row, names["response"], location, required=True)
    system = _text(row, names["system"], location, required=False)
    history = row.get(names["history"]) or []
    if not isinstance(history, list):
        raise DataError(location, names["history"], "a list of [user, assistant] pairs", history)
    messages = [{"role": "system", "content": system}] if system else []
    for i, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise DataError(location, f"{names['history']}[{i}]", "a [user, assistant] pair of strings", pair)
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    user = "\n".join(part for part in (instruction, query) if part)
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": response}]
    return {"messages": messages, **_rest(row, set(names.values()))}


def sharegpt_to_messages(row: Mapping, location: str, names: dict[str, str], tags: dict[str, str]) -> dict:
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
        role, content = turn.get(role_tag), turn.get(content_tag)
        if i == 0 and role == tags["system_tag"]:
            if not isinstance(content, str):
                raise DataError(location, f"{where}.{content_tag}", "string", content)
            system = content
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
        if not isinstance(content, str):
            raise DataError(location, f"{where}.{content_tag}", "string", content)
        messages.append({"role": roles[role], "content": content})
    if not messages:
        raise DataError(location, column, "a user turn and an assistant turn", turns)
    if len(messages) % 2:
        raise DataError(
            location, column, f"to end with an assistant turn ({', '.join(answers)})", turns[-1].get(role_tag)
        )
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages, **_rest(row, set(names.values()))}


# --------------------------------------------------------------------------- dataset_info.json

#: the entries of a dataset_info.json dataset that are followed.
REGISTRY_KEYS = ("file_name", "hf_hub_url", "formatting", "columns", "tags", "file_sha1", "subset", "split")
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
