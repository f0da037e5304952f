"""Peak memory of ``posttrain export`` on a ~1B-parameter model, against the size of its fp32 weights.

    python -m benchmarks.export_memory [--layers 20 --hidden 2048 --intermediate 5632 --vocab 32000]
        [--num-prompts 2 --max-new-tokens 4 --latency-tokens 4] [--int4] [--no-fp16] [--json OUT] [--keep DIR]

Saves a randomly initialised Llama (by default the ~1.03B-parameter shapes of
``benchmarks/load_memory.py``) as fp32 safetensors shards of at most 1GB, with a small BPE tokenizer,
then runs the real stage, ``python -m trainer_lib.cli export``, in a child process: the FP32 export,
the parity check, INT8 (INT4 with ``--int4``) and FP16. The parity prompts and token counts are
lowered (a greedy run of a 1B model on 2 CPU cores takes seconds per token) and the top-1
thresholds are off: a random model has flat logits, so its agreement figures say little. Reported:

    peak RSS    the child's high-water mark of resident memory (``getrusage(RUSAGE_CHILDREN)``),
                and its ratio to the fp32 weights (parameters x 4 bytes); acceptance: below 2.5x
    phases      the child's resident memory sampled every 0.2 s, the most seen in each phase; the
                phases are the stage's progress lines on stderr (``export: ...``)
    seconds     the stage's wall time, and its own ``seconds`` from export.json

The last line: ``ratio peak_rss/fp32_weights=...``. The checkpoint and the export are deleted at
the end unless ``--keep``. Not part of ``make test``. ~1B fp32 is ~4 GB on disk per copy (the
checkpoint, then FP32 + FP16 + INT8 ONNX: ~11 GB in all) and the stage peaks at about 1.2x the
weights in memory (4.5 GiB; the benchmark's own process builds the model first, ~4 GiB, and frees
it): check ``df -h`` and ``free -g`` first, and run one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.load_memory import build_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_model(out: str, layers: int, hidden: int, intermediate: int, vocab: int) -> int:
    """A random Llama and a BPE tokenizer saved to ``out``; returns its parameter count."""
    from trainer_lib.demo.tiny_model import train_tokenizer
    from trainer_lib.stages.lifecycle.export import DEFAULT_PROMPTS

    count = build_checkpoint(out, layers, hidden, intermediate, vocab, "1GB")
    train_tokenizer(DEFAULT_PROMPTS * 50, vocab_size=512).save_pretrained(out)
    return count


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid`` now (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_export(model_dir: str, out_dir: str, overrides: list[str]) -> dict:
    """Run the stage in a child; its peak RSS, the most RSS seen per phase, and its wall time."""
    cmd = [sys.executable, "-m", "trainer_lib.cli", "export", f"model_path={model_dir}", f"output_dir={out_dir}"]
    # glibc's mmap threshold fixed at its default, so freed large blocks leave resident memory
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONUNBUFFERED": "1"}
    start = time.time()
    child = subprocess.Popen(
        cmd + overrides, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )  # (stdout: the summary, also in export.json)
    phases = [{"phase": "start", "at_s": 0.0, "max_rss": 0}]
    log: list[str] = []

    def read_progress() -> None:  # each "export: ..." line opens the next phase
        for line in child.stderr:
            log.append(line)
            if line.startswith("export: "):
                phase = line[len("export: ") :].rsplit(" (", 1)[0].strip()
                phases.append({"phase": phase, "at_s": round(time.time() - start, 1), "max_rss": _rss(child.pid)})

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    while child.poll() is None:
        phases[-1]["max_rss"] = max(phases[-1]["max_rss"], _rss(child.pid))
        time.sleep(0.2)
    reader.join()
    seconds = time.time() - start
    if child.returncode:
        raise RuntimeError(f"export failed ({child.returncode}):\n{''.join(log)[-5000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
    return {"peak_rss": peak, "phases": phases, "wall_s": round(seconds, 1)}


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--num-prompts", type=int, default=2, help="parity.num_prompts of the stage")
    parser.add_argument("--max-new-tokens", type=int, default=4, help="parity.max_new_tokens of the stage")
    parser.add_argument("--latency-tokens", type=int, default=4, help="parity.latency_tokens of the stage")
    parser.add_argument("--int4", action="store_true", help="also build the INT4 model")
    parser.add_argument("--no-fp16", action="store_true", help="skip the FP16 model (fp16=false)")
    parser.add_argument("--keep", help="build the checkpoint and the export here and keep them")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    root = args.keep or tempfile.mkdtemp(prefix="export_memory_")
    model_dir, out_dir = os.path.join(root, "model"), os.path.join(root, "export")
    try:
        counted = os.path.join(root, "parameters.json")
        if not os.path.exists(counted):
            count = build_model(model_dir, args.layers, args.hidden, args.intermediate, args.vocab)
            with open(counted, "w", encoding="utf-8") as fh:
                json.dump(count, fh)
        with open(counted, encoding="utf-8") as fh:
            count = json.load(fh)
        fp32 = count * 4
        print(f"{count:,} parameters, fp32 weights {_gib(fp32)}", flush=True)
        overrides = [
            f"parity.num_prompts={args.num_prompts}",
            f"parity.max_new_tokens={args.max_new_tokens}",
            f"parity.latency_tokens={args.latency_tokens}",
            "parity.int8_min_top1_agreement=0",
            "parity.fp16_min_top1_agreement=0",
            f"int4={str(args.int4).lower()}",
            f"fp16={str(not args.no_fp16).lower()}",
        ]
        result = run_export(model_dir, out_dir, overrides)
        with open(os.path.join(out_dir, "export.json"), encoding="utf-8") as fh:
            summary = json.load(fh)
        for phase in result["phases"]:
            print(f"  {phase['at_s']:>7.1f}s  {_gib(phase['max_rss']):>10}  {phase['phase']}")
        print(
            f"peak RSS {_gib(result['peak_rss'])} ({result['peak_rss'] / fp32:.2f}x the fp32 weights), "
            f"wall {result['wall_s']} s (the stage's own figure: {summary['seconds']} s)"
        )
        for name in summary["models"]:
            print(
                f"  {name}: files {_gib(summary['file_bytes'][name])}, max |logit diff| "
                f"{summary['max_abs_diff'][name]:.3g}, top-1 {summary['top1_agreement'][name]:.3f}, "
                f"{summary['decode_ms_per_token'][name]} ms/token"
            )
        print(f"ratio peak_rss/fp32_weights={result['peak_rss'] / fp32:.3f}", flush=True)
        if args.json:
            record = {"parameters": count, "fp32_bytes": fp32, **result, "summary": summary}
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(record, fh, indent=2)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
