"""Metrics to ``metrics.jsonl`` and to the trackers in ``report_to``, plus a progress bar; rank 0 only.

``metrics.jsonl`` holds one JSON object per logging event (``{"step": 10, "split": "train",
"loss": ...}``); the evaluation report and the KFP components read it back, so it is always
written. ``report_to`` adds TensorBoard (the default), MLflow (``MLFLOW_TRACKING_URI``, else a
SQLite store at ``<output_dir>/mlflow.db``; experiment ``$MLFLOW_EXPERIMENT_NAME`` or
``posttrain``) and W&B (offline, under ``<output_dir>/wandb``); those get the run's config as
parameters and every numeric metric as ``<split>/<name>``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import time
from typing import Any

from trainer_lib.errors import UserError

MLFLOW_RUN_FILE = "mlflow_run_id"


def check_reporters(report_to: list[str] | tuple[str, ...]) -> None:
    """A UserError for a tracker whose package is missing, raised on every rank before training."""
    needs = {
        "mlflow": ("mlflow", "pip install 'posttrain[tracking]'"),
        "wandb": ("wandb", "pip install wandb; W&B runs offline, sync them with `wandb sync`"),
    }
    for name in report_to:
        if name in needs and importlib.util.find_spec(needs[name][0]) is None:
            raise UserError(
                f"report_to: {name} needs the {needs[name][0]} package, which is not installed ({needs[name][1]})"
            )
    if (
        "mlflow" in report_to
        and not os.environ.get("MLFLOW_TRACKING_URI")
        and importlib.util.find_spec("sqlalchemy") is None
    ):
        raise UserError(
            "report_to: mlflow's default local store (sqlite) needs sqlalchemy and alembic "
            "(pip install 'posttrain[tracking]'), or set MLFLOW_TRACKING_URI"
        )


class Tracker:
    def __init__(
        self,
        log_dir: str,
        enabled: bool = True,
        total_steps: int = 0,
        initial_step: int = 0,
        desc: str = "train",
        report_to: list[str] | tuple[str, ...] = ("tensorboard",),
        params: dict[str, Any] | None = None,
    ):
        """``params`` (the run's flat config) go to MLflow and W&B; ``initial_step`` > 0 continues a
        resumed run (MLflow: the same run, when this output dir recorded one)."""
        self.enabled = enabled
        self.log_dir = log_dir
        self._sinks: list[Any] = []
        self._bar = None
        self._start = time.time()
        if not enabled:
            return
        os.makedirs(log_dir, exist_ok=True)
        truncate_after(os.path.join(log_dir, "metrics.jsonl"), initial_step)
        self._file = open(os.path.join(log_dir, "metrics.jsonl"), "a", encoding="utf-8")
        run_name = f"{desc}-{os.path.basename(os.path.normpath(log_dir))}"
        if "tensorboard" in report_to:
            try:
                self._sinks.append(_TensorBoard(log_dir))
            except ImportError:  # tensorboard is optional at run time
                pass
        if "mlflow" in report_to:
            self._sinks.append(_MLflow(log_dir, run_name, params or {}, resume=initial_step > 0))
        if "wandb" in report_to:
            self._sinks.append(_WandB(log_dir, run_name, params or {}))
        if total_steps:
            import sys

            from tqdm.auto import tqdm

            # In pod logs (no terminal) a bar redraw is a new line: redraw rarely there.
            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                desc=desc,
                dynamic_ncols=True,
                mininterval=0.1 if sys.stderr.isatty() else 30.0,
                disable=os.environ.get("POSTTRAIN_NO_PROGRESS") == "1",
            )

    def log(self, step: int, metrics: dict[str, Any], split: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: _plain(v) for k, v in metrics.items()}
        record = {"step": step, "split": split, "time": round(time.time() - self._start, 3), **clean}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        numbers = {
            f"{split}/{k}": float(v) for k, v in clean.items() if isinstance(v, (int, float)) and math.isfinite(v)
        }
        for sink in self._sinks:
            sink.log(step, numbers)
        if self._bar is not None and split == "train":
            self._bar.set_postfix(
                {
                    k: f"{v:.4g}"
                    for k, v in clean.items()
                    if isinstance(v, float) and k in ("loss", "reward", "lr", "kl")
                },
                refresh=False,
            )

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        for sink in self._sinks:
            sink.close()
        self._file.close()


# --------------------------------------------------------------------------- trackers
# Each takes ``log(step, {"<split>/<name>": float})`` and ``close()``.


class _TensorBoard:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(log_dir, "tensorboard"))

    def log(self, step: int, numbers: dict) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    """One MLflow run through ``MlflowClient`` (no process-wide fluent state)."""

    _BAD_CHARS = re.compile(r"[^\w\-. /]")  # what MLflow allows in metric and param names

    def __init__(self, log_dir: str, run_name: str, params: dict, resume: bool):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.abspath(log_dir)}/mlflow.db"
        self.client = MlflowClient(tracking_uri=uri)
        run_file = os.path.join(log_dir, MLFLOW_RUN_FILE)
        if resume and os.path.exists(run_file):
            with open(run_file, encoding="utf-8") as fh:
                self.run_id = fh.read().strip()
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "posttrain")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        with open(run_file, "w", encoding="utf-8") as fh:
            fh.write(self.run_id)
        items = [Param(self._key(k), str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def _key(self, key: str) -> str:
        return self._BAD_CHARS.sub("_", key)

    def log(self, step: int, numbers: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(self._key(k), v, now, step) for k, v in numbers.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class _WandB:
    """A W&B run in offline mode (``wandb sync`` uploads it later, from anywhere)."""

    def __init__(self, log_dir: str, run_name: str, params: dict):
        import wandb

        self.run = wandb.init(
            mode="offline",
            dir=log_dir,
            project=os.environ.get("WANDB_PROJECT", "posttrain"),
            name=run_name,
            config=params,
        )

    def log(self, step: int, numbers: dict) -> None:
        self.run.log(numbers, step=step)

    def close(self) -> None:
        self.run.finish()


def truncate_after(path: str, step: int) -> None:
    """A resumed run replays the steps after its checkpoint: drop the records of ``path`` (a JSON-lines file
    of ``{"step": ...}`` records) after ``step``."""
    if not os.path.exists(path):
        return
    kept = [r for r in read_metrics(path) if step > 0 and r.get("step", 0) <= step]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def read_metrics(path: str) -> list[dict]:
    """Records of a ``metrics.jsonl`` file (or of ``<dir>/metrics.jsonl``)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
