"""Single config values: booleans in text, seconds in environment variables, and dotted keys
(``engine.zero_stage``) in nested mappings.

The one place that parses them, for the typed configs, the TRL/LLaMA-Factory aliases, the pipeline
parameters and the ``POSTTRAIN_*`` waits of the object store and the collectives alike. It sits at the
package root, below every folder, with ``errors.py``: it imports nothing of ours but the errors.
"""

from __future__ import annotations

import os
from typing import Any

from trainer_lib.errors import ConfigError

TRUE = frozenset({"true", "yes", "1", "on"})
FALSE = frozenset({"false", "no", "0", "off"})


def parse_bool(value: Any, key: str) -> bool:
    """A bool, or its text (true/false, yes/no, 1/0, on/off, any case); a ConfigError naming ``key`` otherwise."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in TRUE | FALSE:
        return value.lower() in TRUE
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name`` (``default`` when unset or
    empty); a ConfigError naming the variable otherwise."""
    text = os.environ.get(name, "")
    try:
        seconds = float(text) if text else default
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"{name}: expected a positive number of seconds, got {text!r}")
    return seconds


def section_for(tree: dict, dotted: str, conflict: str) -> tuple[dict, str]:
    """``(mapping, last part)`` of a dotted key in a nested dict, sections created on the way; a
    ConfigError with ``conflict`` when a value stands where a section should be."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(conflict)
    return node, parts[-1]


def lookup_dotted(tree: dict, dotted: str) -> tuple[bool, Any]:
    """(whether the nested mapping holds the dotted key, its value)."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def read_secret(key: str, path: str, env: str) -> str:
    """A secret from the file at ``path`` when one is given (it must exist and hold something), else from the
    environment variable ``env`` (empty when unset); ``key`` names the setting in errors, never the value."""
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                value = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"{key}: cannot read {path} ({type(exc).__name__})") from None
        if not value:
            raise ConfigError(f"{key}: {path} is empty")
        return value
    return os.environ.get(env, "").strip() if env else ""
