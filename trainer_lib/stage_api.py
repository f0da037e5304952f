"""Build a stage's config and run it: the one path every caller takes (CLI, KFP components, tests).

    run_stage("sft", {"model.path": m, "data.path": d, "output_dir": out, "max_steps": 3})
    run_stage("sft", ["lr=1e-5", "lora.r=8"], config_yaml="engine:\\n  zero_stage: 2\\n")
    run_stage("sft", [typed_params, *user_overrides, artifact_paths], config_yaml)

The config is built like ``posttrain <stage> --config FILE key=value ...``: the YAML text
first, then the overrides in order, later ones winning. ``overrides`` is a dict (dotted or
nested keys, values already typed), a list of ``key=value`` strings (values parsed as YAML
scalars, as on the command line), or a list mixing both. :func:`run_config` is where a stage
starts: the object store is configured there once, from the config's ``storage`` section.
Nothing here imports kfp or torch.
"""

from __future__ import annotations

import yaml

from trainer_lib import storage
from trainer_lib.config import ConfigError, load_config, merge, parse_overrides
from trainer_lib.keys import section_for
from trainer_lib.stages import STAGES, stage_module
from trainer_lib.tracking import check_reporters

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
    if config_yaml and config_yaml.strip():
        try:
            loaded = yaml.safe_load(config_yaml)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config_yaml: invalid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError("config_yaml: expected a mapping at the top level")
        values = loaded or {}
    layers = [overrides] if isinstance(overrides, dict) else list(overrides or [])
    strings: list[str] = []  # consecutive key=value strings are parsed together
    for layer in [*layers, None]:
        if isinstance(layer, str):
            strings.append(layer)
            continue
        if strings:
            values = merge(values, parse_overrides(strings))
            strings = []
        if isinstance(layer, dict):
            values = merge(values, nest(layer))
        elif layer is not None:
            raise ConfigError(f"overrides: expected key=value strings or mappings, got {layer!r}")
    return values


def stage_config(name: str, overrides: dict | list[Layer] | None = None, config_yaml: str = ""):
    """The validated config of stage ``name`` (a ConfigError naming the key otherwise).

    ``config_yaml`` stays a layer of its own, so TRL's or LLaMA-Factory's key names in it are
    translated before the overrides are laid over it (a component's typed ``lr`` then wins over
    the file's ``learning_rate``, as it would over the file's ``lr``)."""
    if name not in STAGES:
        raise ConfigError(f"unknown stage '{name}'; expected one of {sorted(STAGES)}")
    return load_config(stage_module(name).CONFIG, [build_values(None, config_yaml)],
                       build_values(overrides), stage=name)


def run_config(name: str, cfg) -> dict:
    """Start stage ``name`` with a built config: configure the object store, check that the trackers
    in ``report_to`` are installed (on every rank, before any model is loaded), then ``run``."""
    section = getattr(cfg, "storage", None)
    if section is not None:
        storage.configure(endpoint_url=section.endpoint_url, region=section.region, cache_dir=section.cache_dir)
    if getattr(cfg, "report_to", None):
        check_reporters(cfg.report_to)
    return stage_module(name).run(cfg) or {}


def run_stage(name: str, overrides: dict | list[Layer] | None = None, config_yaml: str = "") -> dict:
    """Build the config of stage ``name`` and run it; returns the stage's summary dict."""
    return run_config(name, stage_config(name, overrides, config_yaml))
