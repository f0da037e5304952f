"""posttrain against TRL on the same workload, run alternately in fresh processes.

    python -m benchmarks.vs_trl --algo sft --rounds 3 --steps 8 [--json OUT] [--device cpu|cuda]
    python -m benchmarks.vs_trl --algo all --size suite      # make bench: 4 stages x 2 shapes

One model (a Llama built from scratch from one config, with one tokenizer trained on the data),
one synthetic data set (chat rows with log-normal lengths between 16 and 1,024 tokens, seeded) and
one set of training settings go to both sides. Each round runs ours, then TRL's, each in its own
subprocess (``benchmarks.side_ours`` with this interpreter, ``benchmarks.side_trl`` with
``--trl-python``, by default ``.venv-bench/bin/python`` from ``make bench``), so drift of a shared
machine hits both sides alike. What a child measures is in ``benchmarks/probe.py``. The last line
printed is ``ratio throughput=<ours/theirs> memory=<ours/theirs>``, medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGOS = ("sft", "reward", "dpo", "grpo")

# Llama shapes: (layers, hidden, heads, kv heads, intermediate, vocab, default max length)
SIZES = {
    "tiny": dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate=256, vocab=512, max_length=128
    ),
    "small": dict(
        num_layers=4, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate=1024, vocab=2048, max_length=1024
    ),
    # Qwen2.5-0.5B's blocks and its padded 151,936-row vocabulary (of which the tokenizer uses 8,192 ids),
    # 2 of its 24 layers: where the LM head dominates, as in the models users train
    "real": dict(
        num_layers=2,
        hidden_size=896,
        num_heads=14,
        num_kv_heads=2,
        intermediate=4864,
        vocab=8192,
        embedding_rows=151936,
        max_length=1024,
    ),
}
SIZES["0.5b"] = {**SIZES["real"], "num_layers": 24}  # all 24 of Qwen2.5-0.5B's layers (bf16, CUDA only)
#: ``make bench``: every stage at these sizes, on CPU.
SUITE_SIZES = ("small", "real")
#: Real checkpoints (``make real-model``): their own weights, vocabulary and chat template, and real data
#: from ``--data`` (GSM8K conversations for SFT and GRPO prompts, HH-RLHF harmless-base pairs for DPO and
#: the reward model) in place of the synthetic rows.
REAL_MODELS = {"smollm2": os.path.join(ROOT, ".cache", "real-model", "smollm2-135m-instruct")}


def length_reward(prompts, completions, **kwargs) -> list[float]:
    """The GRPO reward of both sides: longer completions score higher, up to 200 characters."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [min(len(t), 200) / 200.0 for t in texts]


# --------------------------------------------------------------------------- workload


def token_lengths(rng: random.Random, count: int, median: float, low: int = 16, high: int = 1024) -> list[int]:
    """Long-tailed lengths: log-normal around ``median`` (sigma 0.9), clipped to [low, high]."""
    return [min(high, max(low, int(rng.lognormvariate(math.log(median), 0.9)))) for _ in range(count)]


def make_words(rng: random.Random, count: int = 600) -> list[str]:
    syllables = ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi", "de", "po", "ga", "ze", "chu", "fen", "bor"]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(count)]


