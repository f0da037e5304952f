"""``posttrain tune-trial --metric NAME --output-dir DIR -- posttrain <stage> ...``: one Katib trial.

It runs the stage (a :class:`~trainer_lib.runner.tune.trial_process.TrialProcess` in a process group of
its own, printing to this process's output), follows the eval records the stage writes to
``metrics.jsonl`` (in ``DIR``, or its local staging folder when ``DIR`` is an object store), and prints
each eval's value of each ``--metric`` as Katib's StdOut collector reads it::

    2026-06-22T21:07:21.123456+00:00 posttrain-metric logps/accuracy=0.8125

(an RFC 3339 time, then the line :data:`~trainer_lib.runner.tune.katib_experiment.METRICS_FORMAT`
matches). The step-0 eval, the starting model's, is left out, as the local pruner leaves it out; after a
stage that exits 0 the held-out figure of its ``summary.json`` is printed last, and Katib keeps that
latest value as the trial's objective. SIGTERM (Katib's early stopping, a deleted trial) kills the
stage's process group; the exit status is the stage's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import signal
import sys

from trainer_lib.engine.checkpoint import SUMMARY, staging_dir
from trainer_lib.errors import UserError
from trainer_lib.runner.tune.katib_experiment import METRIC_MARK
from trainer_lib.runner.tune.search_config import metric_key
from trainer_lib.runner.tune.trial_process import TrialProcess, kill_group


def metric_line(name: str, value) -> str | None:
    """The line Katib's collector reads for one value (None for a value that is not a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    return f"{now} {METRIC_MARK} {name}={float(value)!r}"


def say(lines: list[str | None]) -> None:
    for line in lines:
        if line:
            print(line, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="posttrain tune-trial",
        description="Run one Katib trial's stage and print its eval metrics for Katib's StdOut collector.",
    )
    parser.add_argument("--metric", action="append", required=True, help="A held-out metric to print (repeat).")
    parser.add_argument("--output-dir", required=True, help="The stage's output_dir.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the stage's command.")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UserError("posttrain tune-trial: expected -- and the stage's command")
    local = staging_dir(args.output_dir)
    process = TrialProcess(command, local, marker=args.output_dir, log_to_file=False)

    def stop(signum, frame) -> None:
        kill_group(process.pgid)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

    def on_eval(step: int, record: dict) -> bool:
        if step > 0:
            say([metric_line(name, record.get(metric_key(name))) for name in args.metric])
        return False

    outcome = process.follow(on_eval, poll_s=1.0)
    if outcome.returncode != 0:
        print(f"tune-trial: the stage failed: {outcome.reason}", file=sys.stderr, flush=True)
        return outcome.returncode or 1
    try:
        with open(os.path.join(local, SUMMARY), encoding="utf-8") as fh:
            held_out = json.load(fh).get("eval") or {}
    except FileNotFoundError:  # not the node where rank 0 ran
        return 0
    say([metric_line(name, held_out.get(metric_key(name))) for name in args.metric])
    return 0
