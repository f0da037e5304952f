"""What the dashboard knows of a run: the files the stages already write, read back without trusting them.

A *run* is one stage's output folder: a folder holding any of :data:`MARKERS` (``metrics.jsonl`` and
``heartbeat.json`` of a training stage, ``summary.json`` of a finished model, ``metrics.json`` of an
evaluation, ``lineage.json``, a release's ``release.json``, a KFP task's ``executor_output.json``). A
root given to the dashboard (a ``runs/`` folder, a pipeline root, one stage's output, an ``s3://``
prefix) is searched for them; checkpoints and hidden folders are skipped.
Local folders are walked; URLs are listed and read through :mod:`trainer_lib.storage` (its redaction
applies to every location shown).

Nothing here raises on a damaged run: a truncated ``metrics.jsonl`` line, a missing file or a
half-written checkpoint gives what could be read plus a ``problems`` list naming what could not.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import threading
import time
from dataclasses import dataclass, field

from trainer_lib import storage
from trainer_lib.loop.heartbeat import HEARTBEAT_FILE, run_state
from trainer_lib.loop.samples import SAMPLES_FILE

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
LINEAGE_FILE = "lineage.json"
EVAL_FILE = "metrics.json"
RELEASE_FILE = "release.json"
#: what a KFP task leaves in its folder once it ran (kfp.local, and the object store's pipeline root)
TASK_FILE = "executor_output.json"
MARKERS = (METRICS_FILE, HEARTBEAT_FILE, SUMMARY_FILE, EVAL_FILE, LINEAGE_FILE, RELEASE_FILE, TASK_FILE)
#: folders never searched for runs: checkpoints, caches, TensorBoard and tracker stores
SKIPPED = re.compile(r"^(\..*|checkpoints|step-\d+|__pycache__|wandb|mlruns|per_problem|tb|logs)$")
MAX_DEPTH = 8
#: the metric shown in the run list, by stage (the first one logged is taken)
KEY_METRICS = {
    "sft": ("eval_loss", "loss"),
    "reward": ("accuracy", "loss"),
    "prm": ("accuracy", "loss"),
    "dpo": ("rewards/accuracy", "loss"),
    "grpo": ("reward",),
    "rloo": ("reward",),
    "ppo": ("reward",),
    "online-dpo": ("reward", "loss"),  # the judge's mean reward of greedy (eval) or sampled (train) completions
}


@dataclass(frozen=True)
class Root:
    """A place searched for runs: ``key`` starts the ids of the runs found there; a KFP run's root also
    names its pipeline run (``pipeline``, ``pipeline_state``)."""

    key: str
    location: str
    pipeline: str = ""
    pipeline_state: str = ""


@dataclass
class Run:
    """One stage output: ``location`` (path or URL), ``files`` it holds (names relative to it)."""

    id: str
    root: str
    location: str
    files: set[str] = field(default_factory=set)
    pipeline: str = ""  # the pipeline run it belongs to, when its root says (KFP); else the id's first folder
    pipeline_state: str = ""

    def path(self, name: str) -> str:
        return (
            storage.join(self.location, name) if storage.is_remote(self.location) else os.path.join(self.location, name)
        )

    def has(self, name: str) -> bool:
        return name in self.files


def find_runs(roots: list, problems: list[str] | None = None) -> dict[str, Run]:
    """``{id: Run}`` of every stage output under ``roots`` (paths or URLs, or :class:`Root`); an id is
    ``<root number or key>/<path under the root>``. A root that cannot be read is named in ``problems``."""
    found: dict[str, Run] = {}
    for number, given in enumerate(roots):
        top = given if isinstance(given, Root) else Root(str(number), given)
        root = top.location
        try:
            folders = list(_remote_folders(root) if storage.is_remote(root) else _local_folders(root))
        except (OSError, storage.StorageError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            (problems if problems is not None else []).append(storage.redact(f"{root}: cannot be listed ({first})"))
            continue
        for location, files in folders:
            rel = _relative(root, location)
            run_id = f"{top.key}/{rel}" if rel else top.key
            found[run_id] = Run(run_id, root, location, files, top.pipeline, top.pipeline_state)
    # a KFP task's folder is its own entry (prepare, export, deploy...) unless a stage output lies in it
    # (train/output_model): that one already shows the task
    return {
        run_id: run
        for run_id, run in found.items()
        if set(MARKERS) & run.files != {TASK_FILE} or not any(other.startswith(run_id + "/") for other in found)
    }


def _local_folders(root: str):
    root = os.path.expanduser(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no folder {root}")
    base_depth = root.rstrip(os.sep).count(os.sep)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not SKIPPED.match(d))
        if folder.count(os.sep) - base_depth >= MAX_DEPTH:
            dirs[:] = []
        names = set(files)
        if names & set(MARKERS):
            yield folder, names | _subfolder_files(folder)


def _subfolder_files(folder: str) -> set[str]:
    """An evaluation's per-problem rows and a stage's plots: the files one level down that the views read."""
    extra = set()
    per_problem = os.path.join(folder, "per_problem")
    if os.path.isdir(per_problem):
        extra |= {f"per_problem/{name}" for name in os.listdir(per_problem)}
    return extra


def _remote_folders(root: str):
    files = storage.list_files(root)
    folders: dict[str, set[str]] = {}
    for rel in files:
        parts = rel.split("/")
        if any(SKIPPED.match(part) and part != "per_problem" for part in parts[:-1]) or len(parts) > MAX_DEPTH + 1:
            continue
        if parts[-2:-1] == ["per_problem"]:
            folders.setdefault("/".join(parts[:-2]), set()).add("/".join(parts[-2:]))
        else:
            folders.setdefault("/".join(parts[:-1]), set()).add(parts[-1])
    for rel, names in sorted(folders.items()):
        if names & set(MARKERS):
            yield (storage.join(root, rel) if rel else root.rstrip("/")), names


def _relative(root: str, location: str) -> str:
    if storage.is_remote(root):
        rel = location[len(root.rstrip("/")) :].strip("/")
    else:
        rel = os.path.relpath(location, os.path.expanduser(root))
    return "" if rel in (".", "") else rel.replace(os.sep, "/")


# --------------------------------------------------------------------------- reading, tolerantly


def read_text(run: Run, name: str, problems: list[str]) -> str | None:
    if not run.has(name):
        return None
    try:
        return storage.read_text(run.path(name))
    except (OSError, storage.StorageError, ValueError, UnicodeDecodeError) as exc:
        problems.append(f"{name}: cannot be read ({storage.redact(str(exc)).splitlines()[0][:200]})")
        return None


def read_json(run: Run, name: str, problems: list[str]) -> dict | None:
    text = read_text(run, name, problems)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        problems.append(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno}); it may be half-written")
        return None
    if not isinstance(value, dict):
        problems.append(f"{name}: expected a JSON object, found {type(value).__name__}")
        return None
    return value


def parse_lines(text: str, first_line: int = 1) -> tuple[list[dict], list[int]]:
    """``(records, numbers of the lines that are not a JSON object)`` of JSON-lines text."""
    records, bad = [], []
    for number, line in enumerate(text.splitlines(), start=first_line):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad.append(number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(number)
    return records, bad


@dataclass
class _Parsed:
    inode: int
    offset: int  # bytes parsed: up to the end of the last complete line
    lines: int  # complete lines parsed
    records: list[dict]
    bad: list[int]


class LineCache:
    """Parsed JSON-lines files on this machine, read again only from where they grew: a live page polls a
    growing ``metrics.jsonl`` every 2 s, and a 100k-step run's file is tens of MiB. A file replaced (a
    resumed run rewrites it without the replayed steps) or shorter than what was parsed is read anew; a
    last line without its newline is parsed on every call and never kept (a writer may be mid-line)."""

    def __init__(self):
        self._files: dict[str, _Parsed] = {}
        self._lock = threading.Lock()

    def read(self, path: str) -> tuple[list[dict], list[int]]:
        with self._lock, open(path, "rb") as fh:
            stat = os.fstat(fh.fileno())
            entry = self._files.get(path)
            if entry is None or entry.inode != stat.st_ino or stat.st_size < entry.offset:
                entry = self._files[path] = _Parsed(stat.st_ino, 0, 0, [], [])
            fh.seek(entry.offset)
            data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]
            records, bad = parse_lines(complete.decode("utf-8", errors="replace"), entry.lines + 1)
            entry.records += records
            entry.bad += bad
            entry.offset += len(complete)
            entry.lines += complete.count(b"\n")
            tail_records, tail_bad = parse_lines(
                data[len(complete) :].decode("utf-8", errors="replace"), entry.lines + 1
            )
            return entry.records + tail_records, entry.bad + tail_bad


LINES = LineCache()


def read_jsonl(run: Run, name: str, problems: list[str]) -> list[dict]:
    """The records of a JSON-lines file; each line that is not a JSON object is skipped and named."""
    if not run.has(name):
        return []
    if storage.is_remote(run.location):
        text = read_text(run, name, problems)
        records, bad = parse_lines(text or "")
    else:
        try:
            records, bad = LINES.read(run.path(name))
        except OSError as exc:
            problems.append(f"{name}: cannot be read ({exc.strerror})")
            return []
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        problems.append(f"{name}: line {shown} is not a JSON record (truncated by a stopped writer?); skipped")
    return records


# --------------------------------------------------------------------------- what the views show


def summarize(run: Run, now: float | None = None) -> dict:
    """One row of the run list."""
    problems: list[str] = []
    heartbeat = read_json(run, HEARTBEAT_FILE, problems)
    summary = read_json(run, SUMMARY_FILE, problems)
    evaluation = read_json(run, EVAL_FILE, problems) if run.has(EVAL_FILE) else None
    lineage = read_json(run, LINEAGE_FILE, problems)
    records = read_jsonl(run, METRICS_FILE, problems)
    # a release holds a copy of its model's files, and its own release.json
    stage = "release" if run.has(RELEASE_FILE) else _stage(heartbeat, summary, lineage, evaluation)
    stage = stage or posixpath.basename(run.id)
    config = _config(heartbeat, lineage)
    train = [r for r in records if r.get("split") == "train"]
    status = run_state(heartbeat, finished=summary is not None or evaluation is not None, now=now)
    if heartbeat is None and (evaluation is not None or run.has(TASK_FILE)):
        status = "finished"  # (an evaluation's metrics.json and a task's executor output come last)
    gate = (evaluation or {}).get("gate") if isinstance((evaluation or {}).get("gate"), dict) else None
    row = {
        "id": run.id,
        "root": storage.redact(run.root),
        "location": storage.redact(run.location),
        "pipeline": run.pipeline or (run.id.split("/")[1] if run.id.count("/") >= 2 else ""),
        "pipeline_state": run.pipeline_state,
        "stage": stage,
        "model": storage.redact(str(config.get("model.path", ""))) if config else "",
        "status": status,
        "started": (heartbeat or {}).get("started") or _created(lineage),
        "updated": (heartbeat or {}).get("updated"),
        "step": (heartbeat or {}).get("step", train[-1].get("step") if train else None),
        "total_steps": (heartbeat or {}).get("total_steps", (summary or {}).get("steps")),
        "key_metric": _key_metric(stage, records) or _task_metric(read_json(run, TASK_FILE, problems)),
        "gate": None if gate is None else {"passed": gate.get("passed")},
        "has": sorted(name for name in (METRICS_FILE, SAMPLES_FILE, EVAL_FILE, LINEAGE_FILE) if run.has(name)),
        "problems": problems,
    }
    return row


def _stage(heartbeat, summary, lineage, evaluation) -> str:
    for source in (heartbeat, summary):
        if isinstance(source, dict) and isinstance(source.get("stage"), str):
            return source["stage"]
    stages = (lineage or {}).get("stages")
    if isinstance(stages, list) and stages and isinstance(stages[-1], dict):
        return str(stages[-1].get("stage", ""))
    return "evaluate" if evaluation is not None else ""


def _config(heartbeat, lineage) -> dict:
    if isinstance(heartbeat, dict) and isinstance(heartbeat.get("config"), dict) and heartbeat["config"]:
        return heartbeat["config"]
    stages = (lineage or {}).get("stages")
    if isinstance(stages, list) and stages and isinstance(stages[-1], dict):
        config = stages[-1].get("config")
        return config if isinstance(config, dict) else {}
    return {}


def _created(lineage) -> float | None:
    stages = (lineage or {}).get("stages")
    if isinstance(stages, list) and stages and isinstance(stages[-1], dict):
        try:
            return time.mktime(time.strptime(stages[-1].get("created", ""), "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
        except (TypeError, ValueError):
            return None
    return None


def task_outputs(executor_output: dict | None) -> list[dict]:
    """A KFP task's outputs from its ``executor_output.json``: ``{"name", "uri", "metadata"}`` per artifact
    and ``{"name", "value"}`` per output parameter."""
    outputs: list[dict] = []
    for name, value in ((executor_output or {}).get("artifacts") or {}).items():
        for artifact in (value or {}).get("artifacts") or []:
            if isinstance(artifact, dict):
                outputs.append(
                    {
                        "name": name,
                        "uri": storage.redact(str(artifact.get("uri", ""))),
                        "metadata": artifact.get("metadata") or {},
                    }
                )
    for name, value in ((executor_output or {}).get("parameterValues") or {}).items():
        outputs.append({"name": name, "value": value})
    return outputs


def _task_metric(executor_output: dict | None) -> dict | None:
    """The first number a task's ``metrics`` artifact holds (prepare: rows read)."""
    for output in task_outputs(executor_output):
        if output["name"] == "metrics":
            for key, value in output["metadata"].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return {"name": key, "split": "task", "value": value}
    return None


