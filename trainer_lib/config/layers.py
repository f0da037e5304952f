"""The override layers a stage's config is built from, as components and TrainJobs hand them over.

A layer is a mapping (dotted or nested keys, values already typed) or a ``key=value`` string (its
value parsed as a YAML scalar, as on the command line). :func:`build_values` lays them over a YAML
text in order, later ones winning; :func:`trainer_lib.runner.stage_api.stage_config` then types and
validates the result.
"""

from __future__ import annotations

import yaml

from trainer_lib.config.loader import merge, parse_overrides, safe_yaml
from trainer_lib.errors import ConfigError
from trainer_lib.values import section_for

Layer = dict | str


def nest(flat: dict) -> dict:
    """``{"model.path": x, "lr": 1}`` -> ``{"model": {"path": x}, "lr": 1}``; values kept as they are."""
    tree: dict = {}
    for key, value in flat.items():
        node, last = section_for(tree, str(key), f"{key}: conflicts with an earlier key")
        if isinstance(value, dict):
            value = nest(value)
            if isinstance(node.get(last), dict):
                value = merge(node[last], value)
        node[last] = value
    return tree


def build_values(overrides: dict | list[Layer] | None, config_yaml: str = "") -> dict:
    """The merged nested mapping: YAML text, then each override layer in order."""
    values: dict = {}
    for layer in [read_yaml_text(config_yaml), *split_layers(overrides)]:
        values = merge(values, layer)
    return values


def read_yaml_text(config_yaml: str) -> dict:
    """The top-level mapping of a YAML text (empty: ``{}``)."""
    if not config_yaml or not config_yaml.strip():
        return {}
    try:
        loaded = safe_yaml(config_yaml, "config_yaml")
    except yaml.YAMLError as exc:
        raise ConfigError(f"config_yaml: invalid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError("config_yaml: expected a mapping at the top level")
    return loaded or {}


def split_layers(overrides: dict | list[Layer] | None) -> list[dict]:
    """The override layers as nested mappings, in order; consecutive ``key=value`` strings are one layer."""
    layers = [overrides] if isinstance(overrides, dict) else list(overrides or [])
    out: list[dict] = []
    strings: list[str] = []
    for layer in [*layers, None]:
        if isinstance(layer, str):
            strings.append(layer)
            continue
        if strings:
            out.append(parse_overrides(strings))
            strings = []
        if isinstance(layer, dict):
            out.append(nest(layer))
        elif layer is not None:
            raise ConfigError(f"overrides: expected key=value strings or mappings, got {layer!r}")
    return out
