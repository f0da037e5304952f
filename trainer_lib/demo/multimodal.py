"""The embedded multimodal demo (``make demo-multimodal``): GRPO with a CLIP reward raises image-text match.

    python -m trainer_lib.demo.multimodal --seed 0 --out runs/multimodal

Offline and deterministic, from one seed:

1. Synthetic product pictures (:mod:`trainer_lib.demo.multimodal_images`) in four disjoint splits.
2. Two tiny CLIPs (:mod:`trainer_lib.demo.multimodal_clip`): the reward CLIP on one split, the held-out
   scorer (another seed) on another. The metric is the scorer's, so the policy is never judged by the
   reward it optimised.
3. The policy, a tiny text Llama (what ``posttrain tiny-model`` builds), SFT-trained (``posttrain sft``)
   on a teacher's captions with a consistent mistake: it calls blue products green and yellow ones red
   in ``--mistakes`` of its captions. The prompt gives the product's listed attributes in words, so SFT
   learns the teacher's habit along with the task.
4. GRPO from the SFT model (``posttrain grpo reward.clip_path=<reward CLIP>``) on the same products'
   prompts, with their pictures in the ``images`` column.
5. Both models caption the held-out products greedily; :mod:`trainer_lib.eval.image_text_match` gives the
   retrieval accuracy among ``--distractors`` other held-out pictures and the mean CLIP score.

The policy is text-only: a vision-language policy (image tokens through a vision tower at every rollout
and every training step) does not fit the 10-minute, 2-core budget, and posttrain does not yet train one
(docs/multimodal.md). The picture reaches the policy only through the reward.

Writes ``OUT/metrics.json`` (the evaluate stage's layout: ``{"models": {"sft": {...}, "grpo": {...},
"true_captions": {...}}, "candidate", "baseline", "gate", ...}``) and prints the table; exits 1 when the
gate ``image_text_match_accuracy>=baseline+<--min-gain>`` (:mod:`trainer_lib.eval.gate`) fails. SFT and
GRPO run as ``python -m trainer_lib.cli`` in subprocesses, logged to ``OUT/<stage>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

#: the teacher's consistent mistakes: the colour it writes instead of the true one.
CONFUSIONS = {"blue": "green", "yellow": "red"}
SFT = ["batch_size=16", "lr=1e-3", "data.max_length=64", "data.eval_fraction=0", "save_steps=0", "logging_steps=20"]
GRPO = [
    "rollout.n=8",
    "prompts_per_step=8",
    "rollout.max_new_tokens=8",
    "rollout.temperature=1.0",
    "batch_size=64",
    "mini_batch_size=64",
    "lr_scheduler=constant",
    "beta=0.04",
    "data.eval_fraction=0",
    "save_steps=0",
    "logging_steps=5",
]


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_lib.demo.multimodal", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of the pictures, the models and every stage.")
    parser.add_argument("--out", default="runs/multimodal", help="Where everything goes (replaced).")
    parser.add_argument(
        "--mistakes", type=float, default=0.7, help="Share of blue/yellow captions the teacher gets wrong."
    )
    parser.add_argument("--clip-steps", type=int, default=1500, help="Training steps of each tiny CLIP.")
    parser.add_argument("--sft-steps", type=int, default=300, help="SFT optimizer steps.")
    parser.add_argument("--rl-steps", type=int, default=40, help="GRPO steps.")
    parser.add_argument("--rl-lr", type=float, default=5e-4, help="GRPO learning rate.")
    parser.add_argument("--distractors", type=int, default=4, help="Distractor pictures per held-out pair (K).")
    parser.add_argument("--min-gain", type=float, default=0.15, help="Least rise of match accuracy over SFT.")
    parser.add_argument("--sizes", default="", help="Pictures per split: reward_clip,scorer_clip,policy,heldout.")
    args = parser.parse_args(argv)
    if not 0 <= args.mistakes <= 1:
        parser.error(f"--mistakes: expected a share between 0 and 1, got {args.mistakes}")
    sizes = args.sizes.split(",") if args.sizes else []
    if sizes and (len(sizes) != 4 or not all(n.isdigit() and int(n) >= 12 for n in sizes)):
        parser.error(f"--sizes: expected four counts of at least 12 (one per split), got {args.sizes!r}")
    if os.path.isdir(args.out) and os.listdir(args.out) and not os.path.isdir(os.path.join(args.out, "pictures")):
        parser.error(f"--out: {args.out} holds something other than an earlier demo run; it would be replaced")
    return args


def prompt_text(record: dict) -> str:
    """The listing the policy sees: the product's attributes in words (it never sees the picture)."""
    return f"Listing: colour {record['colour']}, shape {record['shape']}. Write the caption."


