"""The code-style claim, reproduced in kind on the embedded default (``make demo-style``).

    python -m benchmarks.style_claim [--seed 0] [--root runs/style] [--sloppy 0.7] [--style-weight 1.0]
        [--rl-steps 100] [--min-gain 0.30] [--max-drop 0.02] [--reuse]

The demo's chain, through the stage CLIs: demo-data (the demo's settings), a style habit given to the
SFT teacher, tiny-model, prepare, SFT (the demo's recipe), GRPO from SFT with the rewards
``code_execution`` and ``code_style``, then one evaluation of SFT and GRPO on the 150 held-out code
tasks. The claim is the evaluation gate: ``style_compliance_rate >= baseline + min_gain`` and
``task_pass_rate >= baseline - max_drop`` with SFT the baseline. Prints SFT's and GRPO's compliance
rate, mean violations and task pass rate; exits 1 when the gate fails.

The demo's reference solutions are PEP 8 clean, so SFT on them leaves nothing to fix. Here the teacher
has one style habit, two-space indentation (pycodestyle E111), in ``--sloppy`` of its code
demonstrations (drawn answer by answer from the seed). Its code still runs: only the style reward
tells the habit from the clean answer. The held-out tasks and the RL prompts are untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

DEMO = [
    "n_code_train=2000",
    "n_code_rl=200",
    "n_code_pairs=500",
    "teacher_mistakes=0.7",
    "sft_topics=1.0",
    "n_safety_sft=200",
]
COMMON = ["batch_size=8", "data.max_length=256"]  # the demo's batch_size and max_length (GRPO: its own batch)
GRPO = [
    "lr=1e-4",
    "rollout.n=16",
    "rollout.max_new_tokens=48",
    "prompts_per_step=8",
    "rollout.temperature=0.6",
    "batch_size=32",
    "mini_batch_size=64",
    "lr_scheduler=constant",
    "beta=0.2",
]


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.style_claim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of the data, the model and every stage.")
    parser.add_argument("--root", default="runs/style", help="Where every stage's output goes.")
    parser.add_argument("--sloppy", type=float, default=0.7, help="Share of code demonstrations with 2-space indents.")
    parser.add_argument("--style-weight", type=float, default=1.0, help="Weight of code_style (code_execution: 1).")
    parser.add_argument("--sft-steps", type=int, default=900, help="SFT optimizer steps (the demo's: 900).")
    parser.add_argument("--rl-steps", type=int, default=100, help="GRPO steps.")
    parser.add_argument("--min-gain", type=float, default=0.30, help="Least rise of style_compliance_rate over SFT.")
    parser.add_argument("--max-drop", type=float, default=0.02, help="Most fall of task_pass_rate below SFT.")
    parser.add_argument("--reuse", action="store_true", help="Skip the stages whose output is already complete.")
    args = parser.parse_args(argv)
    if not 0 <= args.sloppy <= 1:
        parser.error(f"--sloppy: expected a share between 0 and 1, got {args.sloppy}")
    if args.rl_steps < 1 or args.sft_steps < 1:
        parser.error("--sft-steps, --rl-steps: expected positive integers")
    return args


def two_space(code: str) -> str:
    """``code`` with every indent halved: the teacher's habit (E111 on each line indented by 2 or 6)."""
    return re.sub(r"(?m)^((?:    )+)", lambda m: " " * (len(m.group(1)) // 2), code)


def add_style_habit(demo_dir: str, share: float, seed: int) -> int:
    """Re-indent ``share`` of the code answers in ``demo_dir/sft.jsonl`` (drawn by answer text and seed) and
    add the re-indented answers to ``corpus.txt`` for the tokenizer; returns how many were changed."""
    path = os.path.join(demo_dir, "sft.jsonl")
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    changed = []
    for row in rows:
        answer = row["messages"][-1]
        if answer["content"].startswith("def ") and random.Random(f"{seed}:style:{answer['content']}").random() < share:
            answer["content"] = two_space(answer["content"])
            changed.append(answer["content"])
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in rows)
    os.replace(path + ".tmp", path)
    with open(os.path.join(demo_dir, "corpus.txt"), "a", encoding="utf-8") as fh:
        fh.writelines(text + "\n" for text in dict.fromkeys(changed))
    return len(changed)


def stage(name: str, out: str, settings: list[str], reuse: bool) -> None:
    """``posttrain <name> settings... output_dir=out``, logged to ``out.log``; skipped when ``reuse`` and done."""
    stamp = out + ".done"
    if reuse and os.path.exists(stamp):
        print(f"style_claim: {name}: reused {out}")
        return
    shutil.rmtree(out, ignore_errors=True)
    started = time.time()
    with open(out + ".log", "w", encoding="utf-8") as log:
        command = [sys.executable, "-m", "trainer_lib.cli", name, *settings, f"output_dir={out}"]
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"style_claim: posttrain {name} failed; see {out}.log")
    open(stamp, "w").close()
    print(f"style_claim: {name}: {time.time() - started:.0f} s")


