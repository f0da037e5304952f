"""Data at scale: tokenization speed by worker count, the prepare cache, and prepare's peak memory.

    python -m benchmarks.prepare_scale [--rows 200000] [--memory-rows 1000000] [--rounds 2]
        [--parts speed,cache,memory] [--workdir DIR] [--json OUT]

Synthetic multi-turn chat rows (seeded; 1-3 user/assistant exchanges of 4-40 words from a fixed
vocabulary) are written as JSONL; a byte-level BPE tokenizer (vocab 2048, the tiny-model kit's,
ChatML template) is trained on the same vocabulary and saved as a model dir.

* speed: the rows are prepared once (no tokenizer), then their train split is tokenized for SFT
  (``tokenize_split``, masks included, no cache) with ``data.num_workers`` 1 and 2, alternately for
  ``--rounds`` rounds, each pass in a fresh process (as each stage runs it: nothing carried over from
  the previous pass); the ratio is median(1 worker) / median(2 workers). Also prepare's token-length
  pass alone (``length_column``) the same way. With 1 worker the tokenizers library still encodes
  each batch on every core (its own threads), so the ratio is below the worker count.
* cache: ``posttrain prepare`` of the rows with the tokenizer (lengths, too-long filter) into one
  output dir, then into another with the same cache: wall time of each whole CLI process.
* memory: ``posttrain prepare`` with the tokenizer of ``--memory-rows`` short single-turn rows,
  measured by ``/usr/bin/time -v`` (maximum resident set size of the prepare process) and the
  process's own ``getrusage`` peak of itself and of its largest map worker.

Not part of ``make test``. The last line prints every ratio and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = (
    "the a of to and in is it that for on with as was at by this be are from or have an not but what "
    "all were when we there can your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water long little very after "
    "words called just where most know get through back much before go good new write our used me man "
    "too any day same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off went old "
    "number function return value list python code print error test file class data loop string"
).split()


def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + rng.choice(".?!")


def chat_row(rng: random.Random, turns: tuple[int, int] = (1, 3), length: tuple[int, int] = (4, 40)) -> dict:
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": sentence(rng, 3, 10)})
    for _ in range(rng.randint(*turns)):
        messages.append({"role": "user", "content": sentence(rng, *length)})
        messages.append({"role": "assistant", "content": sentence(rng, *length)})
    return {"messages": messages}


def write_rows(path: str, count: int, seed: int, **kwargs) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(count):
            fh.write(json.dumps(chat_row(rng, **kwargs)) + "\n")


def make_tokenizer(directory: str) -> str:
    from trainer_lib.demo.tiny_model import train_tokenizer

    rng = random.Random(0)
    tok = train_tokenizer((sentence(rng, 5, 30) for _ in range(20000)), vocab_size=2048)
    tok.save_pretrained(directory)
    return directory


def cli(args: list[str], env: dict, timed: bool = False) -> tuple[float, str]:
    """Run ``posttrain`` in a fresh process; (wall seconds, stderr)."""
    cmd = [sys.executable, "-m", "trainer_lib.cli", *args]
    if timed:
        cmd = ["/usr/bin/time", "-v", *cmd]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"posttrain {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, proc.stderr


TIMED_PASS = """
import json, os, sys, tempfile, time
import datasets
from transformers import AutoTokenizer
from trainer_lib.data.arrow_rows import LOCATION
from trainer_lib.data.tokenized import length_column, tokenize_split
kind, prepared, tokenizer_dir, workers, scratch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
plain = datasets.load_from_disk(prepared)["train"]
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
if kind == "lengths":  # what prepare's pass reads: the rows and their locations
    plain = plain.add_column(LOCATION, [f"row {i}" for i in range(len(plain))])
start = time.perf_counter()
if kind == "sft":
    assert len(tokenize_split(plain, None, "sft", "messages", tokenizer, 1024, num_workers=workers)) > 0
else:
    assert len(length_column(plain, "messages", True, tokenizer, workers, tempfile.mkdtemp(dir=scratch), LOCATION))
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def timed_pass(kind: str, prepared: str, tokenizer_dir: str, workers: int, work: str, env: dict) -> float:
    """Seconds of one tokenization pass (``sft``: tokenize_split; ``lengths``: prepare's token-length pass)
    with ``workers`` workers, in a fresh process as every stage runs it (no state carried between passes)."""
    scratch = tempfile.mkdtemp(dir=work)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", TIMED_PASS, kind, prepared, tokenizer_dir, str(workers), scratch],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{kind} pass with {workers} worker(s) failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def bench_speed(work: str, rows: str, tokenizer_dir: str, rounds: int, env: dict) -> dict:
    prepared = os.path.join(work, "prepared-plain")
    cli(["prepare", f"data.path={rows}", f"output_dir={prepared}", "data.eval_fraction=0"], env)
    times: dict[str, dict[int, list[float]]] = {"sft": {1: [], 2: []}, "lengths": {1: [], 2: []}}
    for round_ in range(rounds):
        for workers in (1, 2):
            for kind in ("sft", "lengths"):
                times[kind][workers].append(timed_pass(kind, prepared, tokenizer_dir, workers, work, env))
            print(
                f"round {round_}: {workers} worker(s): sft {times['sft'][workers][-1]:.1f}s, "
                f"lengths {times['lengths'][workers][-1]:.1f}s",
                flush=True,
            )
    with open(rows, encoding="utf-8") as fh:
        result = {"rows": sum(1 for _ in fh)}
    for kind, by_workers in times.items():
        one, two = statistics.median(by_workers[1]), statistics.median(by_workers[2])
        result[kind] = {
            "seconds_1_worker": by_workers[1],
            "seconds_2_workers": by_workers[2],
            "speedup": round(one / two, 3),
        }
    return result