def make_rows(algo: str, count: int, seed: int) -> list[dict]:
    """Synthetic conversational rows of the algorithm's format (about one token per word)."""
    rng = random.Random(seed)
    words = make_words(random.Random(0))  # one vocabulary for every data set and the tokenizer

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    rows = []
    if algo == "grpo":
        for n in token_lengths(rng, count, median=40, high=256):
            rows.append({"prompt": [{"role": "user", "content": text(n)}]})
        return rows
    for n in token_lengths(rng, count, median=150):
        prompt_len = max(4, n // 4)
        user = [{"role": "user", "content": text(prompt_len)}]
        if algo == "sft":
            rows.append({"messages": user + [{"role": "assistant", "content": text(max(4, n - prompt_len))}]})
        else:
            answer_len = max(4, n - prompt_len)
            rows.append(
                {
                    "prompt": user,
                    "chosen": [{"role": "assistant", "content": text(answer_len)}],
                    "rejected": [
                        {"role": "assistant", "content": text(max(4, int(answer_len * rng.uniform(0.5, 1.5))))}
                    ],
                }
            )
    return rows


def real_rows(algo: str, count: int, data_dir: str) -> list[dict]:
    """The first ``count`` rows of the shared public data in the algorithm's conversational format:
    GSM8K problems (SFT: question and worked answer; GRPO: the question alone), HH-RLHF harmless-base
    pairs (DPO, reward; the few malformed dialogues skipped) through posttrain's own converters."""
    import gzip

    from trainer_lib.data.public_datasets import gsm8k_row, hh_rlhf_row
    from trainer_lib.errors import DataError

    rows = []
    if algo in ("sft", "grpo"):
        with open(os.path.join(data_dir, "gsm8k_train.jsonl"), encoding="utf-8") as f:
            for i, line in zip(range(count), f):
                row = gsm8k_row(json.loads(line), f"gsm8k_train.jsonl:{i + 1}")
                rows.append(
                    {"messages": row["prompt"] + row["completion"]} if algo == "sft" else {"prompt": row["prompt"]}
                )
        return rows
    with gzip.open(os.path.join(data_dir, "hh_rlhf_harmless_base_test.jsonl.gz"), "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            try:
                row = hh_rlhf_row(json.loads(line), f"hh_rlhf_harmless_base_test.jsonl.gz:{i + 1}")
            except DataError:
                continue
            rows.append({key: row[key] for key in ("prompt", "chosen", "rejected")})
            if len(rows) == count:
                break
    return rows


def build_workload(args, workdir: str) -> dict:
    """Save the model, tokenizer and data under ``workdir``; return the spec both children read."""
    from trainer_lib.demo.tiny_model import build_tiny_llama, train_tokenizer

    real = args.size in REAL_MODELS
    size = {"max_length": 512} if real else SIZES[args.size]
    max_length = args.max_length or size["max_length"]
    batch = args.batch_size
    prompts_per_step = args.prompts_per_step if args.algo == "grpo" else 0
    count = args.steps * (prompts_per_step or batch * args.accumulation)  # one pass over the data
    rows = real_rows(args.algo, count, args.data) if real else make_rows(args.algo, count, args.seed)
    data_path = os.path.join(workdir, f"{args.algo}.jsonl")
    with open(data_path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    if real:
        return workload_spec(args, REAL_MODELS[args.size], data_path, max_length, prompts_per_step)
    corpus = [
        m["content"] for row in make_rows("dpo", 200, args.seed + 1) for key in ("prompt", "chosen") for m in row[key]
    ]
    tokenizer = train_tokenizer(corpus, vocab_size=size["vocab"])
    model = build_tiny_llama(
        tokenizer,
        num_layers=size["num_layers"],
        hidden_size=size["hidden_size"],
        num_heads=size["num_heads"],
        num_kv_heads=size["num_kv_heads"],
        intermediate_size=size["intermediate"],
        max_positions=max(max_length, 1024) + 512,
        seed=args.seed,
        embedding_rows=size.get("embedding_rows", 0),
    )
    model_dir = os.path.join(workdir, "model")
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    return workload_spec(args, model_dir, data_path, max_length, prompts_per_step)


def workload_spec(args, model_dir: str, data_path: str, max_length: int, prompts_per_step: int) -> dict:
    """What both children read: the model, the data and every training setting."""
    return {
        "algo": args.algo,
        "model_dir": model_dir,
        "data_path": data_path,
        "device": args.device,
        "precision": args.precision or ("bf16" if args.device == "cuda" else "fp32"),
        "steps": args.steps,
        "warmup": args.warmup,
        "max_length": max_length,
        "batch_size": args.batch_size,
        "accumulation": args.accumulation,
        "lr": args.lr,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "seed": args.seed,
        "dpo_beta": 0.1,
        "prompts_per_step": prompts_per_step,
        "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0,
        "reward_function": "benchmarks.vs_trl:length_reward",
        "ours_overrides": list(args.ours_set),
    }


# --------------------------------------------------------------------------- running and reporting


def run_side(side: str, python: str, spec_path: str, out_path: str, timeout: float) -> dict:
    from trainer_lib.engine.process_group import own_group_env

    env = {
        **own_group_env(),  # each side starts its own process group
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_DISABLED": "true",
    }
    proc = subprocess.run(
        [python, "-m", f"benchmarks.side_{side}", spec_path, out_path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0 or not os.path.exists(out_path):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise RuntimeError(f"{side} side failed (exit {proc.returncode}):\n{tail}")
    with open(out_path, encoding="utf-8") as f:
        return json.load(f)


def significant(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}"


def describe(side: str, r: dict) -> str:
    line = (
        f"{side:6s} {r['tokens_per_s']:10.1f} tok/s  peak {r['peak_memory_bytes'] / 2**20:8.1f} MiB  "
        f"loss {r['final_loss']:.4f}  MFU {100 * r['mfu']:.2f}% (peak {r['peak_flops'] / 1e9:.1f} GFLOP/s)  "
        f"{r['timed_steps']} timed steps in {r['seconds']:.2f}s"
    )
    if "generated_tokens_per_s" in r:
        line += f"  gen {r['generated_tokens_per_s']:.1f} tok/s  {r['prompts_per_s']:.2f} prompts/s"
    return line


def describe_profile(side: str, profile: dict) -> str:
    groups = ", ".join(
        f"{name} {100 * share:.0f}%"
        for name, share in sorted(profile["groups"].items(), key=lambda kv: -kv[1])
        if share >= 0.005
    )
    top = ", ".join(f"{name} {100 * share:.0f}%" for name, share in profile["top"][:5])
    return f"profile {side:6s} self CPU {profile['total_self_cpu_s']:.1f}s: {groups}; top ops: {top}"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_trl", description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=(*ALGOS, "all"), required=True, help="all: each stage in turn")
    p.add_argument("--json", help="write every round's figures and the medians here")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing (at most steps-1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--size",
        choices=(*SIZES, *REAL_MODELS, "suite"),
        default=None,
        help=f"default: small on cpu, 0.5b on cuda; suite: {', '.join(SUITE_SIZES)} in turn; "
        f"{', '.join(REAL_MODELS)}: the real checkpoint (make real-model) on real data (--data)",
    )
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"), help="real sizes' data folder")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default=None,
        help="both sides (default: fp32 on cpu, bf16 on cuda); bf16 on a CPU with AMX runs its matmuls there",
    )
    p.add_argument("--max-length", type=int, default=0, help="default: the size's (1024; tiny 128)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accumulation", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--prompts-per-step", type=int, default=4, help="GRPO")
    p.add_argument("--group-size", type=int, default=4, help="GRPO completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32, help="GRPO")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trl-python", default=os.path.join(ROOT, ".venv-bench", "bin", "python"))
    p.add_argument("--ours-only", action="store_true", help="skip TRL's side (no ratio line)")
    p.add_argument(
        "--ours-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a posttrain setting for our side, e.g. model.chunked_lm_head=false (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--profile", action="store_true", help="then one profiled run per side: where step time goes")
    args = p.parse_args(argv)
    args.size = args.size or ("0.5b" if args.device == "cuda" else "small")
    return args


def runs(args) -> list[argparse.Namespace]:
    """One set of arguments per (size, stage) that ``args`` names."""
    out = []
    for size in SUITE_SIZES if args.size == "suite" else (args.size,):
        for algo in ALGOS if args.algo == "all" else (args.algo,):
            one = argparse.Namespace(**{**vars(args), "size": size, "algo": algo})
            if algo == "grpo":
                one.accumulation = 1  # one optimizer step over all of a step's completions, on both sides
            if args.json and (args.size == "suite" or args.algo == "all"):
                one.json = f"{os.path.splitext(args.json)[0]}-{size}-{algo}.json"
            out.append(one)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    ratios = [(one.size, one.algo, run_one(one)) for one in runs(args)]
    if len(ratios) > 1:
        print("\nsize   stage   throughput ours/TRL  memory ours/TRL")
        for size, algo, ratio in ratios:
            if ratio:
                print(f"ratio size={size} algo={algo} throughput={ratio[0]} memory={ratio[1]}")
    return 0


def run_one(args) -> tuple[str, str] | None:
    """Run one (size, stage) side by side; ``(throughput ratio, memory ratio)`` as printed, or None."""
    sides = ["ours"] if args.ours_only else ["ours", "trl"]
    pythons = {"ours": sys.executable, "trl": args.trl_python}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as workdir:
        spec = build_workload(args, workdir)
        spec_path = os.path.join(workdir, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        print(
            f"{args.algo}: size {args.size}, {args.steps} steps ({spec['warmup']} warm-up), batch "
            f"{args.batch_size} x {args.accumulation}, max length {spec['max_length']}, device {args.device}, "
            f"{args.rounds} rounds, {time.strftime('%Y-%m-%d %H:%M')}",
            flush=True,
        )
        results: dict[str, list[dict]] = {side: [] for side in sides}
        for round_index in range(args.rounds):
            for side in sides:  # alternate: ours, theirs, ours, theirs, ...
                out = os.path.join(workdir, f"{side}-{round_index}.json")
                results[side].append(run_side(side, pythons[side], spec_path, out, args.timeout))
                print(f"round {round_index + 1} {describe(side, results[side][-1])}", flush=True)
        profiles = {}
        if args.profile:
            profiled_path = os.path.join(workdir, "spec-profiled.json")
            with open(profiled_path, "w", encoding="utf-8") as f:
                json.dump({**spec, "profile": True}, f)
            for side in sides:
                out = os.path.join(workdir, f"{side}-profiled.json")
                profiles[side] = run_side(side, pythons[side], profiled_path, out, args.timeout)["profile"]
                print(describe_profile(side, profiles[side]), flush=True)
    medians = {
        side: {key: statistics.median(r[key] for r in rs) for key in ("tokens_per_s", "peak_memory_bytes")}
        for side, rs in results.items()
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"args": vars(args), "spec": spec, "results": results, "medians": medians, "profiles": profiles},
                f,
                indent=1,
            )
    if args.ours_only:
        return None
    throughput = significant(medians["ours"]["tokens_per_s"] / medians["trl"]["tokens_per_s"])
    memory = significant(medians["ours"]["peak_memory_bytes"] / medians["trl"]["peak_memory_bytes"])
    print(f"ratio throughput={throughput} memory={memory}")
    return throughput, memory


if __name__ == "__main__":
    sys.exit(main())