def _key_metric(stage: str, records: list[dict]) -> dict | None:
    for name in KEY_METRICS.get(stage, ("loss",)):
        for split in ("eval", "train"):
            values = [r[name] for r in records if r.get("split") == split and isinstance(r.get(name), (int, float))]
            if values:
                return {"name": name, "split": split, "value": values[-1]}
    return None


#: train records a page draws at most (a longer run is thinned evenly; its eval records are all kept)
MAX_POINTS = 5000


def thinned(records: list[dict], limit: int = MAX_POINTS) -> tuple[list[dict], int]:
    """``(records, stride)``: every ``stride``-th train record (and the last), all other records."""
    train = [i for i, record in enumerate(records) if record.get("split") == "train"]
    if len(train) <= limit:
        return records, 1
    stride = math.ceil(len(train) / limit)
    keep = set(train[::stride]) | {train[-1]}
    return [r for i, r in enumerate(records) if r.get("split") != "train" or i in keep], stride


def detail(run: Run, now: float | None = None) -> dict:
    """One run's page: its list row, metric records, config, summary, lineage and the problems met."""
    problems: list[str] = []
    row = summarize(run, now)
    heartbeat = read_json(run, HEARTBEAT_FILE, [])
    lineage = read_json(run, LINEAGE_FILE, [])
    release = read_json(run, RELEASE_FILE, problems)  # (before the problems are listed: its own are among them)
    return {
        **row,
        "problems": row["problems"] + problems,
        **_metrics_view(read_jsonl(run, METRICS_FILE, [])),
        "config": _config(heartbeat, lineage),
        "summary": read_json(run, SUMMARY_FILE, []),
        "lineage": lineage,
        "evaluation": evaluation(run) if run.has(EVAL_FILE) else None,
        "release": release,
        "task_outputs": task_outputs(read_json(run, TASK_FILE, [])),
        "checkpoints": _checkpoint_note(run),
    }


