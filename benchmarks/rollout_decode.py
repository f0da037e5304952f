"""Rollout speed on a real model: transformers' ``generate`` against our own decode loop (trainer_lib.rl.decode).

    OMP_NUM_THREADS=1 python -m benchmarks.rollout_decode --json runs/rollout-decode.json

Issue 41's shape: 4 GSM8K prompts (the first of the shared file, as chat turns) x 4 samples, up to 160 new
tokens, SmolLM2-135M-Instruct in bf16 and fp32, temperature 1 and 0.6. The two engines alternate (A B A B,
a different seed per pair) since the machine's other core may be busy. Each run gives the whole rollout's
seconds (``rollout.generate``: prefill, decode, cutting) and ms per generated token (response tokens, eos
included). The engines draw different random numbers, so their completions (and lengths) differ; ms per token
is the fair figure. ``--prompts arithmetic`` takes the GRPO arithmetic recipe's prompts instead
(examples/real/grpo-arithmetic.yaml: ``--n 8 --max-new-tokens 64 --temperatures 0.6``, 8 prompts), whose
completions end at very different lengths. ``--compaction`` also times the own loop with finished rows
dropped every 1 or 4 steps or never: the same seed gives the same tokens there, so those times compare like
with like.
"""

from __future__ import annotations

import argparse
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, ".cache", "real-model", "smollm2-135m-instruct")
DATA = os.path.join(ROOT, "..", "shared", "data", "gsm8k_train.jsonl")


def gsm8k_prompt_ids(tokenizer, count: int) -> list[list[int]]:
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.data.public_datasets import gsm8k_row

    with open(DATA, encoding="utf-8") as fh:
        rows = [gsm8k_row(json.loads(line), f"gsm8k_train.jsonl:{i + 1}") for i, line in zip(range(count), fh)]
    return [encode_prompt(tokenizer, row["prompt"]) for row in rows]


def arithmetic_prompt_ids(tokenizer, count: int) -> list[list[int]]:
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.demo.arithmetic import problems

    rows, _ = problems(seed=0, train=count, held_out=300)
    return [encode_prompt(tokenizer, row["prompt"]) for row in rows]


def one_rollout(model, tokenizer, prompts, engine: str, temperature: float, seed: int, args) -> dict:
    from trainer_lib.rl.rollout import generate

    rollout = generate(
        model,
        tokenizer,
        prompts,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
        temperature=temperature,
        seed=seed,
        use_generate=engine == "generate",
    )
    seconds, tokens = rollout.stats["generate_time"], rollout.stats["generated_tokens"]
    lengths = rollout.response_lengths()
    return {
        "engine": engine,
        "temperature": temperature,
        "seed": seed,
        "seconds": round(seconds, 3),
        "tokens": tokens,
        "longest": int(lengths.max()),
        "mean_length": round(float(lengths.float().mean()), 1),
        "ms_per_token": round(1000 * seconds / tokens, 2),
    }


def compaction(model, tokenizer, prompts, temperature: float, seed: int, args) -> list[dict]:
    """The own loop alone, finished rows dropped every 1 or 4 steps or never (0), same seed: same tokens."""
    import torch

    from trainer_lib.rl.decode import decode
    from trainer_lib.rl.rollout import eos_token_ids, pad_rows

    ids, mask = pad_rows([p for p in prompts for _ in range(args.n)], tokenizer.pad_token_id, left=True)
    out = []
    for every in (1, 4, 0, 1, 4, 0):
        start = time.perf_counter()
        decoded = decode(
            model,
            ids,
            mask,
            max_new_tokens=args.max_new_tokens,
            eos_ids=eos_token_ids(model, tokenizer),
            pad_id=tokenizer.pad_token_id,
            temperature=temperature,
            n=args.n,
            generator=torch.Generator().manual_seed(seed),
            compact_every=every,
        )
        seconds = time.perf_counter() - start
        tokens = sum(len(row) for row in decoded.tokens)
        out.append({"compact_every": every, "seconds": round(seconds, 3), "tokens": tokens})
        print(out[-1], flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--temperatures", default="1.0,0.6")
    parser.add_argument("--pairs", type=int, default=2, help="A B pairs per setting, a seed each")
    parser.add_argument("--prompts", choices=("gsm8k", "arithmetic"), default="gsm8k")
    parser.add_argument("--count", type=int, default=4, help="prompts per rollout")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--compaction", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = (gsm8k_prompt_ids if args.prompts == "gsm8k" else arithmetic_prompt_ids)(tokenizer, args.count)
    results = []
    for dtype in args.dtypes.split(","):
        model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=getattr(torch, dtype)).eval()
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for seed in range(args.pairs):
                for engine in ("generate", "decode"):
                    row = {"dtype": dtype, **one_rollout(model, tokenizer, prompts, engine, temperature, seed, args)}
                    print(row, flush=True)
                    results.append(row)
        if args.compaction:
            temperature = float(args.temperatures.split(",")[0])
            for row in compaction(model, tokenizer, prompts, temperature, 0, args):
                results.append({"dtype": dtype, "temperature": temperature, **row})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
