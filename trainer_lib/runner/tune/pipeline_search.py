"""The search a pipeline's ``tune`` task runs in its own pod, before the training task it tunes.

    search = pipeline_search("dpo", search_text, layers, config_yaml, scratch)   # checked; nothing runs yet
    results = run_pipeline_search(search, layers, config_yaml, "best.yaml")    # the trials, then best.yaml

The search file is ``posttrain tune``'s (docs/tuning.md), given as YAML or JSON text (a pipeline parameter).
What differs from a search on a laptop:

* The base config is the training task's own: ``config_yaml`` and ``layers`` (its typed parameters, the
  run's ``*_overrides`` and the upstream tasks' artifacts), as the ``train`` component builds it. The search
  file's ``overrides`` go over it for the trials only (fewer steps, more frequent evals for the pruner).
* The best config handed to the training task is that same base config with the best trial's values and
  seed laid over it, not the search file's ``overrides``: a search of short trials picks the values, and the
  training task still trains as long as the run says. With no ``overrides``, it is the best trial's config.
* ``stage`` may be left out (it is the task's); ``output_dir`` is the task's scratch folder. Refused:
  ``config`` files and ``storage`` (the pod has neither the files nor an earlier run's study to resume), and
  the paths the pipeline fills from the upstream tasks (``model.path``, ``data.path``, ``reward.model_path``).

Nothing here imports Optuna until a search runs.
"""

from __future__ import annotations

import json
import os

import yaml

from trainer_lib.config import load_config
from trainer_lib.config.layers import nest, read_yaml_text
from trainer_lib.config.loader import safe_yaml
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.runner.stage_api import config_text, stage_config
from trainer_lib.runner.tune.search_config import Search, TuneConfig, check_search
from trainer_lib.values import lookup_dotted

#: Keys of the base config that the pipeline fills from the upstream tasks' artifacts.
PIPELINE_PATHS = ("model.path", "data.path", "reward.model_path")


def read_search_text(text: str) -> dict:
    """The search file's mapping from YAML or JSON text; a ConfigError when it is none."""
    try:
        loaded = safe_yaml(text, "search")
    except yaml.YAMLError as exc:
        raise ConfigError(f"search: invalid YAML or JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"search: expected a search file (a mapping with space and objective), got {text[:80]!r}")
    return loaded


def pipeline_search(stage: str, text: str, layers: list, config_yaml: str, output_dir: str) -> Search:
    """The checked search of ``stage`` from the search file ``text``, its trials built on the training task's
    config (``config_yaml`` then ``layers``); every check of ``posttrain tune`` runs, and nothing is written."""
    values = read_search_text(text)
    if values.get("stage", stage) != stage:
        raise ConfigError(
            f"stage: this search runs before the {stage} task, so it searches {stage}, not {values['stage']!r}"
        )
    for key, why in (
        ("config", "the base config is the training task's own; put the trials' stage keys under overrides"),
        ("storage", "the task keeps its study in its pod, and a new run searches anew; leave it out"),
    ):
        if values.get(key):
            raise ConfigError(f"{key}: not taken by the pipeline's search ({why})")
    overrides = values.get("overrides")
    given = nest(overrides) if isinstance(overrides, dict) else {}
    for key in PIPELINE_PATHS:
        if lookup_dotted(given, key)[0]:
            raise ConfigError(f"overrides.{key}: the pipeline fills it from the upstream task; leave it out")
    tune = load_config(TuneConfig, [{**values, "stage": stage, "output_dir": output_dir}])
    return check_search(tune, base=[read_yaml_text(config_yaml), *layers])


def best_config(search: Search, base: list, best: dict) -> str:
    """The training task's config (``base``: its layers) with the best trial's values and seed, as YAML text."""
    tune = search.tune
    laid = {**best["params"], "seed": best["seed"], "output_dir": os.path.join(tune.output_dir, "best")}
    cfg = stage_config(tune.stage, [*base, laid])
    chosen = ", ".join(f"{key}={value}" for key, value in best["params"].items())
    head = (
        f"# The best of {tune.n_trials} trials of the {tune.stage} search: trial {best['trial']}, "
        f"{tune.objective.metric} = {best['value']:.6g} ({chosen}, seed {best['seed']}).\n"
        "# The training task's config with those values; the search file's overrides were for the trials only.\n"
        "# Its paths are the tune task's: the training task sets its own.\n"
    )
    return head + config_text(cfg)


def run_pipeline_search(search: Search, layers: list, config_yaml: str, best_path: str) -> dict:
    """Run ``search`` (from :func:`pipeline_search`) to its end, write results.json and report.html in its
    output folder and the best config to ``best_path``; returns results.json's content, whose ``best`` names
    the best trial, its value, values and seed. A UserError when no trial completed."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError("the pipeline's search needs Optuna: pip install 'posttrain[tune]'") from None
    from trainer_lib.runner.tune.optuna_study import run_search
    from trainer_lib.runner.tune.tune_results import RESULTS_FILE, write_results

    study = run_search(search)
    results = write_results(study, search)
    if results["best"] is None:
        raise UserError(f"{search.tune.stage} search: no trial completed (see the table above); nothing to train with")
    best = results["best"]
    best["seed"] = study.best_trial.user_attrs.get("seed")
    text = best_config(search, [read_yaml_text(config_yaml), *layers], best)
    os.makedirs(os.path.dirname(os.path.abspath(best_path)), exist_ok=True)
    with open(best_path, "w", encoding="utf-8") as fh:
        fh.write(text)
    best["config"] = best_path  # (not the best trial's own config, which write_results named)
    with open(os.path.join(search.tune.output_dir, RESULTS_FILE), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2, default=str)
    print(f"tune: best trial {best['trial']}: {results['metric']} = {best['value']:.6g}; config: {best_path}")
    return results
