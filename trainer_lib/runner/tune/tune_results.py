"""What a search leaves in its output folder: the table of trials, the best config, ``report.html``.

* ``best.yaml``: the best trial's whole stage config (its values and seed) with ``output_dir`` set to
  ``<output_dir>/best``, which ``posttrain <stage> --config best.yaml`` runs again;
* ``results.json``: the best trial and every trial's state, value, values and reason;
* ``report.html``: one static page, no script: the objective over the trials (a matplotlib PNG, as the
  evaluation report draws its charts), the parameter importances Optuna computes
  (:func:`optuna.importance.get_param_importances`, fANOVA) and the table of trials. Optuna's own
  plots need plotly, which this project does not install.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os

import yaml

from trainer_lib.runner.tune.search_config import Search

BEST_FILE, RESULTS_FILE, REPORT_FILE = "best.yaml", "results.json", "report.html"


def state_of(trial) -> str:
    """complete, pruned, failed (with its reason), interrupted (failed without one: its search died while it
    ran, and it is run again), running or waiting."""
    name = trial.state.name.lower()
    if name == "fail":
        return "failed" if "failure" in trial.user_attrs else "interrupted"
    return name


def trial_rows(study) -> list[dict]:
    rows = []
    for trial in study.get_trials():
        attrs = trial.user_attrs
        rows.append(
            {
                "number": trial.number,
                "state": state_of(trial),
                "value": trial.value,
                "params": dict(trial.params),
                "seed": attrs.get("seed"),
                "pruned_at": attrs.get("pruned_at"),
                "retry_of": trial.system_attrs.get("failed_trial"),
                "reason": attrs.get("failure", ""),
                "output_dir": attrs.get("output_dir"),
            }
        )
    return rows


def shown(value) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def outcome_text(row: dict) -> str:
    if row["state"] == "pruned":
        return f"pruned at step {row['pruned_at']}"
    if row["state"] == "interrupted":
        return row["reason"] or "its search stopped while it ran; run again"
    return row["reason"] if row["state"] == "failed" else ""


def table(rows: list[dict], metric: str) -> str:
    """The trials as a plain text table: number, state, objective, each searched key, what happened."""
    keys = sorted({key for row in rows for key in row["params"]})
    header = ["trial", "state", metric, *keys, "note"]
    lines = [
        [
            str(row["number"]) + (f" (retry of {row['retry_of']})" if row["retry_of"] is not None else ""),
            row["state"],
            shown(row["value"]),
            *(shown(row["params"].get(key)) for key in keys),
            outcome_text(row)[:100],
        ]
        for row in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *lines])


def best_trial(study):
    """The best complete trial, or None."""
    try:
        return study.best_trial
    except ValueError:
        return None


def write_best(search: Search, best, out: str) -> str:
    """``best.yaml``: the best trial's config, its ``output_dir`` moved to ``<out>/best``."""
    with open(best.user_attrs["config"], encoding="utf-8") as fh:
        values = yaml.safe_load(fh)
    values["output_dir"] = os.path.abspath(os.path.join(out, "best"))
    tune = search.tune
    head = (
        f"# The best of {tune.study_name}'s trials: trial {best.number}, {tune.objective.metric} = {best.value:.6g}\n"
        f"# ({', '.join(f'{k}={v}' for k, v in best.params.items())}, seed {best.user_attrs.get('seed')}).\n"
        f"# Run it again: posttrain {tune.stage} --config {BEST_FILE}\n"
    )
    path = os.path.join(out, BEST_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(head + yaml.safe_dump(values, sort_keys=False, width=1 << 30))
    return path


def importances(study) -> dict[str, float] | str:
    """Optuna's parameter importances (they sum to 1), or why there are none."""
    import optuna

    complete = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    if len(complete) < 2:
        return "fewer than 2 complete trials"
    try:
        return optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as exc:
        return f"not computed: {exc}"


def history_png(rows: list[dict], metric: str, direction: str) -> str | None:
    """The objective of each complete trial and the best so far, as a base64 PNG (None: no value yet)."""
    points = [(row["number"], row["value"]) for row in rows if row["state"] == "complete"]
    if not points:
        return None
    from matplotlib.figure import Figure

    best, running = [], None
    for _, value in points:
        better = running is None or (value > running if direction == "maximize" else value < running)
        running = value if better else running
        best.append(running)
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    ax.plot([n for n, _ in points], [v for _, v in points], "o", color="#1f77b4", label="trial")
    ax.step([n for n, _ in points], best, where="post", color="#d62728", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("optimization history")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def render_html(search: Search, rows: list[dict], best, weights: dict | str) -> str:
    tune, e = search.tune, html.escape
    metric = tune.objective.metric
    png = history_png(rows, metric, tune.objective.direction)
    counts = {state: sum(row["state"] == state for row in rows) for state in dict.fromkeys(r["state"] for r in rows)}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    best_text = (
        f"trial {best.number}: {e(metric)} = {best.value:.6g} with "
        + ", ".join(f"<code>{e(k)}={e(shown(v))}</code>" for k, v in best.params.items())
        if best
        else "no trial finished"
    )
    if isinstance(weights, dict):
        bars = "".join(
            f"<tr><td><code>{e(k)}</code></td><td>{w:.3f}</td>"
            f'<td><div style="background:#1f77b4;height:10px;width:{300 * w:.0f}px"></div></td></tr>'
            for k, w in weights.items()
        )
        importance = f"<table><tr><th>key</th><th>importance</th><th></th></tr>{bars}</table>"
    else:
        importance = f"<p>{e(weights)}</p>"
    keys = sorted({key for row in rows for key in row["params"]})
    head = "".join(f"<th>{e(h)}</th>" for h in ["trial", "state", metric, *keys, "note"])
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{e(cell)}</td>"
            for cell in [str(r["number"]), r["state"], shown(r["value"]), *(shown(r["params"].get(k)) for k in keys)]
        )
        + f"<td>{e(outcome_text(r))}</td></tr>"
        for r in rows
    )
    chart = f'<img alt="optimization history" src="data:image/png;base64,{png}">' if png else ""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>posttrain tune: {e(tune.stage)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left}"
        "tr:nth-child(even){background:#f4f4f4}</style></head><body>"
        f"<h1>posttrain tune: {e(tune.stage)}, {e(tune.objective.direction)} {e(metric)}</h1>"
        f"<p>{len(rows)} trials: {e(summary)}. Best: {best_text}.</p>{chart}"
        f"<h2>Parameter importances</h2>{importance}"
        f"<h2>Trials</h2><table><tr>{head}</tr>{body}</table></body></html>"
    )


def write_results(study, search: Search) -> dict:
    """Print the table of trials and write best.yaml, results.json and report.html; returns results.json's
    content."""
    out = search.tune.output_dir
    rows = trial_rows(study)
    best = best_trial(study)
    print(table(rows, search.tune.objective.metric), flush=True)
    weights = importances(study)
    results = {
        "stage": search.tune.stage,
        "metric": search.tune.objective.metric,
        "direction": search.tune.objective.direction,
        "best": None
        if best is None
        else {
            "trial": best.number,
            "value": best.value,
            "params": best.params,
            "config": write_best(search, best, out),
        },
        "importances": weights if isinstance(weights, dict) else {},
        "trials": rows,
    }
    with open(os.path.join(out, RESULTS_FILE), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2, default=str)
    with open(os.path.join(out, REPORT_FILE), "w", encoding="utf-8") as fh:
        fh.write(render_html(search, rows, best, weights))
    return results
