"""Build a stage's config and run it in this process: the one path every caller takes (CLI, KFP components,
tests), and the one text a built config travels as to other processes and nodes.

    run_stage("sft", {"model.path": m, "data.path": d, "output_dir": out, "max_steps": 3})
    run_stage("sft", ["lr=1e-5", "lora.r=8"], config_yaml="engine:\\n  zero_stage: 2\\n")
    run_stage("sft", [typed_params, *user_overrides, artifact_paths], config_yaml)

The config is built like ``posttrain <stage> --config FILE key=value ...``: the YAML text
first, then the overrides in order, later ones winning. ``overrides`` is a dict (dotted or
nested keys, values already typed), a list of ``key=value`` strings (values parsed as YAML
scalars, as on the command line), or a list mixing both. :func:`run_config` is where a stage
starts: the object store is configured there once, from the config's ``storage`` section.
:func:`config_text` is a built config as YAML, which :func:`stage_config` reads back (as a
``--config`` file or as ``config_yaml``) to an equal config. Nothing here imports kfp or torch.
"""

from __future__ import annotations

import yaml

from trainer_lib import storage
from trainer_lib.config import load_config, read_yaml, to_dict
from trainer_lib.config.layers import Layer, read_yaml_text, split_layers
from trainer_lib.errors import ConfigError
from trainer_lib.loop.tracking import check_reporters
from trainer_lib.stages import STAGES, stage_module


def stage_config(
    name: str,
    overrides: dict | list[Layer] | None = None,
    config_yaml: str = "",
    config_files: list[str] | tuple[str, ...] = (),
):
    """The validated config of stage ``name`` (a ConfigError naming the key otherwise).

    ``config_files`` (``posttrain <stage> --config F ...``), then ``config_yaml``, then each override
    layer stay layers of their own, so TRL's or LLaMA-Factory's key names in each are translated before
    later layers are laid over them (a component's typed ``lr`` then wins over the file's
    ``learning_rate``, as it would over the file's ``lr``; a user's ``num_epochs`` override wins over
    the typed ``max_steps`` before it)."""
    if name not in STAGES:
        raise ConfigError(f"unknown stage '{name}'; expected one of {sorted(STAGES)}")
    files = [read_yaml(path) for path in config_files]
    layers = [*files, read_yaml_text(config_yaml), *split_layers(overrides)]
    return load_config(stage_module(name).CONFIG, layers, stage=name)


def config_text(cfg) -> str:
    """A built config as the YAML text it travels as to other processes and nodes: every key, which
    :func:`stage_config` reads back to an equal config. With ``num_epochs`` > 0, ``max_steps`` (its
    default then) is left out: read in one layer with it, a positive ``max_steps`` would win."""
    values = to_dict(cfg)
    if (values.get("num_epochs") or 0) > 0:
        values.pop("max_steps", None)
    return yaml.safe_dump(values, sort_keys=False, width=1 << 30)


def run_config(name: str, cfg) -> dict:
    """Start stage ``name`` with a built config: configure the object store, check that the trackers
    in ``report_to`` are installed (on every rank, before any model is loaded), then ``run``."""
    section = getattr(cfg, "storage", None)
    if section is not None:
        storage.configure(endpoint_url=section.endpoint_url, region=section.region, cache_dir=section.cache_dir)
    if getattr(cfg, "report_to", None):
        check_reporters(cfg.report_to)
    hub = getattr(cfg, "hub", None)
    if hub is not None and hub.push:  # a token here, before any model is loaded
        from trainer_lib.storage.hub import check_ready

        check_ready(hub.model_id)
    return stage_module(name).run(cfg) or {}


def run_stage(name: str, overrides: dict | list[Layer] | None = None, config_yaml: str = "") -> dict:
    """Build the config of stage ``name`` and run it; returns the stage's summary dict."""
    return run_config(name, stage_config(name, overrides, config_yaml))


def training_layers(values: dict, paths: dict) -> list:
    """The config layers of a training task, lowest precedence first: its typed parameters, ``params``
    (empty values left out), the reward lists when non-empty, the user's overrides, the artifact
    paths. The train component runs these; ``posttrain pipeline run`` validates them beforehand."""
    typed = {
        "max_steps": values["max_steps"],
        "lr": values["lr"],
        "batch_size": values["batch_size"],
        "data.max_length": values["max_length"],
        "seed": values["seed"],
    }
    lists = {"reward.functions": values["reward_functions"], "reward.weights": values["reward_weights"]}
    given = {
        **{key: value for key, value in values["params"].items() if value not in ("", None)},
        **{key: value for key, value in lists.items() if value},
    }
    return [typed, given, *values["overrides"], paths]


def evaluation_layers(settings: dict, overrides: list, wiring: dict) -> list:
    """The config layers of an evaluation task, lowest precedence first: its typed settings, the user's
    overrides, then where models and data are (``wiring``). None and empty lists are left out of
    ``settings`` and ``wiring``: an input or a list not given leaves the key to the config. The served
    variant's settings (``served.*``) count only with an export to score (``served.export_dir``)."""

    def given(layer: dict) -> dict:
        return {key: value for key, value in layer.items() if value not in (None, [])}

    if given(wiring).get("served.export_dir") is None:
        settings = {key: value for key, value in settings.items() if not key.startswith("served.")}
    return [given(settings), *overrides, given(wiring)]
