"""Fixed-seed fingerprints of every stage, to prove that a refactoring changed no behaviour.

    python -m benchmarks.stage_fingerprints --out before.json     # on the old tree
    python -m benchmarks.stage_fingerprints --out after.json      # on the new tree
    python -m benchmarks.stage_fingerprints --compare before.json after.json

Runs through the CLI only (``posttrain <stage> key=value``), so it works on any layout of
``trainer_lib``: the demo data and a tiny model, then SFT, reward, DPO (sigmoid; precomputed
reference with IPO), GRPO, RLOO with a reward model over 2 epochs, PPO with a critic, PPO with
shared adapters, evaluation and export, each a few steps with seed 0 in one process, one thread.
A fingerprint is the sha256 of every weight file a stage wrote and every logged metric (timing
keys left out). Takes about 4 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

TIMING = ("_per_s", "_time", "time", "elapsed", "seconds")
WEIGHTS = (".safetensors", ".onnx", ".bin", ".data")


def posttrain(*args: str) -> None:
    env = {**os.environ, "POSTTRAIN_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = os.path.join(os.path.dirname(sys.executable), "posttrain")  # the installed console command
    proc = subprocess.run([command, *args], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"posttrain {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _plain(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(k.endswith(t) for t in TIMING)}


def fingerprint(directory: str) -> dict:
    """sha256 of the weight files, and the logged metrics without timing keys."""
    out: dict = {"files": {}, "metrics": []}
    for folder, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, directory)
            if name.endswith(WEIGHTS) and "checkpoint" not in rel:
                with open(path, "rb") as fh:
                    out["files"][rel] = hashlib.sha256(fh.read()).hexdigest()
            elif name == "metrics.jsonl":
                with open(path, encoding="utf-8") as fh:
                    out["metrics"] += [_plain(json.loads(line)) for line in fh if line.strip()]
    return out


def evaluation(directory: str) -> dict:
    with open(os.path.join(directory, "metrics.json"), encoding="utf-8") as fh:
        metrics = json.load(fh)
    samples = os.path.join(directory, "per_problem")
    hashes = {
        name: hashlib.sha256(open(os.path.join(samples, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(samples))
    }
    return {"models": metrics.get("models"), "gate": metrics.get("gate"), "samples": hashes}


def run_all(root: str, only: set[str] | None = None) -> dict:
    data, model = os.path.join(root, "data"), os.path.join(root, "tiny")
    common = ["seed=0", "max_length=128", "logging_steps=1", "save_steps=0"]
    posttrain(
        "demo-data",
        f"output_dir={data}",
        "n_code_train=120",
        "n_code_eval=10",
        "n_safety_train=40",
        "n_safety_eval=10",
        "n_safety_sft=20",
        "n_code_rl=16",
        "teacher_mistakes=0.5",
    )
    posttrain("tiny-model", f"corpus={data}/corpus.txt", f"output_dir={model}", "vocab_size=400", "hidden_size=64")
    out = {
        "demo-data": {
            name: hashlib.sha256(open(os.path.join(data, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(data))
        }
    }
    rl = "model.path=@sft data.path=@data/code_tasks.jsonl prompts_per_step=2 rollout.max_new_tokens=12"
    runs = {  # the stage, then its keys; @data, @tiny, @sft and @reward stand for those directories
        "sft": "sft model.path=@tiny data.path=@data/sft.jsonl max_steps=8 lr=1e-3 batch_size=4 eval_steps=4",
        "reward": "reward model.path=@tiny data.path=@data/preferences.jsonl max_steps=6 batch_size=4",
        "dpo": "dpo model.path=@sft data.path=@data/preferences.jsonl max_steps=6 batch_size=4 rpo_alpha=0.5",
        "dpo-ipo-precomputed": "dpo model.path=@sft data.path=@data/preferences.jsonl max_steps=4 batch_size=4 "
        "loss=ipo reference=precomputed",
        "grpo": f"grpo {rl} max_steps=3 rollout.n=4 batch_size=4 reward.functions=length_penalty,code_execution "
        "reward.sandbox_workers=1",
        "rloo": f"grpo {rl} max_steps=2 advantage=rloo rollout.n=4 batch_size=4 ppo_epochs=2 mini_batch_size=4 "
        "reward.model_path=@reward reward.functions=length_penalty",
        "ppo": f"ppo {rl} max_steps=3 rollout.n=2 batch_size=2 ppo_epochs=2 reward.model_path=@reward "
        "freeze_actor_steps=1 kl.adaptive=true",
        "ppo-multi-adapter": f"ppo {rl} max_steps=3 rollout.n=2 batch_size=2 multi_adapter=true lora.r=4 "
        "reward.functions=length_penalty freeze_actor_steps=1 critic_lr=2e-4",
    }
    places = {"@data": data, "@tiny": model, "@sft": os.path.join(root, "sft"), "@reward": os.path.join(root, "reward")}
    needed = None if only is None else only | {"sft", "reward"}  # every later stage starts from these two
    if needed is not None and "evaluate" in needed:
        needed |= {"dpo", "grpo"}  # the models it evaluates
    for name, line in runs.items():
        if needed is not None and name not in needed:
            continue
        for place, path in places.items():
            line = line.replace(place, path)
        stage, *keys = line.split()
        target = os.path.join(root, name)
        posttrain(stage, *common, *keys, f"output_dir={target}")
        out[name] = fingerprint(target)
        print(f"{name}: {len(out[name]['files'])} files, {len(out[name]['metrics'])} metric records", flush=True)
    if only is not None and "evaluate" not in only:
        return out
    models = ",".join([f"base={model}"] + [f"{m}={os.path.join(root, m)}" for m in ("sft", "dpo", "grpo")])
    posttrain(
        "evaluate",
        f"models={models}",
        "baseline=sft",
        f"data_dir={data}",
        "humaneval.limit=2",
        "humaneval.n=2",
        "humaneval.k=[1]",
        "humaneval.max_new_tokens=16",
        "tasks.max_new_tokens=24",
        "safety.max_new_tokens=16",
        f"reward_model_path={os.path.join(root, 'reward')}",
        "sandbox_workers=1",
        f"output_dir={os.path.join(root, 'evaluate')}",
    )
    out["evaluate"] = evaluation(os.path.join(root, "evaluate"))
    posttrain("export", f"model_path={os.path.join(root, 'sft')}", f"output_dir={os.path.join(root, 'export')}")
    out["export"] = fingerprint(os.path.join(root, "export"))
    return out


def compare(before: dict, after: dict) -> int:
    """Stages run on both sides compared; those run on one side only are listed as such."""
    both = sorted(set(before) & set(after))
    differ = [name for name in both if before[name] != after[name]]
    for name in sorted(set(before) | set(after)):
        print(f"{name:22s} {'DIFFERS' if name in differ else 'same' if name in both else 'run on one side only'}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the fingerprints here (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--keep", help="run in this directory and keep it")
    parser.add_argument(
        "--only",
        help="comma-separated runs (sft and reward always run: the others start from them; "
        "evaluate, which also needs dpo and grpo, runs only when named)",
    )
    args = parser.parse_args()
    if args.compare:
        loaded = [json.load(open(path, encoding="utf-8")) for path in args.compare]
        return compare(*loaded)
    only = set(args.only.split(",")) if args.only else None
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        result = run_all(args.keep, only)
    else:
        with tempfile.TemporaryDirectory() as root:
            result = run_all(root, only)
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