def teacher_caption(record: dict, mistakes: float, rng: random.Random) -> str:
    """The true description, or with the teacher's colour mistake (``CONFUSIONS``) in ``mistakes`` of cases."""
    colour = record["colour"]
    if colour in CONFUSIONS and rng.random() < mistakes:
        colour = CONFUSIONS[colour]
    return f"a {colour} {record['shape']}"


def write_policy_data(out: str, records: list[dict], mistakes: float, seed: int) -> dict:
    """``sft.jsonl`` (teacher captions), ``prompts.jsonl`` (GRPO prompts) and the tokenizer's ``corpus.txt``
    under ``out``; every row carries its picture in ``images``. Returns the files and the mistake count.

    The picture also keeps the rows apart for the data layer's duplicate filter, which hashes images:
    without it the 480 rows would be 12 listings with two captions each, and the teacher's 70% would be
    lost."""
    rng = random.Random(f"{seed}:teacher")
    files = {name: os.path.join(out, name) for name in ("sft.jsonl", "prompts.jsonl", "corpus.txt")}
    wrong, corpus = 0, []
    with (
        open(files["sft.jsonl"], "w", encoding="utf-8") as sft,
        open(files["prompts.jsonl"], "w", encoding="utf-8") as rl,
    ):
        for record in records:
            user = {"role": "user", "content": prompt_text(record)}
            caption = teacher_caption(record, mistakes, rng)
            wrong += caption != record["text"]
            messages = [user, {"role": "assistant", "content": caption}]
            sft.write(json.dumps({"messages": messages, "images": [record["image"]]}) + "\n")
            rl.write(json.dumps({"prompt": [user], "images": [record["image"]]}) + "\n")
            corpus += [user["content"], caption, record["text"]]
    with open(files["corpus.txt"], "w", encoding="utf-8") as fh:
        fh.writelines(line + "\n" for line in corpus)
    return {**files, "teacher_mistakes": wrong}


