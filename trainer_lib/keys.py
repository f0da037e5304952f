"""Dotted config keys (``engine.zero_stage``) in nested mappings, for every place that builds one."""

from __future__ import annotations

from trainer_lib.errors import ConfigError


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
