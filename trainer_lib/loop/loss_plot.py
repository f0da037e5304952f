"""``loss_plot: true``: the loss curves LLaMA-Factory's ``plot_loss`` draws, as PNG files in output_dir.

At the end of a training stage rank 0 reads ``metrics.jsonl`` back and draws, for each loss that was
logged, its raw curve (faint) with a smoothed one over it:

    training_loss.png         train ``loss`` (PPO, which logs no ``loss``: ``training_policy_loss.png``,
                              ``training_value_loss.png``)
    training_eval_loss.png    eval ``loss``, when the stage had eval data
    training_reward.png       ``reward`` of the RL stages (``training_eval_reward.png``: on eval prompts)

The names are LLaMA-Factory's (``training_<key>.png``, ``eval_loss`` for the eval curve). matplotlib is
imported only here, when a plot is drawn, and draws with its Agg renderer: no display is needed.
"""

from __future__ import annotations

import io
import json
import math

from trainer_lib import storage

METRICS_FILE = "metrics.jsonl"


def plotted(key: str) -> bool:
    """Whether a logged metric gets a plot: the losses, and the RL stages' reward."""
    return key == "loss" or key.endswith("_loss") or key == "reward"


def smooth(values: list[float]) -> list[float]:
    """An exponential moving average whose weight grows with the number of points, as LLaMA-Factory's
    plots (and TensorBoard's slider) smooth: ``s_i = w * s_{i-1} + (1 - w) * x_i``, ``s_0 = x_0``, with
    ``w = 1.8 * (sigmoid(0.05 * n) - 0.5)`` for ``n`` points, so 10 points are barely smoothed (w = 0.22)
    and 200 heavily (w = 0.90)."""
    if not values:
        return []
    weight = 1.8 * (1.0 / (1.0 + math.exp(-0.05 * len(values))) - 0.5)
    out, last = [], values[0]
    for value in values:
        last = weight * last + (1.0 - weight) * value
        out.append(last)
    return out


def curves(records: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """``{file stem: (steps, values)}`` of every plotted metric in ``records`` (metrics.jsonl's rows):
    ``loss`` of the train split is ``loss``, of the eval split ``eval_loss``. Non-finite values and
    values of other types are left out."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        split = record.get("split", "train")
        if split not in ("train", "eval") or "step" not in record:
            continue
        for key, value in record.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not (number and plotted(key)):
                continue
            stem = (key if split == "train" else f"eval_{key}").replace("/", "_")
            steps, values = out.setdefault(stem, ([], []))
            steps.append(int(record["step"]))
            values.append(float(value))
    return out


def draw(steps: list[int], values: list[float], name: str) -> bytes:
    """One PNG: the raw curve and the smoothed one over it, against the optimizer step."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.subplots()
    marker = "o" if len(values) < 20 else None  # a short (eval) curve: show where the points are
    ax.plot(steps, values, color="#1f77b4", alpha=0.4, marker=marker, markersize=3, label="original")
    ax.plot(steps, smooth(values), color="#1f77b4", label="smoothed")
    ax.set_title(f"training {name}")
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def write_loss_plots(log_dir: str) -> list[str]:
    """Draw ``training_<name>.png`` into ``log_dir`` (a local directory or URL) for every curve in its
    metrics.jsonl; returns the file names written (none when no loss was logged). Each file is written
    whole or not at all (:func:`trainer_lib.storage.write_bytes`)."""
    path = storage.join(log_dir, METRICS_FILE)
    if not storage.exists(path):
        return []
    records = [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]
    written = []
    for name, (steps, values) in sorted(curves(records).items()):
        file_name = f"training_{name}.png"
        storage.write_bytes(storage.join(log_dir, file_name), draw(steps, values, name))
        written.append(file_name)
    return written