def stage(name: str, out: str, settings: list[str]) -> float:
    """``posttrain <name> settings... output_dir=out`` in a subprocess logged to ``out.log``; its seconds."""
    started = time.time()
    with open(out + ".log", "w", encoding="utf-8") as log:
        command = [sys.executable, "-m", "trainer_lib.cli", name, *settings, f"output_dir={out}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny ops: a second thread only spin-waits on 2 cores
        env["HF_HUB_OFFLINE"] = "1"  # everything is local: never ask the hub
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode != 0:
            sys.exit(f"multimodal demo: posttrain {name} failed; see {out}.log")
    seconds = time.time() - started
    print(f"multimodal demo: {name}: {seconds:.0f} s", flush=True)
    return seconds


def captions(model_dir: str, records: list[dict], max_new_tokens: int = 12) -> list[str]:
    """Greedy captions of ``records``' listings by the causal LM in ``model_dir``."""
    from trainer_lib.eval.generation import load_torch_engine

    engine = load_torch_engine(model_dir, "fp32", "cpu")
    tokenizer = engine.tokenizer
    prompt_ids = []
    for record in records:
        chat = [{"role": "user", "content": prompt_text(record)}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    texts = []
    for start in range(0, len(prompt_ids), 64):
        texts += engine.generate(prompt_ids[start : start + 64], max_new_tokens=max_new_tokens, temperature=0.0)
    engine.close()
    return [t.strip() for t in texts]


def evaluate(models: dict[str, str], scorer_dir: str, heldout: list[dict], k: int, seed: int) -> dict:
    """The image-text match of every model's held-out captions, and of the true captions (the scorer's
    ceiling), under the held-out scorer; ``{label: metrics}`` plus a few captions of each."""
    from trainer_lib.eval.image_text_match import image_text_match
    from trainer_lib.rewards.clip import ClipScorer

    scorer = ClipScorer(scorer_dir, batch_size=64)
    refs = [{"bytes": None, "path": r["image"]} for r in heldout]
    labels = [r["text"] for r in heldout]
    texts = {label: captions(path, heldout) for label, path in models.items()}
    texts["true_captions"] = labels
    results = {}
    for label, written in texts.items():
        metrics = image_text_match(scorer, written, refs, labels, k, seed)
        metrics["caption_exact"] = sum(a == b for a, b in zip(written, labels)) / len(labels)
        results[label] = {**metrics, "examples": [[t, w] for t, w in zip(labels[:6], written[:6])]}
    return results


def run(args: argparse.Namespace) -> dict:
    """Every step in turn (module doc); returns what goes into metrics.json."""
    import torch
    from transformers.utils import logging as hf_logging

    from trainer_lib.demo.multimodal_clip import train_tiny_clip
    from trainer_lib.demo.multimodal_images import SPLITS, make_splits
    from trainer_lib.demo.tiny_model import make_tiny_model, read_corpus

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # e.g. CLIPImageProcessor's note that torchvision is not installed
    out, seed, timings = args.out, args.seed, {}
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    started = time.time()
    sizes = dict(zip(SPLITS, map(int, args.sizes.split(",")))) if args.sizes else None
    splits = make_splits(os.path.join(out, "pictures"), seed, sizes)
    data = write_policy_data(out, splits["policy"], args.mistakes, seed)
    timings["pictures"] = time.time() - started
    clips = {}
    for offset, name in enumerate(("reward_clip", "scorer_clip")):
        began = time.time()
        clips[name] = train_tiny_clip(splits[name], os.path.join(out, name), seed * 10 + offset, args.clip_steps)
        timings[name] = time.time() - began
        print(f"multimodal demo: {name}: loss {clips[name]['loss_first']:.2f} -> {clips[name]['loss_last']:.2f}")
    paths = {name: os.path.join(out, name) for name in ("base", "sft", "grpo")}
    began = time.time()  # what `posttrain tiny-model` does, in this process (one interpreter start less)
    make_tiny_model(paths["base"], read_corpus(data["corpus.txt"]), vocab_size=1024, hidden_size=128, seed=seed)
    timings["tiny-model"] = time.time() - began
    sft = [f"seed={seed}", f"model.path={paths['base']}", f"data.path={data['sft.jsonl']}", *SFT]
    timings["sft"] = stage("sft", paths["sft"], [*sft, f"max_steps={args.sft_steps}"])
    rl = [f"seed={seed}", f"model.path={paths['sft']}", f"data.path={data['prompts.jsonl']}", *GRPO]
    rl += [f"reward.clip_path={os.path.join(out, 'reward_clip')}", f"lr={args.rl_lr}", f"max_steps={args.rl_steps}"]
    timings["grpo"] = stage("grpo", paths["grpo"], rl)
    began = time.time()
    models = {"sft": paths["sft"], "grpo": paths["grpo"]}
    results = evaluate(models, os.path.join(out, "scorer_clip"), splits["heldout"], args.distractors, seed)
    timings["evaluate"] = time.time() - began
    timings["total"] = time.time() - started
    return {
        "models": results,
        "candidate": "grpo",
        "baseline": "sft",
        "seed": seed,
        "data": {name: len(records) for name, records in splits.items()},
        "teacher_mistakes": data["teacher_mistakes"],
        "clips": clips,
        "seconds": {key: round(value, 1) for key, value in timings.items()},
    }


def table(result: dict) -> str:
    """The results as a small text table."""
    lines = [f"{'model':<14}{'match accuracy':>16}{'clip score':>12}{'exact captions':>16}"]
    for label, m in result["models"].items():
        acc, clip, exact = m["image_text_match_accuracy"], m["clip_score_mean"], m["caption_exact"]
        lines.append(f"{label:<14}{acc:>16.3f}{clip:>12.3f}{exact:>16.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from trainer_lib.eval.gate import evaluate_gate, parse_rules

    args = arguments(argv)
    result = run(args)
    sft, grpo = (result["models"][k]["image_text_match_accuracy"] for k in ("sft", "grpo"))
    result["gain"] = grpo - sft
    rules = parse_rules([f"image_text_match_accuracy>=baseline+{args.min_gain}"])  # the evaluate stage's gate
    result["gate"] = evaluate_gate(rules, result["models"], candidate="grpo", baseline="sft")
    result["passed"] = result["gate"]["passed"]
    with open(os.path.join(args.out, "metrics.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    k = args.distractors
    pairs, seconds = result["data"]["heldout"], result["seconds"]["total"]
    print(f"\nheld-out products (seed {args.seed}, {pairs} pairs, K={k}, chance {1 / (k + 1):.2f}, {seconds:.0f} s)")
    print(table(result))
    verdict = "holds" if result["passed"] else "does NOT hold"
    print(f"GRPO - SFT = {result['gain']:+.3f}; gate {result['gate']['rules'][0]['detail']}")
    print(f"the claim (GRPO >= SFT {args.min_gain:+.2f}) {verdict} ({args.out}/metrics.json)")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: the demo is offline
    sys.exit(main())