def bench_cache(work: str, rows: str, tokenizer_dir: str, env: dict) -> dict:
    common = [f"data.path={rows}", f"model.path={tokenizer_dir}", "data.max_length=512", "data.num_workers=2"]
    cache_dir = os.path.join(env["POSTTRAIN_CACHE"], "data")

    def entries() -> list[str]:
        return sorted(n for n in os.listdir(cache_dir) if n.startswith("normalized-") and "." not in n)

    first, _ = cli(["prepare", *common, f"output_dir={os.path.join(work, 'out-a')}"], env)
    built = entries()
    mtime = os.stat(os.path.join(cache_dir, built[-1])).st_mtime_ns
    second, _ = cli(["prepare", *common, f"output_dir={os.path.join(work, 'out-b')}"], env)
    reused = entries() == built and os.stat(os.path.join(cache_dir, built[-1])).st_mtime_ns == mtime
    print(
        f"prepare: first {first:.1f}s, again into another output_dir {second:.1f}s (cache reused: {reused})", flush=True
    )
    return {
        "first_s": round(first, 2),
        "second_s": round(second, 2),
        "speedup": round(first / second, 3),
        "second_reused": reused,
    }


def bench_memory(work: str, count: int, tokenizer_dir: str, env: dict) -> dict:
    rows = os.path.join(work, "short.jsonl")
    write_rows(rows, count, seed=1, turns=(1, 1), length=(2, 12))
    probe = os.path.join(work, "rss.json")
    code = (
        "import json, resource, sys; from trainer_lib import cli; rc = cli.main(sys.argv[2:]); "
        "u = resource.getrusage; json.dump({'self_kib': u(resource.RUSAGE_SELF).ru_maxrss, "
        "'children_kib': u(resource.RUSAGE_CHILDREN).ru_maxrss}, open(sys.argv[1], 'w')); sys.exit(rc)"
    )
    cmd = [
        "/usr/bin/time",
        "-v",
        sys.executable,
        "-c",
        code,
        probe,
        "prepare",
        f"data.path={rows}",
        f"model.path={tokenizer_dir}",
        "data.max_length=512",
        "data.num_workers=2",
        f"output_dir={os.path.join(work, 'out-memory')}",
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"prepare of {count} rows failed:\n{proc.stderr[-3000:]}")
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    with open(probe, encoding="utf-8") as fh:
        own = json.load(fh)
    mib = {
        "time_v_peak_mib": round(peak_kib / 1024),
        "self_peak_mib": round(own["self_kib"] / 1024),
        "largest_worker_peak_mib": round(own["children_kib"] / 1024),
    }
    print(f"prepare of {count} short rows: {seconds:.1f}s, peak RSS {mib}", flush=True)
    return {"rows": count, "seconds": round(seconds, 1), **mib}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--memory-rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parts", default="speed,cache,memory")
    parser.add_argument("--workdir", default=None, help="Keep the files here (default: a temp dir, removed).")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    work = args.workdir or tempfile.mkdtemp(prefix="prepare-scale-")
    os.makedirs(work, exist_ok=True)
    env = {
        **os.environ,
        "POSTTRAIN_CACHE": os.path.join(work, "cache"),
        "POSTTRAIN_NO_PROGRESS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    }
    os.environ["POSTTRAIN_CACHE"] = env["POSTTRAIN_CACHE"]
    result = {"cpus": os.cpu_count(), "load_average": os.getloadavg()}
    try:
        tokenizer_dir = make_tokenizer(os.path.join(work, "tokenizer"))
        rows = os.path.join(work, "chat.jsonl")
        if parts & {"speed", "cache"}:
            write_rows(rows, args.rows, seed=0)
        if "speed" in parts:
            result["speed"] = bench_speed(work, rows, tokenizer_dir, args.rounds, env)
        if "cache" in parts:
            result["cache"] = bench_cache(work, rows, tokenizer_dir, env)
        if "memory" in parts:
            result["memory"] = bench_memory(work, args.memory_rows, tokenizer_dir, env)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    print(json.dumps(result))
    summary = []
    if "speed" in result:
        summary += [
            f"sft_tokenize_speedup_2_workers={result['speed']['sft']['speedup']}",
            f"lengths_speedup_2_workers={result['speed']['lengths']['speedup']}",
        ]
    if "cache" in result:
        summary.append(f"prepare_again_speedup={result['cache']['speedup']}")
    if "memory" in result:
        summary.append(f"prepare_{result['memory']['rows']}_rows_peak_rss_mib={result['memory']['time_v_peak_mib']}")
    print("ratio " + " ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
