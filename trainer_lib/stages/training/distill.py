"""On-policy distillation: the student samples completions, a frozen teacher scores them token by token.

    posttrain distill model.path=STUDENT teacher.path=TEACHER data.path=PROMPTS output_dir=OUT

Every step: take ``prompts_per_step`` prompts (a pure function of seed and step, as GRPO's), sample
``rollout.n`` completions of each with the current student (or, for a ``1 - lmbda`` share of the prompts,
take the row's dataset completion instead), and take one optimizer step on the per-token divergence of
the student's next-token distribution from the teacher's at every completion token (GKD, Agarwal et al.
2024, "On-Policy Distillation of Language Models", arXiv:2306.13649: sec. 3's objective and Algorithm 1, with
the generalized JSD of sec. 2):

    L(theta) = mean over completion tokens t of  D_beta( pi_T(. | x, y_<t) || pi_S(. | x, y_<t) )
    D_beta   = beta KL(P || M) + (1 - beta) KL(Q || M),  M = beta P + (1 - beta) Q,  P teacher, Q student

``beta=1`` is the reverse KL ``KL(pi_S || pi_T)`` of on-policy distillation (MiniLLM; Thinking Machines
2025), ``beta=0`` the forward KL of supervised KD; in between the generalized JSD
(:func:`trainer_lib.losses.generalized_jsd`). The divergence is exact over the vocabulary at each
position, not a one-sample estimate, so the loss is differentiated directly (no policy gradient): as in
GKD, the sampled tokens are treated as data (no gradient through the sampling).

Why a stage of its own and not a GRPO objective: nothing of GRPO's update applies (no rewards, groups,
advantages, ratios or clipping, no reference model), while what it shares is already library code that
this file calls: the prompt schedule and seeds (:mod:`trainer_lib.rl.prompts`), sampling
(:func:`trainer_lib.rl.experience.sample`), frozen-model loading (``strategy.prepare_frozen``), the
cadence (:mod:`trainer_lib.loop.cadence`: log, eval, checkpoints, exact resume) and LoRA.

The teacher's log-probs come from its final hidden states (no full-logits forward); as the divergence
needs full distributions at each position, head and divergence run a chunk of positions at a time
(:func:`trainer_lib.losses.chunked_generalized_jsd`), never the whole ``(tokens, vocab)`` logits.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import ClassVar

from trainer_lib.config import TrainingConfig, opt
from trainer_lib.config.rl import RolloutConfig
from trainer_lib.errors import ConfigError, UserError


@dataclass
class TeacherConfig:
    path: str | None = opt(
        None, "The teacher: a causal LM with the student's tokenizer (HF id, local dir or URL); frozen."
    )
    revision: str = opt("", "Hub revision of teacher.path: branch, tag or commit sha; default main.")
    precision: str = opt("", "The teacher's weights: fp32 or bf16 (empty: engine.precision).", ("", "fp32", "bf16"))


@dataclass
class DistillConfig(TrainingConfig):
    """On-policy distillation (GKD): the shared training keys, the teacher, sampling and the mix."""

    teacher: TeacherConfig = opt(TeacherConfig, "The frozen teacher model.")
    rollout: RolloutConfig = opt(RolloutConfig, "Sampling of the student's completions.")
    prompts_per_step: int = opt(8, "Prompts per step, all ranks together (each gets rollout.n sequences).")
    lmbda: float = opt(
        1.0,
        "GKD's lambda: share of each step's prompts whose completions the student samples; the others use "
        "the row's dataset completion (data needs a completion column below 1). 1: purely on-policy.",
    )
    beta: float = opt(
        1.0,
        "GKD's beta: 1 reverse KL(student || teacher), 0 forward KL(teacher || student), between: the "
        "generalized Jensen-Shannon divergence.",
    )

    #: rollouts generate with the student in one process per rank: data parallelism only
    MODEL_PARALLEL: ClassVar[tuple[str, ...]] = ()
    #: one pass, one optimizer step per step (the prompt schedule reads these)
    ppo_epochs: ClassVar[int] = 1

    def validate(self) -> None:
        super().validate()
        if not self.teacher.path:
            raise ConfigError("teacher.path: required, the teacher model (HF id, local dir or URL)")
        if not 0.0 <= self.lmbda <= 1.0 or not 0.0 <= self.beta <= 1.0:
            raise ConfigError(f"lmbda, beta: expected 0 to 1, got {self.lmbda}, {self.beta}")
        r = self.rollout
        if r.n < 1 or r.max_new_tokens < 1 or r.batch_size < 1 or self.prompts_per_step < 1:
            raise ConfigError("rollout.n, rollout.max_new_tokens, rollout.batch_size, prompts_per_step: expected >= 1")
        if r.temperature < 0 or not 0 < r.top_p <= 1 or r.top_k < 0 or r.tis_cap:
            raise ConfigError("rollout: expected temperature >= 0, 0 < top_p <= 1, top_k >= 0 and no tis_cap")
        if self.engine.gradient_accumulation_steps != 1:
            raise ConfigError(
                "engine.gradient_accumulation_steps: distill derives it (one optimizer step per step, "
                "prompts_per_step * rollout.n sequences); set batch_size instead"
            )

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step, all ranks together: the whole step."""
        return self.prompts_per_step * self.rollout.n

    def engine_for(self, world_size: int):
        """The engine settings for ``world_size`` ranks: accumulation = step's sequences / (batch_size * world)."""
        if self.prompts_per_step % world_size or self.mini_batch % (world_size * self.batch_size):
            raise UserError(
                f"prompts_per_step ({self.prompts_per_step}) must be a multiple of the world size ({world_size}), "
                f"and prompts_per_step * rollout.n ({self.mini_batch}) of batch_size * world size"
            )
        return dataclasses.replace(
            self.engine, gradient_accumulation_steps=self.mini_batch // (world_size * self.batch_size)
        )


