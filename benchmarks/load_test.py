"""Load test of a served model: a bounded burst of generate requests against Triton's HTTP API.

    python -m benchmarks.load_test --export DIR [--variant int8|fp32]   # serve an export dir, then load it
    python -m benchmarks.load_test --url http://127.0.0.1:8000 --model posttrain   # a running server
        [--requests 200] [--concurrency 16] [--max-tokens 16] [--json OUT]

``--export`` publishes the export stage's output (``posttrain export``) as version 1 of a Triton
repository in a temporary directory and starts ``tritonserver`` on it (``make triton-env``).
Every request is ``POST /v2/models/<model>/generate`` with ``text_input`` and ``max_tokens``,
``--concurrency`` in flight at a time, prompts taken in turn from a fixed list. Measured: requests/s
over the whole burst, p50/p99/max latency of single requests, generated characters, and errors
(a non-200 answer, a connection failure, or a body without ``text_output``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request

PROMPTS = [
    "What is two plus two?",
    "Name a color.",
    "Say hello.",
    "Write a Python function add_one(x).",
    "Write a Python function double(x).",
    "Is the sky green?",
    "Define f(x) that returns x + 1.",
    "What comes after Monday?",
]


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least the first
    return ordered[int(rank) - 1]


def request(url: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> tuple[float, str | None, str]:
    """One generate request: (seconds, text_output or None, error text or "")."""
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        f"{url.rstrip('/')}/v2/models/{model}/generate",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            answer = json.loads(resp.read())
        text = answer.get("text_output")
        error = "" if isinstance(text, str) else f"no text_output in {str(answer)[:200]}"
        return time.perf_counter() - start, text if not error else None, error
    except (urllib.error.URLError, OSError, ValueError) as exc:  # HTTPError is a URLError
        return time.perf_counter() - start, None, f"{type(exc).__name__}: {exc}"[:300]


def run_load(url: str, model: str, *, requests=200, concurrency=16, max_tokens=16, prompts=PROMPTS, timeout_s=120.0):
    """Send ``requests`` requests, ``concurrency`` at a time; the figures, plus every answer by prompt
    index (``answers``: list of (prompt index, text or None)) so callers can check them."""
    jobs = [i % len(prompts) for i in range(requests)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda i: request(url, model, prompts[i], max_tokens, timeout_s), jobs))
    elapsed = time.perf_counter() - start
    latencies = [seconds for seconds, _, _ in results]
    errors = [error for _, _, error in results if error]
    return {
        "requests": requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "seconds": elapsed,
        "requests_per_s": requests / elapsed,
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:5],
        "latency_p50_ms": 1000 * percentile(latencies, 50),
        "latency_p99_ms": 1000 * percentile(latencies, 99),
        "latency_max_ms": 1000 * max(latencies),
        "output_chars": sum(len(text) for _, text, _ in results if text),
        "answers": [(i, text) for i, (_, text, _) in zip(jobs, results)],
    }


def serve_export(export_dir: str, variant: str, model: str, workdir: str):
    """Publish ``export_dir`` as version 1 of ``model`` in a repository under ``workdir``; a started server."""
    from trainer_lib.config import load_config
    from trainer_lib.config.layers import nest
    from trainer_lib.serving.server import TritonServer
    from trainer_lib.stages.lifecycle import deploy

    repository = os.path.join(workdir, "repository")
    deploy.run(
        load_config(
            deploy.CONFIG,
            None,
            nest({"export.path": export_dir, "repository": repository, "model_name": model, "variant": variant}),
        )
    )
    return TritonServer(repository, load=[model], log_path=os.path.join(workdir, "server.log")).start(timeout_s=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_test", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running Triton server's HTTP endpoint")
    where.add_argument("--export", help="an export directory to serve for the test")
    parser.add_argument("--variant", default="int8", choices=("int8", "fp32"))
    parser.add_argument("--model", default="posttrain")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="posttrain-load-") as workdir:
        server = serve_export(args.export, args.variant, args.model, workdir) if args.export else None
        try:
            url = server.url if server else args.url
            request(url, args.model, PROMPTS[0], args.max_tokens, 120.0)  # warm up (first request loads sessions)
            figures = run_load(
                url, args.model, requests=args.requests, concurrency=args.concurrency, max_tokens=args.max_tokens
            )
        finally:
            if server:
                server.stop()
    figures.pop("answers")
    figures["served"] = f"{args.export} ({args.variant})" if args.export else args.url
    print(
        f"{figures['requests']} requests, {figures['concurrency']} concurrent, max_tokens {figures['max_tokens']}: "
        f"{figures['requests_per_s']:.1f} requests/s, p50 {figures['latency_p50_ms']:.1f} ms, "
        f"p99 {figures['latency_p99_ms']:.1f} ms, max {figures['latency_max_ms']:.1f} ms, "
        f"{figures['errors']} errors"
    )
    for example in figures["error_examples"]:
        print(f"  error: {example}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