def _metrics_view(records: list[dict]) -> dict:
    shown, stride = thinned(records)
    return {"metrics": shown, "metrics_count": len(records), "metrics_stride": stride}


def metrics_after(run: Run, after: int) -> dict:
    """Records past the first ``after`` ones (a live page asks for what is new), and the run's status."""
    problems: list[str] = []
    records = read_jsonl(run, METRICS_FILE, problems)
    row = summarize(run)
    return {"records": records[after:], "count": len(records), "status": row["status"], "step": row["step"]}


def samples(run: Run, *, min_reward=None, max_reward=None, step=None, limit: int = 200) -> dict:
    """Logged samples, newest step first, optionally those with a reward (a DPO pair: its margin) in a range."""
    problems: list[str] = []
    rows = [r for r in read_jsonl(run, SAMPLES_FILE, problems) if r.get("kind") in ("rollout", "pair")]

    def score(row):
        value = row.get("reward") if row.get("kind") == "rollout" else row.get("margin")
        return value if isinstance(value, (int, float)) else None

    if step is not None:
        rows = [r for r in rows if r.get("step") == step]
    if min_reward is not None:
        rows = [r for r in rows if score(r) is not None and score(r) >= min_reward]
    if max_reward is not None:
        rows = [r for r in rows if score(r) is not None and score(r) <= max_reward]
    steps = sorted({r.get("step") for r in rows if isinstance(r.get("step"), int)}, reverse=True)
    rows.sort(key=lambda r: -(r.get("step") if isinstance(r.get("step"), int) else 0))
    return {"rows": rows[:limit], "total": len(rows), "steps": steps, "problems": problems}