def run(args: argparse.Namespace) -> dict:
    """Every stage in turn; returns evaluate's metrics.json."""
    root, seed = args.root, f"seed={args.seed}"
    demo, base = os.path.join(root, "demo"), os.path.join(root, "base")
    data, prompts = os.path.join(root, "data"), os.path.join(root, "prompts")
    os.makedirs(root, exist_ok=True)
    if not (args.reuse and os.path.exists(demo + ".done")):
        stage("demo-data", demo, [seed, *DEMO], reuse=False)
        print(f"style_claim: {add_style_habit(demo, args.sloppy, args.seed)} code demonstrations re-indented")
        for folder, files in ((data, {"sft.jsonl": "sft.jsonl"}), (prompts, {"rl_prompts.jsonl": "train.jsonl"})):
            os.makedirs(folder, exist_ok=True)
            for source, target in files.items():
                shutil.copy(os.path.join(demo, source), os.path.join(folder, target))
        shutil.copy(os.path.join(demo, "code_tasks_eval.jsonl"), os.path.join(prompts, "eval.jsonl"))
    stage("tiny-model", base, [seed, f"corpus={demo}/corpus.txt"], args.reuse)
    prepared, sft, grpo = (os.path.join(root, name) for name in ("prepared", "sft", "grpo"))
    stage("prepare", prepared, [seed, f"data.path={data}", f"model.path={base}", "data.max_length=256"], args.reuse)
    tuned = [seed, f"model.path={base}", f"data.path={prepared}", *COMMON, "lr=1e-3", f"max_steps={args.sft_steps}"]
    stage("sft", sft, tuned, args.reuse)
    rewards = ["reward.functions=[code_execution,code_style]", f"reward.weights=[1.0,{args.style_weight}]"]
    rl = [seed, f"model.path={sft}", f"data.path={prompts}", *COMMON, *GRPO, *rewards, f"max_steps={args.rl_steps}"]
    stage("grpo", grpo, rl, args.reuse)
    rules = f"gate.rules=[style_compliance_rate>=baseline+{args.min_gain},task_pass_rate>=baseline-{args.max_drop}]"
    evaluation = [
        seed,
        f"models=[sft={sft},grpo={grpo}]",
        "candidate=grpo",
        "baseline=sft",
        f"tasks.path={demo}/code_tasks_eval.jsonl",
        "humaneval.enabled=false",
        rules,
    ]
    out = os.path.join(root, "eval")
    stage("evaluate", out, evaluation, reuse=False)
    with open(os.path.join(out, "metrics.json"), encoding="utf-8") as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    started = time.time()
    result = run(args)
    names = ("style_compliance_rate", "style_violations_mean", "task_pass_rate")
    print(f"\nheld-out code tasks (seed {args.seed}, {time.time() - started:.0f} s)")
    print(f"{'model':<6}" + "".join(f"{n:>24}" for n in names))
    for label in ("sft", "grpo"):
        print(f"{label:<6}" + "".join(f"{result['models'][label][n]:>24.3f}" for n in names))
    for rule in result["gate"]["rules"]:
        print(f"  {rule['rule']}: {rule['detail']}")
    passed = result["gate"]["passed"]
    print("the claim holds" if passed else "the claim does NOT hold", f"(report: {args.root}/eval/report.html)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
