"""Peak memory of PPO with one shared base (multi_adapter=true) against separate models.

    python -m benchmarks.multi_adapter_memory [--layers 8 --hidden 768] [--steps 2] [--json OUT]

Builds a Llama-style model from scratch (default about 80M parameters, with a BPE tokenizer trained
on a synthetic corpus), a LoRA reward model of it as the reward stage saves one with
lora.merge=false (random adapter weights) and the same reward model merged into a full
sequence-classification model. Then runs a few PPO steps three ways, each in a fresh process:

    multi_adapter   lora.r>0, multi_adapter=true: one frozen base; policy and value adapters, the
                    reference by disabling adapters, the reward model as a frozen adapter
    separate        lora.r=0: actor, critic, reference and reward model, four full models (the
                    critic starts from the reward model), actor and critic with AdamW states
    separate_lora   lora.r>0, multi_adapter=false: actor with LoRA (reference = adapters off),
                    critic = a copy of the reward model with LoRA, the full reward model

Every run scores with the same reward model (plus nothing else), same prompts, steps and seeds.
Reported per run: peak RSS of the child process (``getrusage``), and on CUDA also
``torch.cuda.max_memory_allocated``; then ``ratio multi_adapter/separate=...`` and
``multi_adapter/separate_lora=...``. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("multi_adapter", "separate", "separate_lora")
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega one two three four five six seven eight nine ten red green blue"
).split()


def build_models(root: str, layers: int, hidden: int, intermediate: int, seed: int = 0) -> dict:
    """Base causal LM, LoRA reward adapter (+ stats, tokenizer) and its merged full reward model."""
    import random

    import torch
    from transformers import AutoModelForSequenceClassification

    from trainer_lib.config import LoraConfig
    from trainer_lib.demo.tiny_model import build_tiny_llama, train_tokenizer
    from trainer_lib.models.heads import STATS_FILE, apply_reward_lora

    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) for _ in range(2000)]
    tokenizer = train_tokenizer(texts, vocab_size=2048)
    model = build_tiny_llama(
        tokenizer,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=hidden // 64,
        num_kv_heads=hidden // 64,
        intermediate_size=intermediate,
        seed=seed,
    )
    params = sum(p.numel() for p in model.parameters())
    paths = {name: os.path.join(root, name) for name in ("base", "rm_adapter", "rm_full")}
    model.save_pretrained(paths["base"])
    tokenizer.save_pretrained(paths["base"])
    del model

    reward = AutoModelForSequenceClassification.from_pretrained(paths["base"], num_labels=1)
    reward.config.pad_token_id = tokenizer.pad_token_id
    reward = apply_reward_lora(reward, LoraConfig(r=16, alpha=32))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in reward.named_parameters():
            if "lora_B" in name or "score" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    stats = json.dumps({"reward_mean": 0.0, "reward_std": 1.0})
    reward.save_pretrained(paths["rm_adapter"])
    merged = reward.merge_and_unload()
    merged.save_pretrained(paths["rm_full"])
    for name in ("rm_adapter", "rm_full"):
        tokenizer.save_pretrained(paths[name])
        with open(os.path.join(paths[name], STATS_FILE), "w", encoding="utf-8") as fh:
            fh.write(stats)

    paths["prompts"] = os.path.join(root, "prompts.jsonl")
    with open(paths["prompts"], "w", encoding="utf-8") as fh:
        for i in range(32):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 20))) + f" {i}"
            fh.write(json.dumps({"prompt": [{"role": "user", "content": question}]}) + "\n")
    return {"paths": paths, "parameters": params}


def ppo_args(mode: str, paths: dict, out: str, steps: int, device_bf16: bool) -> list[str]:
    args = [
        "ppo",
        f"model.path={paths['base']}",
        f"data.path={paths['prompts']}",
        f"output_dir={out}",
        "rollout.n=4",
        "prompts_per_step=4",
        "rollout.max_new_tokens=32",
        "batch_size=8",
        "ppo_epochs=1",
        f"max_steps={steps}",
        "save_steps=0",
        "logging_steps=1",
        "data.eval_fraction=0",
        "seed=1",
        "lr=1e-5",
    ]
    if device_bf16:
        args.append("engine.precision=bf16")
    if mode == "multi_adapter":
        return args + ["lora.r=16", "lora.alpha=32", "multi_adapter=true", f"reward.model_path={paths['rm_adapter']}"]
    if mode == "separate_lora":
        return args + ["lora.r=16", "lora.alpha=32", f"reward.model_path={paths['rm_full']}"]
    return args + [f"reward.model_path={paths['rm_full']}"]


def child(mode: str, paths: dict, out: str, steps: int, bf16: bool) -> None:
    """One PPO run in this process; prints its peak memory as JSON on the last line."""
    import resource

    import torch

    from trainer_lib.cli import main

    rc = main(ppo_args(mode, paths, out, steps, bf16))
    record = {"mode": mode, "rc": rc, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        record["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--bf16", action="store_true", help="engine.precision=bf16 (CUDA)")
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, json.loads(args.paths), args.out, args.steps, args.bf16)
        return 0

    with tempfile.TemporaryDirectory(prefix="multi_adapter_memory_") as root:
        built = build_models(root, args.layers, args.hidden, args.intermediate)
        print(
            f"model: {built['parameters'] / 1e6:.1f}M parameters ({args.layers} layers, hidden {args.hidden})",
            flush=True,
        )
        records = {}
        for mode in args.modes.split(","):
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.multi_adapter_memory",
                "--child",
                mode,
                "--steps",
                str(args.steps),
                "--paths",
                json.dumps(built["paths"]),
                "--out",
                os.path.join(root, mode),
            ]
            if args.bf16:
                cmd.append("--bf16")
            env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                return 1
            records[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(records[mode]), flush=True)
    key = "cuda_peak_mb" if all("cuda_peak_mb" in r for r in records.values()) else "peak_rss_mb"
    ratios = {
        f"multi_adapter/{other}": records["multi_adapter"][key] / records[other][key]
        for other in ("separate", "separate_lora")
        if other in records and "multi_adapter" in records
    }
    print("ratio " + " ".join(f"{name}={value:.3f}" for name, value in ratios.items()) + f" ({key})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {"parameters": built["parameters"], "records": records, "ratios": ratios, "measure": key}, fh, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