def evaluation(run: Run) -> dict:
    """An evaluation's metrics table, gate and per-problem rows (the generated text included)."""
    problems: list[str] = []
    metrics = read_json(run, EVAL_FILE, problems) or {}
    per_problem = {}
    for name in sorted(f for f in run.files if f.startswith("per_problem/") and f.endswith(".jsonl")):
        per_problem[posixpath.basename(name)[: -len(".jsonl")]] = read_jsonl(run, name, problems)[:500]
    return {
        "models": metrics.get("models", {}),
        "candidate": metrics.get("candidate"),
        "baseline": metrics.get("baseline"),
        "gate": metrics.get("gate"),
        "paths": metrics.get("paths", {}),
        "per_problem": per_problem,
        "plots": sorted(f for f in run.files if f.endswith(".png")),
        "report": run.has("report.html"),
        "problems": problems,
    }


def _checkpoint_note(run: Run) -> list[str]:
    """Checkpoints of a local run without their COMPLETE marker (half-written, skipped on resume)."""
    if storage.is_remote(run.location):
        return []
    folder = os.path.join(run.location, "checkpoints")
    if not os.path.isdir(folder):
        return []
    notes = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("step-") and not os.path.exists(os.path.join(folder, name, "COMPLETE")):
            notes.append(f"checkpoints/{name}: no COMPLETE marker (half-written; a resume skips it)")
    return notes


def config_differences(configs: dict[str, dict]) -> list[dict]:
    """``[{"key", "values": {run id: value}}]`` for every key whose value differs between the runs."""
    keys = sorted({key for config in configs.values() for key in config})
    out = []
    for key in keys:
        values = {run_id: config.get(key) for run_id, config in configs.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            out.append({"key": key, "values": values})
    return out
