"""Per-rank peak memory of one SFT step on one long packed row, without and with sequence parallelism.

    python -m benchmarks.sequence_memory [--lengths 8192 16384 32768] [--sizes 1 2] [--json OUT]
    python -m benchmarks.sequence_memory --estimate      # Llama-3.1-8B at 32k-128k tokens: estimates

A tiny Llama (2 layers, hidden 128, 4 heads, 2 KV heads, MLP 512, 300-token vocabulary) takes one optimizer
step on one row of N random tokens, every position scored, through SFT's own step objects
(``stages/training/sft.py``) and the strategy's engine: gradient checkpointing, ``engine.tiled_mlp`` and the
tiled LM head on, fp32, ZeRO-0. Under S=2 two torchrun workers split the row (``parallel.sequence=2``).
Memory is what a rank's step adds to what it held before the step: on a GPU ``max_memory_allocated``, on a
CPU the resident set size sampled every 2 ms by a thread (so allocator caching counts, as a host sees it).
Prints a markdown table (docs/parallelism.md). Not a timed test: run it on a quiet machine.

``--estimate`` prints, for Llama-3.1-8B on one node of 8 GPUs under ZeRO-3, an estimate (arithmetic,
not a measurement) of a GPU's memory at 32k, 64k and 128k tokens per row for S = 1, 2, 4, 8, with and
without ``engine.offload_activations``: the model states by DeepSpeed's estimator, plus the activations
of :func:`activation_estimate`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

SHAPE = dict(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2, max_positions=65536, seed=0)


def build_model(out: str) -> str:
    from trainer_lib.demo.tiny_model import make_tiny_model

    texts = [f"document {i} about sequence parallel memory and long context" for i in range(200)]
    return make_tiny_model(out, texts, vocab_size=300, **SHAPE)


class PeakRSS:
    """The largest resident set size seen while open, sampled by a thread."""

    def __init__(self, every_s: float = 0.002):
        import psutil

        self.process, self.every_s, self.peak, self._stop = psutil.Process(), every_s, 0, threading.Event()

    def __enter__(self):
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.every_s)

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def worker(model_dir: str, length: int, size: int, out: str) -> None:
    """One rank: one SFT step on a ``length``-token row, its peak memory above the start written to ``out``."""
    import torch

    from trainer_lib.config.sections import EngineConfig, ModelConfig, ParallelConfig
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.loop.metrics import MetricsWindow
    from trainer_lib.models.load import load_causal_lm
    from trainer_lib.stages.training.sft import MicroBatchSteps, SequenceParallelSteps

    engine_cfg = EngineConfig(gradient_checkpointing=True, tiled_mlp=True)
    strategy = DeepSpeedStrategy(engine_cfg, micro_batch_size=1, parallel=ParallelConfig(sequence=size))
    strategy.setup_distributed()
    model = load_causal_lm(ModelConfig(path=model_dir), "fp32", placement=strategy.placement())
    engine = strategy.prepare(model, lr=1e-4, weight_decay=0.0, total_steps=1)
    steps = (SequenceParallelSteps if size > 1 else MicroBatchSteps)(engine, strategy)
    ids = torch.randint(4, 300, (1, length), generator=torch.Generator().manual_seed(0)).to(strategy.device)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(length, device=ids.device)[None]}
    cuda = strategy.device.type == "cuda"
    strategy.barrier()
    started = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        steps.train([([0], batch)], MetricsWindow())
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with PeakRSS() as rss:
            steps.train([([0], batch)], MetricsWindow())
        peak = rss.peak - rss.start
    seconds = time.perf_counter() - started
    with open(f"{out}.{strategy.rank}", "w", encoding="utf-8") as fh:
        json.dump({"rank": strategy.rank, "peak_mib": peak / 2**20, "step_s": seconds}, fh)


def measure(model_dir: str, length: int, size: int, tmp: str) -> dict:
    out = os.path.join(tmp, f"n{length}_s{size}")
    command = [sys.executable, "-m", "benchmarks.sequence_memory", "--worker", model_dir, str(length), str(size), out]
    if size > 1:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={size}",
            *command[1:],
        ]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // size))}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ranks = [json.load(open(f"{out}.{rank}", encoding="utf-8")) for rank in range(size)]
    return {
        "tokens": length,
        "sequence": size,
        "peak_mib": max(r["peak_mib"] for r in ranks),
        "step_s": max(r["step_s"] for r in ranks),
    }


#: Llama-3.1-8B's config: layers, hidden, heads, KV heads, head dim, MLP, vocabulary
LLAMA_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, vocab=128256)


def activation_estimate(tokens: int, sequence: int, offload: bool, shape: dict = LLAMA_8B) -> dict:
    """Bytes of activations on one GPU for one row of ``tokens`` in bf16 with gradient checkpointing, tiled MLP
    and tiled LM head, split over ``sequence`` ranks. Terms (an estimate: allocator slack and the kernels'
    own workspaces come on top):

    * checkpoints: each layer's input for the rank's ``tokens / S`` positions (on the host when offloaded);
    * layer: the one layer being recomputed and differentiated, about ten hidden-sized tensors of the chunk
      (norms, residual, projections and their gradients);
    * attention: after the exchange, all ``tokens`` positions of ``heads / S`` query heads and of
      ``max(kv_heads / S, 1)`` key-value heads, query/key/value/output and their gradients, twice for the
      all-to-all's send and receive buffers;
    * MLP tile: one tile of ``hidden`` positions through the gated MLP, forward and gradient;
    * LM head tile: 2^25 float32 logits, their softmax and gradient (``losses/chunked_head.py``).
    """
    from trainer_lib.losses.chunked_head import TILE_ELEMENTS

    bf16, chunk = 2, tokens // sequence
    h = shape["hidden"]
    checkpoints = shape["layers"] * chunk * h * bf16
    layer = 10 * chunk * h * bf16
    local_q, local_kv = shape["heads"] // sequence, max(shape["kv_heads"] // sequence, 1)
    attention = 2 * 2 * tokens * shape["head_dim"] * bf16 * (2 * local_q + 2 * local_kv)
    mlp_tile = 2 * 3 * h * shape["mlp"] * bf16
    head_tile = 3 * TILE_ELEMENTS * 4
    on_gpu = (0 if offload else checkpoints) + layer + attention + mlp_tile + head_tile
    return {"checkpoints": checkpoints, "on_gpu": on_gpu}


def estimate_rows() -> list[dict]:
    from trainer_lib.config.sections import ParallelConfig
    from trainer_lib.engine.deepspeed_file import states_estimate
    from trainer_lib.engine.parallel import layout

    params, largest = 8_030_261_248, 128_256 * 4_096
    rows = []
    for tokens in (32_768, 65_536, 131_072):
        for sequence in (1, 2, 4, 8):
            found = layout(ParallelConfig(sequence=sequence), 8)
            _, states, _ = states_estimate(params, largest, 3, False, False, 8, 8, found)
            for offload in (False, True):
                acts = activation_estimate(tokens, sequence, offload)
                rows.append(
                    dict(
                        tokens=tokens,
                        sequence=sequence,
                        offload=offload,
                        states=states,
                        **acts,
                        total=states + acts["on_gpu"],
                    )
                )
    return rows


def estimate_table(rows: list[dict]) -> str:
    gib = 2**30
    lines = [
        "| tokens per row | S | checkpoints offloaded | states (ZeRO-3, 8 GPUs) | activations | total per GPU |",
        "|---:|---:|:---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['tokens']:,} | {r['sequence']} | {'yes' if r['offload'] else 'no'} | {r['states'] / gib:.1f} GiB | "
        f"{r['on_gpu'] / gib:.1f} GiB | {r['total'] / gib:.1f} GiB |"
        for r in rows
    ]
    return "\n".join(lines)


def table(results: list[dict]) -> str:
    lines = ["| tokens | S | per-rank peak (MiB) | step (s) |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['tokens']:,} | {r['sequence']} | {r['peak_mib']:,.0f} | {r['step_s']:.1f} |" for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        model_dir, length, size, out = argv[1:]
        worker(model_dir, int(length), int(size), out)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", help="write the results here as JSON too")
    parser.add_argument("--estimate", action="store_true", help="print the Llama-3.1-8B estimate table instead")
    args = parser.parse_args(argv)
    if args.estimate:
        print(estimate_table(estimate_rows()))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(os.path.join(tmp, "model"))
        results = [measure(model_dir, n, s, tmp) for n in args.lengths for s in args.sizes]
    print(table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
