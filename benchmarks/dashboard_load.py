"""How fast the dashboard answers for a large run: 100k logged steps and 10k samples (issue 46's shape).

    python -m benchmarks.dashboard_load [--steps 100000 --samples 10000 --rounds 3] [--json OUT]

Writes one GRPO-shaped run folder (``metrics.jsonl`` with a record per step holding the keys a GRPO
stage logs, an eval record every 500 steps, ``samples.jsonl`` with ``--samples`` rows of ~600-character
completions, a finished heartbeat and summary), starts ``posttrain dashboard`` on it in its own process,
and times each request the pages make, median of ``--rounds``, whole HTTP round trip included:

    runs list           /api/runs (what #/ loads)
    run page            /api/run (every record of the run: what #/run/<id> loads before drawing)
    live poll           /api/metrics?after=<all> (what a running page asks every 2 s)
    samples             /api/samples (the newest 200 rows, and the step list)
    samples, filtered   /api/samples?min=0.5

Prints one line per request and the answer's size. The browser's drawing time is not included.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("loss", "reward", "reward_std", "rewards/accuracy", "rewards/format", "kl", "entropy", "clip_fraction")
KEYS += ("response_length", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "generate_time", "memory_gb")


def write_run(folder: str, steps: int, samples: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metrics.jsonl"), "w", encoding="utf-8") as fh:
        for step in range(1, steps + 1):
            record = {"step": step, "split": "train", "time": step * 1.5, "tokens": 2048.0}
            record.update({key: round(rng.random(), 6) for key in KEYS})
            fh.write(json.dumps(record) + "\n")
            if step % 500 == 0:
                fh.write(json.dumps({"step": step, "split": "eval", "reward": rng.random()}) + "\n")
    words = ["alpha", "beta", "gamma", "delta", "the", "answer", "is", "so", "then", "we", "add"]
    every = max(steps // max(samples // 16, 1), 1)
    with open(os.path.join(folder, "samples.jsonl"), "w", encoding="utf-8") as fh:
        for i in range(samples):
            row = {
                "step": min((i // 16 + 1) * every, steps),
                "kind": "rollout",
                "group": (i % 16) // 8,
                "prompt": "user: " + " ".join(rng.choice(words) for _ in range(30)),
                "completion": " ".join(rng.choice(words) for _ in range(110)),
                "reward": rng.random(),
                "rewards": {"accuracy": float(rng.random() > 0.5), "format": rng.random()},
                "advantage": rng.gauss(0, 1),
                "length": 140,
                "finished": True,
            }
            fh.write(json.dumps(row) + "\n")
    beat = {"state": "finished", "stage": "grpo", "step": steps, "total_steps": steps, "started": time.time()}
    beat.update({"updated": time.time(), "interval_s": 10.0, "config": {"lr": 1e-6, "rollout.n": 8}})
    with open(os.path.join(folder, "heartbeat.json"), "w", encoding="utf-8") as fh:
        json.dump(beat, fh)
    with open(os.path.join(folder, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump({"stage": "grpo", "steps": steps}, fh)


def timed(url: str, rounds: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=600) as response:
            size = len(response.read())
        times.append(time.perf_counter() - start)
    return statistics.median(times), size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "runs", "big-grpo")
        began = time.perf_counter()
        write_run(run, args.steps, args.samples)
        sizes = {name: os.path.getsize(os.path.join(run, name)) for name in ("metrics.jsonl", "samples.jsonl")}
        print(
            f"wrote {args.steps:,} steps and {args.samples:,} samples in {time.perf_counter() - began:.1f} s: "
            + ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in sizes.items())
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer_lib.cli",
                "dashboard",
                "--runs",
                os.path.join(tmp, "runs"),
                "--http-port",
                "0",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            port = re.search(r":(\d+)/", proc.stdout.readline()).group(1)
            base = f"http://127.0.0.1:{port}/api/"
            count = args.steps + args.steps // 500
            requests = {
                "runs list": "runs",
                "run page": "run?id=0/big-grpo",
                "live poll": f"metrics?id=0/big-grpo&after={count}",
                "samples": "samples?id=0/big-grpo",
                "samples, filtered": "samples?id=0/big-grpo&min=0.5",
            }
            figures = {}
            for name, path in requests.items():
                seconds, size = timed(base + path, args.rounds)
                figures[name] = {"seconds": round(seconds, 3), "bytes": size}
                print(f"dashboard {name:<18} {seconds * 1000:9.0f} ms   {size / 2**20:7.2f} MiB")
        finally:
            proc.terminate()
            proc.wait()
            proc.stdout.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"steps": args.steps, "samples": args.samples, "files": sizes, "requests": figures}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
