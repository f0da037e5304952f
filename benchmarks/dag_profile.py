"""Each task's wall time and peak memory in a local DAG run (``posttrain pipeline run`` under kfp.local).

    python -m benchmarks.dag_profile --out runs/real/profile.json -- posttrain pipeline run --pipeline ...

Runs the command, passing its output through, and meanwhile samples the resident memory of its whole
process tree twice a second (psutil). kfp.local runs one task at a time and logs ``Executing task
'NAME'`` and ``Task 'NAME' finished with status ...``; each task's figures are its span between those
lines and the largest tree RSS sampled within it (the command's own process, about 0.4 GiB of kfp and
the DAG, is counted too: it is what the machine holds). Prints a Markdown table and writes the figures
as JSON. Exits with the command's status.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"Executing task '([^']+)'")
FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")


def tree_rss(pid: int) -> int:
    """Bytes resident in process ``pid`` and all its descendants now (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass  # ended between the listing and the reading
    return total


def sample(pid: int, samples: list, done: threading.Event, every: float = 0.5) -> None:
    while not done.is_set():
        samples.append((time.monotonic(), tree_rss(pid)))
        done.wait(every)


def profile(command: list[str]) -> tuple[int, list[dict]]:
    """(exit status, one record per task: name, status, seconds, peak_rss_gib)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    samples: list = []
    done = threading.Event()
    sampler = threading.Thread(target=sample, args=(proc.pid, samples, done), daemon=True)
    sampler.start()
    starts, tasks = {}, []
    for line in proc.stdout:
        sys.stdout.write(line)
        plain, now = ANSI.sub("", line), time.monotonic()
        if match := STARTED.search(plain):
            starts[match.group(1)] = now
        elif (match := FINISHED.search(plain)) and match.group(1) in starts:
            tasks.append({"task": match.group(1), "status": match.group(2), "start": starts.pop(match.group(1))})
            tasks[-1]["end"] = now
    code = proc.wait()
    done.set()
    sampler.join()
    for task in tasks:
        inside = [rss for at, rss in samples if task["start"] <= at <= task["end"]]
        task["seconds"] = round(task["end"] - task["start"], 1)
        task["peak_rss_gib"] = round(max(inside, default=0) / 2**30, 2)
    first = min((t["start"] for t in tasks), default=0.0)
    for task in tasks:
        task["at_s"] = round(task.pop("start") - first, 1)
        del task["end"]
    return code, tasks


def table(tasks: list[dict]) -> str:
    lines = ["| task | started at (s) | seconds | peak RSS (GiB) | status |", "|---|---:|---:|---:|---|"]
    lines += [
        f"| {t['task']} | {t['at_s']:.0f} | {t['seconds']:.1f} | {t['peak_rss_gib']:.2f} | {t['status']} |"
        for t in tasks
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the per-task figures here (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    started = time.monotonic()
    code, tasks = profile(command)
    print(table(tasks))
    print(f"whole run: {time.monotonic() - started:.0f} s, exit status {code}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"command": command, "exit": code, "tasks": tasks}, fh, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
