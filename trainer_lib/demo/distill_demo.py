"""On-policy distillation against SFT on the teacher's samples, on the embedded demo (issue 45).

    python -m trainer_lib.demo.distill_demo DEMO_RUN --out OUT --seed 0

From a finished ``make demo`` run (``runs/demo/posttrain-all-*``), with its GRPO model as the teacher:

1. The student: a tiny Llama of at most half the teacher's parameters with the teacher's own tokenizer
   (:func:`build_student`; ``posttrain distill`` refuses any other), SFT-trained on the demo's SFT data at
   the demo SFT stage's settings (steps, learning rate, batch size, length), so that both arms start from
   a model that already answers in the demo's format. One change: the learning rate, 3e-3 instead of the
   demo's 1e-3, at which the smaller model learned too little (``--student-lr``).
2. Arm A, ``posttrain distill``: the student samples ``--n`` completions of ``--prompts-per-step`` of the
   demo's RL prompts (the 200 code tasks GRPO trained on) each step, and is trained on the per-token
   divergence to the teacher (GKD's reverse KL at ``--beta 1``).
3. Arm B, ``posttrain sft`` on the teacher's samples of the same prompts: as many sequences per prompt as
   arm A samples over its run (:func:`teacher_samples`), the same sequences per optimizer step and the same
   number of optimizer steps.
4. ``posttrain evaluate`` scores student, both arms and the teacher on the demo's held-out code tasks: the
   task pass rate of the greedy answers (as the demo's evaluation), and the pass rate over ``--samples``
   answers per task sampled at the arms' temperature (``tasks.samples``), the one the goal is judged on:
   it is what the student's own samples are worth (to an RL stage after it, say), and averaging 8 answers
   a task takes out most of the noise of one greedy answer flipping.

Writes ``OUT/report.json`` and prints a markdown table. Each stage runs as ``python -m trainer_lib.cli``
in a subprocess logged to ``OUT/<name>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from trainer_lib.demo.stage_runs import demo_stages, posttrain

#: the student's shape: the demo's teacher is 2 layers of width 128 (623k parameters); this is 2 layers of
#: width 96 with a narrower MLP, about 0.48 of it.
STUDENT_SHAPE = {"num_layers": 2, "hidden_size": 96, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_lib.demo.distill_demo", description=__doc__.split("\n")[0])
    parser.add_argument("demo_run", help="a finished make demo run (runs/demo/posttrain-all-*)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="the student's init, its SFT, both arms and sampling")
    # 32 prompts x 1 sample a step: arm A's per-token divergence needs no group of samples per prompt, and more
    # prompts a step steady its updates; arm B's data is the same either way (16 samples a prompt at 100 steps)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps of each arm")
    parser.add_argument("--prompts-per-step", type=int, default=32, help="prompts per step of each arm")
    parser.add_argument("--n", type=int, default=1, help="sequences per prompt per step (arm A's rollout.n)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of both arms (constant)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of student and teacher")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="longest sampled completion (the demo's)")
    parser.add_argument("--samples", type=int, default=8, help="sampled answers per held-out task (evaluate)")
    parser.add_argument("--beta", type=float, default=1.0, help="distill's beta: 1 reverse KL, 0 forward KL")
    parser.add_argument("--lmbda", type=float, default=1.0, help="distill's lmbda (1: on-policy only)")
    parser.add_argument("--student", default="", help="an SFT-trained student from an earlier run: skips step 1")
    parser.add_argument(
        "--student-shape",
        type=shape_argument,
        default=",".join(str(v) for v in STUDENT_SHAPE.values()),
        help="the student's layers,width,heads,kv_heads,mlp (default: %(default)s, 0.48 of the teacher)",
    )
    parser.add_argument("--student-steps", type=int, default=0, help="the student's SFT steps (0: the demo's)")
    # at the demo's 1e-3 the half-size student ended at eval loss 0.55 and task pass 0.01 (seed 0); at 3e-3, 0.09
    parser.add_argument("--student-lr", type=float, default=3e-3, help="the student SFT learning rate (0: the demo's)")
    return parser.parse_args(argv)


def shape_argument(text: str) -> dict:
    """``layers,width,heads,kv_heads,mlp`` as build_tiny_llama's keyword arguments."""
    values = [int(v) for v in text.split(",")]
    if len(values) != len(STUDENT_SHAPE):
        raise argparse.ArgumentTypeError(f"expected {len(STUDENT_SHAPE)} integers, got {text!r}")
    return dict(zip(STUDENT_SHAPE, values))


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def build_student(teacher_dir: str, out_dir: str, seed: int, shape: dict | None = None) -> dict:
    """A random tiny Llama of ``shape`` with the teacher's tokenizer (and chat template), saved to ``out_dir``.

    Returns the two parameter counts and the two tokenizers' fingerprints (``models/teacher.py``'s hash,
    the one ``posttrain distill`` compares)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.demo.tiny_model import build_tiny_llama
    from trainer_lib.models.teacher import tokenizer_fingerprint

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    student = build_tiny_llama(tokenizer, seed=seed, **(shape or STUDENT_SHAPE))
    student.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    with_meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(teacher_dir))
    return {
        "student_parameters": parameter_count(student),
        "teacher_parameters": parameter_count(with_meta),
        "student_tokenizer": tokenizer_fingerprint(AutoTokenizer.from_pretrained(out_dir)),
        "teacher_tokenizer": tokenizer_fingerprint(tokenizer),
    }


def teacher_samples(teacher_dir: str, prompts_path: str, out_path: str, n: int, args: argparse.Namespace) -> int:
    """``n`` sampled completions of each prompt of ``prompts_path`` by the teacher, written as
    ``prompt_completion`` rows (the assistant's turn as the completion); the number written."""
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.eval.generation import load_torch_engine

    engine = load_torch_engine(teacher_dir, "fp32", "cpu")
    rows = [json.loads(line) for line in open(prompts_path, encoding="utf-8")]
    written = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for start in range(0, len(rows), 8):
            chunk = rows[start : start + 8]
            prompt_ids = [encode_prompt(engine.tokenizer, row["prompt"], row.get("tools")) for row in chunk]
            texts = engine.generate(
                prompt_ids,
                n=n,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                seed=args.seed + start,
            )
            for i, text in enumerate(texts):  # n completions per prompt, prompt by prompt
                row = chunk[i // n]
                out.write(json.dumps({"prompt": row["prompt"], "completion": [{"role": "assistant", "content": text}]}))
                out.write("\n")
                written += 1
    engine.close()
    return written


def stage(name: str, label: str, out: str, settings: list[str]) -> float:
    """``posttrain <name>`` into ``out``, logged to ``out/../<label>.log``; its seconds."""
    return posttrain(name, out, settings, "distill demo", label)


def student_sft(out: str, student: str, sft: dict, args: argparse.Namespace) -> float:
    """The student's SFT on the demo's SFT data at the demo SFT stage's settings; its seconds."""
    return stage(
        "sft",
        "student_sft",
        student,
        [
            f"model.path={out}/student_init",
            f"data.path={sft['data.path']}",
            f"data.max_length={sft['data.max_length']}",
            f"max_steps={args.student_steps or sft['max_steps']}",
            f"lr={args.student_lr or sft['lr']}",
            f"batch_size={sft['batch_size']}",
            "save_steps=0",
            "eval_steps=0",
            f"seed={args.seed}",
        ],
    )


def count_rows(path: str) -> int:
    with open(path, encoding="utf-8") as fh:
        return sum(1 for _ in fh)


def distill_arm(out: str, student: str, teacher: str, prompts: str, common: list[str], args) -> float:
    """Arm A: ``posttrain distill`` from the student with the teacher on the prompts; its seconds."""
    return stage(
        "distill",
        "distill",
        os.path.join(out, "distill"),
        [
            f"model.path={student}",
            f"teacher.path={teacher}",
            f"data.path={prompts}",
            f"prompts_per_step={args.prompts_per_step}",
            f"rollout.n={args.n}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"rollout.temperature={args.temperature}",
            f"beta={args.beta}",
            f"lmbda={args.lmbda}",
            *common,
        ],
    )


def sft_arm(out: str, student: str, samples: str, common: list[str], seed: str) -> float:
    """Arm B: ``posttrain sft`` from the student on the teacher's samples; its seconds (prepare's too).

    The training stages drop duplicate rows; prepare keeps them, so that arm B sees the teacher's samples
    as drawn (a frequent answer weighs as often as the teacher drew it), each of them once."""
    prepared = os.path.join(out, "teacher_samples_prepared")
    prepare_args = [f"data.path={samples}", "data.eval_fraction=0", "drop_duplicates=false", seed]
    seconds = stage("prepare", "teacher_samples_prepare", prepared, prepare_args)
    sft_args = [f"model.path={student}", f"data.path={prepared}", "data.packing=false", *common]
    return seconds + stage("sft", "sft_on_teacher", os.path.join(out, "sft_on_teacher"), sft_args)


def evaluate_all(out: str, labels: dict[str, str], demo: str, seed: str, args: argparse.Namespace) -> float:
    """``posttrain evaluate`` of the models on the demo's held-out code tasks, greedy and ``args.samples``
    sampled answers a task at the arms' temperature; its seconds."""
    return stage(
        "evaluate",
        "evaluate",
        os.path.join(out, "eval"),
        [
            "models=[" + ",".join(f"{k}={v}" for k, v in labels.items()) + "]",
            "candidate=distill",
            "baseline=sft_on_teacher",
            f"tasks.path={demo}/code_tasks_eval.jsonl",
            "tasks.limit=150",
            f"tasks.samples={args.samples}",
            f"tasks.temperature={args.temperature}",
            "humaneval.enabled=false",
            seed,
        ],
    )


def run(args: argparse.Namespace) -> dict:
    out, demo = os.path.abspath(args.out), os.path.join(args.demo_run, "bootstrap", "demo")
    stages = demo_stages(args.demo_run)
    teacher, sft = stages["grpo"]["dir"], stages["sft"]
    prompts = os.path.join(demo, "rl_prompts.jsonl")
    os.makedirs(out, exist_ok=True)
    times, seed = {}, f"seed={args.seed}"

    # 1. the student, SFT-trained as the demo's SFT stage trains the teacher's ancestor
    shapes = build_student(teacher, os.path.join(out, "student_init"), args.seed, args.student_shape)
    if shapes["student_parameters"] * 2 > shapes["teacher_parameters"]:
        sys.exit(f"distill demo: the student is more than half the teacher: {shapes}")
    student = os.path.join(out, "student")
    if args.student:  # a student SFT-trained before (tuning the arms on one seed)
        student, times["student_sft"] = os.path.abspath(args.student), 0.0
    else:
        times["student_sft"] = student_sft(out, student, sft, args)

    # 2. arm A: on-policy distillation from the GRPO teacher on the RL prompts
    sequences = args.prompts_per_step * args.n
    common = [f"max_steps={args.steps}", f"lr={args.lr}", "lr_scheduler=constant", "save_steps=0", seed]
    common += ["data.eval_fraction=0", "eval_steps=0", f"batch_size={sequences}"]
    times["distill"] = distill_arm(out, student, teacher, prompts, common, args)
    # 3. arm B: SFT on the teacher's samples of the same prompts, as many sequences per step and steps
    started = time.time()
    samples = os.path.join(out, "teacher_samples.jsonl")
    written = teacher_samples(teacher, prompts, samples, -(-args.steps * sequences // count_rows(prompts)), args)
    times["teacher_samples"] = time.time() - started
    times["sft_on_teacher"] = sft_arm(out, student, samples, common, seed)
    # 4. the held-out task pass rate of all four, as the demo's evaluation measures it
    labels = {"student": student, "distill": f"{out}/distill", "sft_on_teacher": f"{out}/sft_on_teacher"}
    labels["teacher"] = teacher
    times["evaluate"] = evaluate_all(out, labels, demo, seed, args)
    metrics = json.load(open(os.path.join(out, "eval", "metrics.json"), encoding="utf-8"))["models"]
    report = {
        "seed": args.seed,
        "demo_run": os.path.abspath(args.demo_run),
        "teacher": teacher,
        **shapes,
        "student_shape": args.student_shape,
        "settings": {k: v for k, v in vars(args).items() if k not in ("demo_run", "out")},
        "student_sft": {
            "steps": args.student_steps or sft["max_steps"],
            "lr": args.student_lr or sft["lr"],
            "batch_size": sft["batch_size"],
            "max_length": sft["data.max_length"],
            "data": sft["data.path"],
        },
        "teacher_samples": written,
        "task_pass_rate": {label: metrics[label]["task_pass_rate"] for label in labels},
        "task_sampled_pass_rate": {label: metrics[label]["task_sampled_pass_rate"] for label in labels},
        "times_s": {k: round(v, 1) for k, v in times.items()},
    }
    greedy, sampled = report["task_pass_rate"], report["task_sampled_pass_rate"]
    report["greedy_gain"] = greedy["distill"] - greedy["sft_on_teacher"]
    report["gain"] = sampled["distill"] - sampled["sft_on_teacher"]
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    return report


def table(report: dict) -> str:
    """The report as a markdown table."""
    samples = report["settings"]["samples"]
    lines = [f"| model | task pass rate (greedy) | task pass rate ({samples} sampled answers a task) |"]
    lines.append("|---|---|---|")
    for label, rate in report["task_pass_rate"].items():
        lines.append(f"| {label} | {rate:.3f} | {report['task_sampled_pass_rate'][label]:.3f} |")
    lines.append(f"| distill - sft_on_teacher | {report['greedy_gain']:+.3f} | {report['gain']:+.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    report = run(arguments(argv))
    print(table(report))
    return 0 if report["gain"] >= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
