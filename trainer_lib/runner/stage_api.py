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

from trainer_lib import storage
from trainer_lib.config import load_config, read_yaml
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
