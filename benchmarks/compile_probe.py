"""Does ``torch.compile`` (inductor) make a training step faster here?

    python -m benchmarks.compile_probe [--size small] [--steps 12] [--batch-size 4] [--device cpu]

The benchmark's Llama (``vs_trl.SIZES``) trains on batches of the benchmark's long-tailed lengths, padded,
with transformers' sdpa and fused AdamW: once eager, once with the model compiled
(``torch.compile(model, dynamic=True)``), from the same initial weights and batches, each in this process.
Printed per mode: the first step (with a compile, the compile), the median of the later steps, the total,
and the trained tokens/s over the later steps; then ``compile total=<compiled/eager> step=<compiled/eager>``
(< 1: compiled is faster). The losses of both modes are printed side by side (they agree to float rounding).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def batches(size: dict, steps: int, batch_size: int, seed: int):
    import torch

    from benchmarks.vs_trl import token_lengths

    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        lengths = token_lengths(rng, batch_size, median=150, high=size["max_length"])
        width = max(lengths)
        ids = torch.randint(
            3, size["vocab"], (batch_size, width), generator=torch.Generator().manual_seed(rng.randint(0, 2**31))
        )
        mask = torch.zeros(batch_size, width, dtype=torch.long)
        for row, n in enumerate(lengths):
            mask[row, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels, "tokens": sum(lengths)})
    return out


def run(mode: str, size: dict, data: list, device: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=size.get("embedding_rows") or size["vocab"],
        hidden_size=size["hidden_size"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["num_layers"],
        num_attention_heads=size["num_heads"],
        num_key_value_heads=size["num_kv_heads"],
        max_position_embeddings=size["max_length"] + 512,
    )
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    forward = torch.compile(model, dynamic=True) if mode == "compiled" else model
    times, losses = [], []
    for batch in data:
        start = time.perf_counter()
        inputs = {k: v.to(device) for k, v in batch.items() if k != "tokens"}
        loss = forward(**inputs, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
        times.append(time.perf_counter() - start)
    later = times[1:]
    tokens = sum(b["tokens"] for b in data[1:])
    return {
        "first_s": times[0],
        "median_step_s": statistics.median(later),
        "total_s": sum(times),
        "tokens_per_s": tokens / sum(later),
        "losses": losses,
    }


def main(argv=None) -> int:
    from benchmarks.vs_trl import SIZES

    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=tuple(SIZES), default="small")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    size = SIZES[args.size]
    data = batches(size, args.steps, args.batch_size, args.seed)
    results = {mode: run(mode, size, data, args.device) for mode in ("eager", "compiled")}
    for mode, r in results.items():
        print(
            f"{mode:8s} first step {r['first_s']:7.2f}s  later steps median {r['median_step_s']:.3f}s  "
            f"total {r['total_s']:7.2f}s  {r['tokens_per_s']:8.1f} tok/s after the first"
        )
    print("losses   " + "  ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(*(r["losses"] for r in results.values()))))
    eager, compiled = results["eager"], results["compiled"]
    print(
        f"compile total={compiled['total_s'] / eager['total_s']:.3g} "
        f"step={compiled['median_step_s'] / eager['median_step_s']:.3g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
