"""Where a GRPO step's time goes on a real model: one ``posttrain grpo`` run, a row per step.

    python -m benchmarks.grpo_step                                   # SmolLM2-135M-Instruct, fp32
    python -m benchmarks.grpo_step --set engine.precision=bf16 --json runs/grpo-step-bf16.json

The shape is issue 41's: 4 GSM8K prompts x 4 completions x 160 new tokens (``rollout.max_new_tokens``;
a completion that ends earlier is shorter), full fine-tune, a frozen reference (``beta`` 0.04), the
``accuracy_reward`` checker, one optimizer update per step. The prompts are GSM8K rows held out of
nothing (the first ``--steps`` x 4 of the shared file), as chat turns. Each logged step gives its phases
from the stage's own metrics (``metrics.jsonl``, ``logging_steps=1``):

* ``generate``: sampling the completions (``generate_time``);
* ``reward``: scoring them;
* ``reference``: the reference's log-probs (``logprob_time``; pi_old is the policy's own forward here);
* ``policy``: the policy's forward and backward over the completions (``train_time - optimizer_time``);
* ``optimizer``: clipping and the AdamW update (``optimizer_time``);
* ``step``: the wall time between two logged steps, everything included.

The first step pays for warm-up (allocations, oneDNN's kernel choice); the table's ``mean`` row is over
the later steps. The process's peak RSS comes from ``benchmarks.dag_profile``'s reader.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, ".cache", "real-model", "smollm2-135m-instruct")
PHASES = ("generate", "reward", "reference", "policy", "optimizer", "step")


def gsm8k_prompts(data: str, count: int, out: str) -> str:
    """The first ``count`` GSM8K problems as RL prompt rows (the question as a user turn, its solution)."""
    from trainer_lib.data.public_datasets import gsm8k_row

    path = os.path.join(out, "prompts.jsonl")
    with open(os.path.join(data, "gsm8k_train.jsonl"), encoding="utf-8") as src, open(path, "w") as dst:
        for i, line in zip(range(count), src):
            row = gsm8k_row(json.loads(line), f"gsm8k_train.jsonl:{i + 1}")
            dst.write(json.dumps({"prompt": row["prompt"], "solution": row["solution"]}) + "\n")
    return path


def phases(record: dict, previous_time: float) -> dict:
    """One logged step's phases in seconds."""
    optimizer = record.get("optimizer_time", 0.0)
    return {
        "generate": record["generate_time"],
        "reward": record["reward_time"],
        "reference": record["logprob_time"],
        "policy": record["train_time"] - optimizer,
        "optimizer": optimizer,
        "step": record["time"] - previous_time,
        "response_length": record.get("response_length", 0.0),
    }


def table(rows: list[dict]) -> str:
    lines = ["| step | " + " | ".join(PHASES) + " | mean completion tokens |", "|---|" + "---:|" * (len(PHASES) + 1)]
    for i, row in enumerate(rows, 1):
        lines.append(f"| {i} | " + " | ".join(f"{row[p]:.1f}" for p in PHASES) + f" | {row['response_length']:.0f} |")
    later = rows[1:] or rows
    mean = {p: sum(r[p] for r in later) / len(later) for p in PHASES}
    lines.append("| mean (after the first) | " + " | ".join(f"{mean[p]:.1f}" for p in PHASES) + " | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--set", action="append", default=[], help="more key=value overrides of the stage")
    p.add_argument("--json", help="write the per-step phases here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as work:
        prompts = gsm8k_prompts(args.data, args.steps * 4, work)
        out = os.path.join(work, "out")
        command = [
            os.path.join(os.path.dirname(sys.executable), "posttrain"),
            "grpo",
            f"model.path={args.model}",
            f"data.path={prompts}",
            f"output_dir={out}",
            f"max_steps={args.steps}",
            "prompts_per_step=4",
            "rollout.n=4",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            "rollout.batch_size=16",
            "reward.functions=accuracy_reward",
            "lr=1e-6",
            "logging_steps=1",
            "save_steps=0",
            "eval_steps=0",
            "data.eval_fraction=0",
            *args.set,
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True, env={**os.environ, "POSTTRAIN_NO_PROGRESS": "1"})
        wall = time.perf_counter() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
            records = [r for r in map(json.loads, f) if r.get("split") == "train"]
    rows, previous = [], 0.0
    for record in records:
        rows.append(phases(record, previous))
        previous = record["time"]
    print(table(rows))
    print(f"whole process: {wall:.0f} s, peak RSS {peak_mib:,.0f} MiB, overrides: {' '.join(args.set) or '-'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"overrides": args.set, "steps": rows, "wall_s": wall, "peak_rss_mib": peak_mib}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
