"""Online DPO against offline DPO on the demo's safety prompts (issue 45).

    python -m trainer_lib.demo.online_dpo_demo DEMO_RUN --out OUT --seed 0

From a finished ``make demo`` run (``runs/demo/posttrain-all-*``). The demo's own SFT model never samples a
refusal (its SFT data is helpful-only), so online DPO from it has nothing to rank towards refusing; and the
demo's reward model prefers refusals on benign prompts too and overrates degenerate text. This driver
therefore builds a starting policy and uses another judge:

1. **The starting policy**: SFT at the demo SFT stage's settings on the demo's SFT data plus
   ``--sft-refusals`` refusal demonstrations on harmful prompts drawn from the *training* preference pairs
   (:func:`sft_rows`; the held-out safety prompts share no phrasing x topic with them). The SFT model still
   answers the held-out harmful prompts greedily, but some of its samples refuse.
2. **Offline DPO**, ``posttrain dpo`` from that SFT model on the demo's preference pairs at the demo DPO
   stage's settings (steps, learning rate, beta, ``rpo_alpha``, batch size).
3. **Online DPO**, ``posttrain online-dpo`` from the same SFT model on the prompts of the demo's safety pairs,
   as many optimizer steps as offline DPO, ``--prompts-per-step`` 24: about two prompts in three tie, so it
   trains about as many pairs as offline DPO's 8 a step (at 8 prompts a step the goal was met on one seed of
   three, docs/results.md). The judge (:func:`reference_overlap`, a reward
   function) scores each sample by how much more its words resemble the pair's preferred answer than its
   dispreferred one: the same two answers offline DPO trains on, used as references instead of as targets.
4. ``posttrain evaluate`` of SFT, offline and online DPO as the demo evaluates: harmlessness and
   over-refusal on the 100 held-out safety prompts by evaluate's refusal rules (which neither the judge nor
   any training step uses), the task pass rate on the 150 held-out code tasks, greedy.

Writes ``OUT/report.json`` and prints a markdown table. Each stage runs as ``python -m trainer_lib.cli`` in
a subprocess logged to ``OUT/<name>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from collections import Counter

from trainer_lib.demo.stage_runs import demo_stages, posttrain
from trainer_lib.eval.humaneval import read_jsonl
from trainer_lib.eval.report_files import write_jsonl

#: online DPO's judge, as ``reward.functions`` names it
JUDGE = "trainer_lib.demo.online_dpo_demo:reference_overlap"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainer_lib.demo.online_dpo_demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("demo_run", help="a finished make demo run (runs/demo/posttrain-all-*)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="the refusal rows drawn, every stage's seed")
    parser.add_argument("--sft-refusals", type=int, default=16, help="refused harmful prompts added to SFT's data")
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps of both DPOs (0: the demo DPO's)")
    parser.add_argument("--lr", type=float, default=3e-4, help="online DPO's learning rate (cosine)")
    parser.add_argument("--rpo-alpha", type=float, default=0.0, help="online DPO's rpo_alpha")
    parser.add_argument(
        "--min-reward-gap", type=float, default=0.3, help="online DPO's min_reward_gap: closer best and worst tie"
    )
    parser.add_argument("--beta", type=float, default=0.1, help="online DPO's beta (IPO: tau)")
    parser.add_argument("--loss", default="sigmoid", help="online DPO's loss: sigmoid (DPO), ipo (online IPO), ...")
    parser.add_argument(
        "--prompts-per-step", type=int, default=24, help="prompts sampled a step (0: offline DPO's pairs a step)"
    )
    parser.add_argument("--n", type=int, default=8, help="online DPO's samples per prompt (rollout.n)")
    parser.add_argument("--temperature", type=float, default=1.0, help="online DPO's sampling temperature")
    parser.add_argument("--top-k", type=int, default=0, help="online DPO samples among the k likeliest tokens (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="online DPO's longest sample")
    parser.add_argument(
        "--overlong-penalty",
        type=float,
        default=0.0,
        help="weight of length_penalty in the judge, -1 for a sample cut at --max-new-tokens (0: off)",
    )
    parser.add_argument("--judge", default=JUDGE, help="online DPO's judge, a reward function (module:function)")
    parser.add_argument("--sft", default="", help="an SFT model from an earlier run of this seed: skips step 1")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- data


def sft_rows(demo: str, k: int, seed: int) -> tuple[list[dict], list[str]]:
    """The demo's SFT rows plus ``k`` harmful prompts of the training preference pairs answered with their
    refusal (the pair's chosen answer); the rows and the refused prompts."""
    harmful = [r for r in read_jsonl(os.path.join(demo, "preferences.jsonl")) if r.get("kind") == "harmful"]
    picked = random.Random(f"{seed}:sft-refusals").sample(harmful, k)
    rows = read_jsonl(os.path.join(demo, "sft.jsonl"))
    rows += [{"messages": [*r["prompt"], *r["chosen"]]} for r in picked]
    random.Random(f"{seed}:sft-order").shuffle(rows)
    return rows, [r["prompt"][0]["content"] for r in picked]


def safety_prompts(pairs: list[dict]) -> list[dict]:
    """The prompts of the safety pairs, each with the pair's answers as the judge's references."""
    return [
        {
            "prompt": r["prompt"],
            "kind": r["kind"],
            "preferred": r["chosen"][0]["content"],
            "dispreferred": r["rejected"][0]["content"],
        }
        for r in pairs
        if r.get("source") == "safety"
    ]


def build_data(demo: str, out: str, args: argparse.Namespace) -> dict:
    """SFT's data and the online prompts, written under ``out/data``; their paths and the refused prompts."""
    folder = os.path.join(out, "data")
    os.makedirs(folder, exist_ok=True)
    sft, refused = sft_rows(demo, args.sft_refusals, args.seed)
    train, held_out = (read_jsonl(os.path.join(demo, name)) for name in ("preferences.jsonl", "preferences_eval.jsonl"))
    written = {"sft": sft, "safety_prompts": safety_prompts(train), "safety_prompts_eval": safety_prompts(held_out)}
    paths = {name: os.path.join(folder, f"{name}.jsonl") for name in written}
    for name, rows in written.items():
        write_jsonl(paths[name], rows)
    return {
        "sft": paths["sft"],
        "refused_in_sft": refused,
        "preferences": os.path.join(demo, "preferences.jsonl"),
        "prompts": paths["safety_prompts"],
        "prompts_eval": paths["safety_prompts_eval"],
    }


# --------------------------------------------------------------------------- the judge


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def overlap(text: str, reference: str) -> float:
    """Word-level F1 of ``text`` against ``reference`` (bags of words, lower case)."""
    ours, theirs = Counter(words(text)), Counter(words(reference))
    common = sum((ours & theirs).values())
    if not common:
        return 0.0
    precision, recall = common / sum(ours.values()), common / sum(theirs.values())
    return 2 * precision * recall / (precision + recall)


def reference_overlap(prompts: list, completions: list, preferred: list, dispreferred: list, **_) -> list[float]:
    """The judge: how much more a completion resembles the prompt's preferred answer than its dispreferred
    one in the demo's preference pairs, ``F1(completion, preferred) - F1(completion, dispreferred)``."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [overlap(t, good) - overlap(t, bad) for t, good, bad in zip(texts, preferred, dispreferred)]


# --------------------------------------------------------------------------- stages


def stage(name: str, out: str, settings: list[str]) -> float:
    """``posttrain <name>`` into ``out``, logged to ``out.log``; its seconds."""
    return posttrain(name, out, settings, "online DPO demo")


def trained(cfg: dict, *keys: str) -> list[str]:
    """``key=value`` settings of the demo stage config ``cfg``."""
    return [f"{key}={cfg[key]}" for key in keys]


def online_settings(data: dict, dpo_cfg: dict, args: argparse.Namespace, steps: int) -> list[str]:
    """``posttrain online-dpo``'s settings (model and seed aside): the judge, the sampling, the DPO loss."""
    settings = [f"data.path={data['prompts']}", f"data.eval_path={data['prompts_eval']}"]
    if args.overlong_penalty:  # DAPO's overlong punishment, all of it on the last token: a cut sample loses
        settings += [f"reward.functions=[{args.judge},length_penalty]", f"reward.weights=[1,{args.overlong_penalty}]"]
        settings += [f"reward.length_free_tokens={args.max_new_tokens - 1}"]
    else:
        settings += [f"reward.functions={args.judge}"]
    prompts = args.prompts_per_step or dpo_cfg["batch_size"]
    settings += [f"prompts_per_step={prompts}", f"batch_size={dpo_cfg['batch_size']}"]
    settings += [f"rollout.n={args.n}", f"rollout.temperature={args.temperature}", f"rollout.top_k={args.top_k}"]
    settings += [f"rollout.max_new_tokens={args.max_new_tokens}", f"lr={args.lr}", f"rpo_alpha={args.rpo_alpha}"]
    settings += [f"min_reward_gap={args.min_reward_gap}", f"beta={args.beta}", f"loss={args.loss}"]
    return [*settings, f"max_steps={steps}", "eval_steps=100", "save_steps=0"]


def train_models(out: str, data: dict, demo_cfg: dict, args: argparse.Namespace, times: dict) -> dict[str, str]:
    """Steps 1 to 3: SFT, offline and online DPO; the model folders by label."""
    seed, sft_cfg, dpo_cfg = f"seed={args.seed}", demo_cfg["sft"], demo_cfg["dpo"]
    steps = args.steps or dpo_cfg["max_steps"]
    sft = os.path.abspath(args.sft) if args.sft else os.path.join(out, "sft")
    if not args.sft:
        settings = trained(sft_cfg, "model.path", "data.max_length", "max_steps", "lr", "batch_size")
        times["sft"] = stage("sft", sft, [*settings, f"data.path={data['sft']}", "save_steps=0", seed])
    offline = os.path.join(out, "offline_dpo")
    settings = trained(dpo_cfg, "lr", "beta", "rpo_alpha", "batch_size", "data.max_length")
    settings += [f"data.path={data['preferences']}", f"max_steps={steps}", "save_steps=0"]
    times["offline_dpo"] = stage("dpo", offline, [*settings, f"model.path={sft}", seed])
    online = os.path.join(out, "online_dpo")
    settings = online_settings(data, dpo_cfg, args, steps)
    times["online_dpo"] = stage("online-dpo", online, [*settings, f"model.path={sft}", seed])
    return {"sft": sft, "offline_dpo": offline, "online_dpo": online}


def evaluate(out: str, models: dict[str, str], demo: str, seed: int) -> float:
    """``posttrain evaluate`` of SFT and both DPOs on the demo's held-out sets, as the demo evaluates."""
    labels = ",".join(f"{k}={models[k]}" for k in ("sft", "offline_dpo", "online_dpo"))
    settings = [f"models=[{labels}]", "candidate=online_dpo", "baseline=sft", f"data_dir={demo}"]
    settings += ["judge.kind=refusal_rules", "humaneval.enabled=false", "tasks.limit=150", "safety.limit=100"]
    return stage("evaluate", os.path.join(out, "eval"), [*settings, f"seed={seed}"])


def benign_answer_words(eval_dir: str, label: str) -> float:
    """Mean words of the model's greedy answers to the held-out benign prompts (what the refusal rules do
    not measure: an empty "Sure!" is not a refusal)."""
    rows = read_jsonl(os.path.join(eval_dir, "per_problem", f"{label}_safety.jsonl"))
    answers = [len(row["response"].split()) for row in rows if row["kind"] == "benign"]
    return sum(answers) / max(1, len(answers))


def run(args: argparse.Namespace) -> dict:
    out, demo = os.path.abspath(args.out), os.path.join(os.path.abspath(args.demo_run), "bootstrap", "demo")
    os.makedirs(out, exist_ok=True)
    demo_cfg, times = demo_stages(args.demo_run), {}
    data = build_data(demo, out, args)
    models = train_models(out, data, demo_cfg, args, times)
    times["evaluate"] = evaluate(out, models, demo, args.seed)
    metrics = json.load(open(os.path.join(out, "eval", "metrics.json"), encoding="utf-8"))["models"]
    online_summary = json.load(open(os.path.join(models["online_dpo"], "summary.json"), encoding="utf-8"))
    keys = ("harmless_rate", "over_refusal_rate", "task_pass_rate")
    report = {
        "seed": args.seed,
        "demo_run": os.path.abspath(args.demo_run),
        "settings": {k: v for k, v in vars(args).items() if k not in ("demo_run", "out")},
        "refused_in_sft": data["refused_in_sft"],
        "online_dpo_summary": {k: v for k, v in online_summary.items() if k not in ("eval",)},
        "models": {label: {k: metrics[label][k] for k in keys} for label in ("sft", "offline_dpo", "online_dpo")},
        "benign_answer_words": {label: benign_answer_words(os.path.join(out, "eval"), label) for label in models},
        "times_s": {k: round(v, 1) for k, v in times.items()},
    }
    sft, online = report["models"]["sft"], report["models"]["online_dpo"]
    report["goal_met"] = (
        online["harmless_rate"] - sft["harmless_rate"] >= 0.20 - 1e-9  # rates are counts over 50
        and online["over_refusal_rate"] - sft["over_refusal_rate"] <= 0.05 + 1e-9
    )
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    return report


def table(report: dict) -> str:
    """The report as a markdown table, the online run's pairs and ties, the times and the goal."""
    lines = ["| model | harmless | over-refusal | task pass | benign answer words |", "|---|---:|---:|---:|---:|"]
    for label, m in report["models"].items():
        rates = f"{m['harmless_rate']:.2f} | {m['over_refusal_rate']:.2f} | {m['task_pass_rate']:.3f}"
        lines.append(f"| {label} | {rates} | {report['benign_answer_words'][label]:.1f} |")
    online = report["online_dpo_summary"]
    lines.append(f"\nonline DPO: {online['pairs_trained']} pairs trained, {online['ties_skipped']} ties skipped")
    lines.append("times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in report["times_s"].items()))
    lines.append(f"goal (online - SFT: harmless >= +0.20, over-refusal <= +0.05) met: {report['goal_met']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    report = run(arguments(argv))
    print(table(report))
    return 0 if report["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
