"""The objective from an evaluate run on each trial's model: the search file's ``evaluate:`` section.

    evaluate:                          # keys of posttrain evaluate, nested or dotted
      tasks.path: data/code_tasks_eval.jsonl
      humaneval.enabled: false
    objective: {metric: task_pass_rate, direction: maximize}
    pruner: {metric: logps/accuracy}   # optional: the stage's eval metric the pruner reads while it trains

After a trial's stage exits 0, the search runs ``posttrain evaluate --config <trial>/evaluate/config.yaml``
as a process of its own (a :class:`~trainer_lib.runner.tune.trial_process.TrialProcess`, in a process
group carrying the trial's mark, so a search killed mid-evaluate leaves nothing running and retries the
trial), with ``models=trial=<trial dir>`` and ``output_dir=<trial dir>/evaluate``; the trial's value is
``models.trial.<metric>`` of that run's ``metrics.json``. The metric must be one these settings compute
(:func:`trainer_lib.stages.lifecycle.evaluate.computed_metrics`), checked before any trial.
"""

from __future__ import annotations

import json
import os
import sys

from trainer_lib.errors import ConfigError
from trainer_lib.runner.stage_api import config_text, stage_config

EVALUATE_DIR = "evaluate"
LABEL = "trial"
METRICS = "metrics.json"
#: Keys the search sets itself: the trial's model and where its evaluation goes.
SET_BY_SEARCH = ("models", "output_dir", "candidate", "baseline", "training_runs")


def evaluate_config(tune, trial_dir: str):
    """The evaluate stage's config for the model in ``trial_dir``."""
    layers = [tune.evaluate, {"models": [f"{LABEL}={trial_dir}"], "output_dir": os.path.join(trial_dir, EVALUATE_DIR)}]
    return stage_config("evaluate", layers)


def check_evaluate(tune) -> None:
    """Refuse, in one line naming it, an ``evaluate`` section evaluate would refuse, or an objective it
    cannot compute."""
    from trainer_lib.stages.lifecycle.evaluate import computed_metrics

    for key in tune.evaluate:
        if key.split(".")[0] in SET_BY_SEARCH:
            raise ConfigError(f"evaluate.{key}: set by the search (the trial's model and folder); leave it out")
    try:
        cfg = evaluate_config(tune, os.path.join(os.path.abspath(tune.output_dir), "trials", "check"))
    except ConfigError as exc:
        raise ConfigError(f"evaluate: {exc}") from None
    names = computed_metrics(cfg)
    if tune.objective.metric not in names:
        raise ConfigError(
            f"objective.metric: {tune.objective.metric} is not a metric of this evaluate run; "
            f"it computes {', '.join(names)}"
        )


def write_evaluate_config(tune, trial_dir: str) -> str:
    """Write ``<trial_dir>/evaluate/config.yaml`` and clear what an earlier run of this trial left."""
    out = os.path.join(trial_dir, EVALUATE_DIR)
    os.makedirs(out, exist_ok=True)
    stale = os.path.join(out, METRICS)
    if os.path.exists(stale):
        os.remove(stale)
    path = os.path.join(out, "config.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(config_text(evaluate_config(tune, trial_dir)))
    return path


def evaluate_command(config_path: str) -> list[str]:
    return [sys.executable, "-m", "trainer_lib.cli", "evaluate", "--config", config_path]


def evaluated_value(trial_dir: str, metric: str):
    """``models.trial.<metric>`` of the trial's evaluate run (None when it has none)."""
    with open(os.path.join(trial_dir, EVALUATE_DIR, METRICS), encoding="utf-8") as fh:
        return (json.load(fh).get("models") or {}).get(LABEL, {}).get(metric)
