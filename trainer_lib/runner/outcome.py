"""What a finished stage leaves for its caller to report: read from its output directory, in plain values.

* :func:`trained_model`: a training stage's model, described (parameter count and the summary keys
  that say what it is), the metrics to log, and its TensorBoard event files moved out of the model.
* :func:`evaluation`: an evaluation's gate decision and the metrics a UI shows, its report copied out.

The KFP components put these on their artifacts; nothing here knows of KFP.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

#: The summary keys that describe a trained model (its artifact's metadata); a reward model's stats are
#: read from the summary's ``reward_stats``.
DESCRIBING = ("stage", "steps", "loss", "advantage", "kl_coef", "reference", "reward_mean", "reward_std")
#: Where a training stage writes its TensorBoard event files, inside its output directory.
TENSORBOARD_DIR = "tensorboard"


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    parameters: int  # the saved model's parameter count (0 when it cannot be read here)
    metadata: dict  # parameters and the DESCRIBING keys of the summary
    metrics: dict  # the summary, with the last logged train record under "train"


@dataclasses.dataclass(frozen=True)
class Evaluation:
    gate_passed: bool
    metrics: dict[str, float]  # flat ``<label>_<metric>`` names and gate_passed (trainer_lib.eval.report)


def last_logged(output_dir: str, split: str = "train") -> dict:
    """The last ``metrics.jsonl`` record of ``split`` a training stage wrote (without step/time)."""
    path = os.path.join(output_dir, "metrics.jsonl")
    record: dict = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line) if line.strip() else {}
                if row.get("split") == split:
                    record = row
    return {k: v for k, v in record.items() if k not in ("step", "split", "time")}


def move_tensorboard(model_dir: str, tensorboard_dir: str) -> None:
    """Move the run's TensorBoard event files out of the model into ``tensorboard_dir`` (created; left empty
    when the run wrote none), so the model holds only the model and a TensorBoard opens the other."""
    events = os.path.join(model_dir, TENSORBOARD_DIR)
    os.makedirs(tensorboard_dir, exist_ok=True)
    if os.path.isdir(events):
        for name in os.listdir(events):
            shutil.move(os.path.join(events, name), os.path.join(tensorboard_dir, name))
        os.rmdir(events)


def trained_model(summary: dict, model_dir: str, tensorboard_dir: str) -> TrainedModel:
    """What a training stage left in ``model_dir`` with its ``summary``: its event files moved to
    ``tensorboard_dir`` first, then the model described and the metrics to log."""
    from trainer_lib.models.save import saved_parameters

    move_tensorboard(model_dir, tensorboard_dir)
    parameters = saved_parameters(model_dir)
    described = {**summary, **summary.get("reward_stats", {})}  # reward models: their mean and std too
    metadata = {"parameters": parameters, **{k: v for k, v in described.items() if k in DESCRIBING}}
    metrics = {**summary, "train": last_logged(model_dir, "train")}
    return TrainedModel(parameters, metadata, metrics)


def evaluation(results_dir: str, report_path: str, summary_path: str) -> Evaluation:
    """The gate and the UI's metrics of the evaluation in ``results_dir`` (its ``metrics.json``); its HTML
    report and Markdown summary are copied to ``report_path`` and ``summary_path``."""
    from trainer_lib.eval.report import ui_metrics

    with open(os.path.join(results_dir, "metrics.json"), encoding="utf-8") as fh:
        result = json.load(fh)
    shutil.copy(os.path.join(results_dir, "report.html"), report_path)
    shutil.copy(os.path.join(results_dir, "summary.md"), summary_path)
    return Evaluation(bool(result["gate"]["passed"]), ui_metrics(result))
