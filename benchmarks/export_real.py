"""Export a real model and measure every variant against PyTorch on held-out real prompts.

    python -m benchmarks.export_real --model .cache/real-model/smollm2-135m-instruct --out runs/export-real
    python -m benchmarks.export_real ... --set quantize.int4_method=hqq --set fp16=false

The parity prompts are 50 held-out conversations, answers included (``parity.with_answers``), taken
through ``posttrain prepare`` from the shared public data (``--data``, default ``../shared/data``):
17 GSM8K problems and 17 HH-RLHF harmless-base dialogues held out by the hash of the row
(``data.eval_by=hash``), and 16 of MBPP's validation tasks (``data.eval_by=task_id:511-600``). Then
``posttrain export`` with INT4 on, one thread for the latency figures, and a Markdown table of every
variant measured (those the export left out included): size, top-1 agreement, greedy exact match,
decode latency.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SETS = (  # (file, data.eval_by, data.eval_fraction, rows, more keys)
    ("gsm8k_train.jsonl", "hash", 0.05, 17, ()),
    # (a few HH-RLHF dialogues have two Assistant turns in a row: dropped and counted in stats.json)
    ("hh_rlhf_harmless_base_test.jsonl.gz", "hash", 0.1, 17, ("data.bad_rows=drop",)),
    ("mbpp_train_validation_prompt.jsonl", "task_id:511-600", 0.0, 16, ()),
)


def posttrain(*args: str) -> None:
    command = os.path.join(os.path.dirname(sys.executable), "posttrain")
    subprocess.run([command, *args], check=True, env={**os.environ, "POSTTRAIN_NO_PROGRESS": "1"})


def conversation(row: dict) -> list[dict]:
    """A prepared row (prompt and completion, or prompt and chosen) as one conversation, answer last."""
    answer = row.get("completion") or row.get("chosen")
    prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
    answer = answer if isinstance(answer, list) else [{"role": "assistant", "content": answer}]
    return [*prompt, *answer]


def parity_prompts(data_dir: str, work: str) -> str:
    """The held-out conversations as a ``messages`` JSONL in ``work``; returns its path."""
    import datasets

    rows = []
    for name, eval_by, fraction, count, keys in SETS:
        out = os.path.join(work, name.split(".")[0])
        posttrain(
            "prepare",
            f"data.path={os.path.join(data_dir, name)}",
            f"data.eval_by={eval_by}",
            f"data.eval_fraction={fraction}",
            f"output_dir={out}",
            *keys,
        )
        held = datasets.load_from_disk(out)["eval"]
        rows += [{"messages": conversation(held[i])} for i in range(count)]
    path = os.path.join(work, "parity.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def table(out: str) -> str:
    """Markdown: one row per variant measured, from ``export.json`` and ``parity.json``."""
    with open(os.path.join(out, "parity.json"), encoding="utf-8") as fh:
        report = json.load(fh)
    with open(os.path.join(out, "export.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    fp32 = report["fp32"]["file_bytes"]
    lines = [
        "| variant | written | files (MB) | vs FP32 | top-1 agreement | greedy exact match | ms/token (1 thread) |",
        "|---|---|---:|---:|---:|---:|---:|",
        f"| PyTorch fp32 | - | - | - | - | - | {report['pytorch']['decode_ms_per_token']:.1f} |",
    ]
    for name in ("fp32", "fp16", "int8", "int4"):
        if name in report:
            r = report[name]
            written = "yes" if name in summary["models"] else f"no: {summary['failed'][name]}"
            lines.append(
                f"| {name} | {written} | {r['file_bytes'] / 1e6:.0f} | {r['file_bytes'] / fp32:.2f}x | "
                f"{r['top1_agreement']:.3f} | {r['greedy_exact_match']:.2f} | {r['decode_ms_per_token']:.1f} |"
            )
    positions = report["fp32"]["top1_positions"]
    return "\n".join(lines) + f"\n\n{report['prompts']} prompts, {positions} positions compared"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the HF model folder (or any model.path) to export")
    parser.add_argument("--out", required=True, help="the export's output_dir")
    parser.add_argument("--data", default=os.path.join("..", "shared", "data"), help="the shared public data")
    parser.add_argument("--set", action="append", default=[], help="more key=value for posttrain export")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        prompts = parity_prompts(args.data, work)
        posttrain(
            "export",
            f"model_path={args.model}",
            f"output_dir={args.out}",
            f"parity.prompts={prompts}",
            "parity.num_prompts=50",
            "parity.with_answers=true",
            "parity.threads=1",
            "int4=true",
            *args.set,
        )
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
