"""Typed stage configs: YAML files and ``key=value`` overrides, TRL's and LLaMA-Factory's key names.

* :mod:`~trainer_lib.config.sections`: the shared sections (``model``, ``data``, ``engine``, ``lora``,
  ``storage``), :class:`TrainingConfig` and the checks stages use in ``validate()``.
* :mod:`~trainer_lib.config.rl`: the keys the online RL stages (PPO, GRPO) share.
* :mod:`~trainer_lib.config.loader`: a config built from YAML and overrides, typed and validated;
  ``--help`` rows; the config flattened for trackers.
* :mod:`~trainer_lib.config.layers`: the override layers a component or a TrainJob hands a stage.
* :mod:`~trainer_lib.config.aliases`: TRL's and LLaMA-Factory's key names translated to ours.

Single values (booleans in text, seconds in the environment, dotted keys) are parsed in
:mod:`trainer_lib.values`, below every folder. The names a stage needs are importable from the package
itself; nothing heavy is imported.
"""

from trainer_lib.config.loader import (
    describe,
    flat_dict,
    has_key,
    load_config,
    merge,
    parse_overrides,
    read_yaml,
    to_dict,
)
from trainer_lib.config.sections import (
    METRIC_SCHEDULERS,
    SCHEDULERS,
    DataConfig,
    EngineConfig,
    LoraConfig,
    ModelConfig,
    StorageConfig,
    TrainingConfig,
    check_non_negative,
    check_positive,
    lookup,
    opt,
)

__all__ = [
    "METRIC_SCHEDULERS",
    "SCHEDULERS",
    "DataConfig",
    "EngineConfig",
    "LoraConfig",
    "ModelConfig",
    "StorageConfig",
    "TrainingConfig",
    "check_non_negative",
    "check_positive",
    "describe",
    "flat_dict",
    "has_key",
    "load_config",
    "lookup",
    "merge",
    "opt",
    "parse_overrides",
    "read_yaml",
    "to_dict",
]