CONFIG = DistillConfig


def as_prompt_completion(row: dict) -> dict:
    """A ``messages`` row as a prompt (every turn before the last) and its completion (the last, the
    assistant's turn); other rows as they are."""
    if "messages" not in row or "prompt" in row:
        return row
    *turns, last = row["messages"]
    return {**{k: v for k, v in row.items() if k != "messages"}, "prompt": turns, "completion": [last]}


def load_rows(cfg: DistillConfig, tokenizer) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): GRPO's prompt formats, or ``messages`` rows split before their last turn; below
    lmbda=1 every row needs a completion."""
    from trainer_lib.data.dataset import load_training_data
    from trainer_lib.rl.prompts import PROMPT_FORMATS

    splits, _ = load_training_data(
        cfg.data, cfg.seed, (*PROMPT_FORMATS, "messages"), tokenizer, stage="distill (a 'prompt' or 'messages' column)"
    )
    train = [as_prompt_completion(dict(r)) for r in splits["train"]]
    evals = [as_prompt_completion(dict(r)) for r in splits["eval"]] if "eval" in splits else []
    if not train:
        raise UserError(f"data.path: {cfg.data.path}: no prompts")
    if cfg.lmbda < 1 and "completion" not in train[0]:
        raise UserError(
            f"lmbda={cfg.lmbda}: off-policy prompts train on the row's completion, but {cfg.data.path} has "
            "none (prompt_completion or messages rows)"
        )
    return train, evals


def start(cfg: DistillConfig):
    """``(strategy, tokenizer, eval prompt rows, prompt schedule)``."""
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.process_group import planned_world_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.models.load import load_tokenizer
    from trainer_lib.rl.prompts import PromptSchedule

    resolve_batch_size(cfg, sequence_length=cfg.data.max_length + cfg.rollout.max_new_tokens)
    strategy = DeepSpeedStrategy(cfg.engine_for(planned_world_size()), micro_batch_size=cfg.batch_size, seed=cfg.seed)
    strategy.setup_distributed()
    tokenizer = load_tokenizer(cfg.model)
    train_rows, eval_rows = load_rows(cfg, tokenizer)
    return strategy, tokenizer, eval_rows, PromptSchedule(cfg, train_rows, strategy.world_size, strategy.rank)


def step_sequences(engine, strategy, tokenizer, rows: list[dict], cfg: DistillConfig, seed: int):
    """``(rollout, on_policy)``: ``rollout.n`` sequences per row, those of the first ``round(lmbda * rows)``
    rows sampled from the student, the others the row's dataset completion (cut at ``rollout.max_new_tokens``)
    repeated ``n`` times, so a step always holds the same number of sequences; ``on_policy`` flags each."""
    from trainer_lib.data.preference_batches import encode_completion, encode_prompt
    from trainer_lib.rl.experience import sample
    from trainer_lib.rl.rollout import Rollout, pad_rows

    n, sampled = cfg.rollout.n, round(cfg.lmbda * len(rows))
    prompts, responses, texts, finished = [], [], [], []
    if sampled:
        rollout, _, _ = sample(engine, strategy, tokenizer, rows[:sampled], cfg.rollout, seed)
        for i in range(len(rollout)):
            prompts.append(rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist())
            responses.append(rollout.response_ids[i][: int(rollout.response_mask[i].sum())].tolist())
        texts, finished = list(rollout.completions), list(rollout.finished)
    for row in rows[sampled:]:
        completion = encode_completion(tokenizer, row["prompt"], row["completion"], row.get("tools"))
        cut = completion[: cfg.rollout.max_new_tokens]
        for _ in range(n):
            prompts.append(encode_prompt(tokenizer, row["prompt"], row.get("tools")))
            responses.append(cut)
            texts.append(tokenizer.decode(cut, skip_special_tokens=True))
            finished.append(len(cut) == len(completion))
    prompt_ids, prompt_mask = pad_rows(prompts, tokenizer.pad_token_id, left=True)
    response_ids, response_mask = pad_rows(responses, tokenizer.pad_token_id, left=False)
    rollout = Rollout(prompt_ids, prompt_mask, response_ids, response_mask, texts, finished)
    return rollout, [True] * (sampled * n) + [False] * ((len(rows) - sampled) * n)


def divergence(engine, teacher, part, beta: float, device):
    """Per-token divergence ``(N,)`` of the student (``engine``, with gradient) from the teacher at every
    completion token of ``part`` (a :class:`~trainer_lib.rl.rollout.Rollout`), a chunk of positions at a time."""
    import torch

    from trainer_lib.losses import chunked_generalized_jsd
    from trainer_lib.models.lm_head import response_states

    inputs, width = part.model_inputs(device), part.response_ids.shape[1]
    keep = part.loss_mask.to(device).bool()
    with torch.no_grad():
        teacher_states, teacher_weight = response_states(teacher, inputs, width, keep)
    student_states, student_weight = response_states(engine, inputs, width, keep)
    return chunked_generalized_jsd(student_states, student_weight, teacher_states, teacher_weight, beta)


def held_out_evaluation(engine, teacher, strategy, tokenizer, rows: list[dict], cfg: DistillConfig):
    """The Cadence's ``evaluate()``: ``distill_loss``, the mean per-token divergence to the teacher on one
    sampled completion of each held-out prompt (the same seed at every evaluation); None without eval rows."""
    if not rows:
        return None
    from trainer_lib.rl.experience import sample

    once = dataclasses.replace(cfg.rollout, n=1)
    chunks = [rows[i : i + cfg.eval_batch_size] for i in range(0, len(rows), cfg.eval_batch_size)]

    def sums(chunk: list[dict]) -> dict:
        rollout, _, _ = sample(engine, strategy, tokenizer, chunk, once, cfg.seed)
        per_token = divergence(engine, teacher, rollout, cfg.beta, strategy.device)
        return {"total": float(per_token.sum()), "count": float(per_token.numel()), "sequences": float(len(chunk))}

    def evaluate() -> dict:
        totals = strategy.sharded_sums(chunks, sums, {"total": 0.0, "count": 0.0, "sequences": 0.0}, models=(engine,))
        count = max(totals["count"], 1.0)
        return {"distill_loss": totals["total"] / count, "response_length": count / max(totals["sequences"], 1.0)}

    return evaluate


def sample_rows(rollout, on_policy: list[bool], n: int) -> list[dict]:
    """samples.jsonl rows: the first sequence of each prompt, and whether the student wrote it."""
    return [
        {"completion": rollout.completions[i], "on_policy": on_policy[i], "length": int(rollout.response_mask[i].sum())}
        for i in range(0, len(rollout), n)
    ]


def run(cfg: DistillConfig) -> dict:
    import functools

    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.models.load import apply_lora, disable_dropout, load_causal_lm
    from trainer_lib.models.teacher import load_teacher
    from trainer_lib.rl.experience import rollout_tokens

    # ---- prompts and schedule; the teacher (its tokenizer checked first), then the student and its engine
    strategy, tokenizer, eval_rows, schedule = start(cfg)
    precision = cfg.teacher.precision or cfg.engine.precision
    placement = strategy.placement(train=False)
    teacher = strategy.prepare_frozen(
        load_teacher(cfg.model, tokenizer, cfg.teacher.path, cfg.teacher.revision, precision, placement)
    )
    student = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision, placement=strategy.placement()), cfg.lora)
    disable_dropout(student)
    engine = strategy.prepare(student, total_steps=schedule.steps, **cfg.optimizer_args())
    evaluation = held_out_evaluation(engine, teacher, strategy, tokenizer, eval_rows, cfg)
    cadence = Cadence(cfg, strategy, "distill", schedule.steps, engine, evaluate=evaluation)
    cadence.restore(
        f"teacher {cfg.teacher.path}, beta={cfg.beta}, lmbda={cfg.lmbda}, {len(schedule.prompts)} train / "
        f"{len(eval_rows)} eval prompts, {cfg.prompts_per_step} prompts x {cfg.rollout.n} sequences per step"
    )

    # ---- the loop
    for step in cadence.steps():
        # 1. the step's sequences: the student's samples and (lmbda < 1) dataset completions
        generate_start = time.perf_counter()
        rollout, on_policy = step_sequences(
            engine, strategy, tokenizer, schedule.rows(step), cfg, schedule.sampling_seed(step)
        )
        # 2. one optimizer step on the per-token divergence to the teacher, over micro-batches
        train_start = time.perf_counter()
        for micro in schedule.update_micro_batches(step):
            per_token = divergence(engine, teacher, rollout.select(micro), cfg.beta, strategy.device)
            loss = per_token.mean() if per_token.numel() else per_token.sum()
            strategy.backward(loss, engine)
            strategy.optimizer_step(engine)
            cadence.window.add("loss", loss)
        cadence.window.add_all(
            {
                "on_policy_fraction": sum(on_policy) / len(on_policy),
                "response_length": float(rollout.response_mask.sum(1).float().mean()),
                "generate_time": train_start - generate_start,
                "train_time": time.perf_counter() - train_start,
            }
        )
        cadence.window.count(samples=len(rollout), tokens=rollout_tokens(rollout))
        cadence.log_samples(step, functools.partial(sample_rows, rollout, on_policy, cfg.rollout.n))
        cadence.after_step(step)

    # ---- final evaluation and Hugging Face export
    summary = cadence.finish({"stage": "distill", "teacher": cfg.teacher.path, "train_prompts": len(schedule.prompts)})
    if "eval" in summary:
        summary["eval_distill_loss"] = summary["eval"]["distill_loss"]
    return cadence.save_model(tokenizer, summary)
