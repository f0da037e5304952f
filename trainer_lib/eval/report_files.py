"""The files of an evaluation's ``output_dir`` (written by rank 0), and the training logs it plots.

metrics.json    the result: models' metrics, candidate, baseline, gate, judge, data, ...
report.html     :func:`trainer_lib.eval.report.render_html`
summary.md      :func:`trainer_lib.eval.report.render_markdown`
per_problem/    <label>_<set>.jsonl for every model and eval set
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from trainer_lib import storage


def read_run(path: str) -> list[dict]:
    """The ``metrics.jsonl`` records of a training run directory (local or URL); [] when it has none."""
    from trainer_lib.loop.tracking import read_metrics

    if storage.is_remote(path):
        file = storage.join(path, "metrics.jsonl")
        text = storage.read_text(file) if storage.exists(file) else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return read_metrics(path) if os.path.isdir(os.path.expanduser(path)) else []


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write_report(
    output_dir: str,
    result: dict,
    per_problem: dict[str, dict[str, list[dict]]],
    curves: dict[str, list[dict]],
    samples_per_model: int,
) -> None:
    """per_problem/<label>_<set>.jsonl, metrics.json (``result``), report.html and summary.md in
    ``output_dir`` (local, or a URL the files are uploaded to)."""
    from trainer_lib.eval import report

    remote = storage.is_remote(output_dir)
    out = tempfile.mkdtemp(prefix="posttrain-eval-") if remote else os.path.expanduser(output_dir)
    os.makedirs(os.path.join(out, "per_problem"), exist_ok=True)
    for label, sets in per_problem.items():
        for name, rows in sets.items():
            write_jsonl(os.path.join(out, "per_problem", f"{label}_{name}.jsonl"), rows)
    with open(os.path.join(out, "metrics.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    with open(os.path.join(out, "report.html"), "w", encoding="utf-8") as fh:
        fh.write(report.render_html(result, curves, report.sample_sections(per_problem, samples_per_model)))
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(report.render_markdown(result))
    if remote:
        storage.upload_dir(out, output_dir)
        shutil.rmtree(out, ignore_errors=True)
