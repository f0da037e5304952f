"""Process reward model (PRM): a score for every step of a solution, trained on step-labelled rows.

    posttrain reward objective=process model.path=DIR data.path=STEPS.jsonl output_dir=OUT max_steps=200

Rows are ``{"prompt", "completions": [steps], "labels": [one per step]}``
(:mod:`trainer_lib.data.step_labels`). Each is tokenized as the prompt, then every step followed by
``step_join``; the model is the reward stage's backbone with a scalar head, read at every token, and the
loss is :func:`trainer_lib.losses.prm_step_loss`: the binary cross-entropy of the head's logit at each
step's last token against the step's label. The eval split logs the loss, the step accuracy (sigmoid > 0.5
agrees with label > 0.5) and ``ranking_accuracy``: over the problems of the eval split (rows sharing a
prompt), how often a solution whose steps are all correct scores above one with a wrong step, each
solution scored by its weakest step (:func:`trainer_lib.losses.step_min`; ties count half).

The model is saved as the reward stage saves one (``AutoModelForSequenceClassification``, ``num_labels=1``):
its ordinary sequence score is the PRM's score at the last token, the last step's when the text ends
there. ``prm.json`` beside it records ``step_separator`` and ``step_join``, how steps are found and joined.
"""

from __future__ import annotations

import json

from trainer_lib.data.step_labels import PRM_FILE
from trainer_lib.errors import UserError
from trainer_lib.loop.micro_batches import SplitBatches, TrainOrder

METRICS = ("loss", "step_accuracy")


def prompt_key(prompt) -> str:
    """A row's problem: its prompt, as text."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def load_rows(cfg) -> tuple[list[dict], list[dict]]:
    """``(train rows, eval rows)`` of checked step-labelled rows: ``data.eval_path``'s rows, else the problems
    whose prompt hashes below ``data.eval_fraction`` (all of a problem's rows on one side)."""
    from trainer_lib.data.sources import iter_source
    from trainer_lib.data.step_labels import check_row, held_out

    def read(path: str, key: str) -> list[dict]:
        return [check_row(location, row) for location, row in iter_source(path, key=key)]

    rows = read(cfg.data.path, "data.path")
    if cfg.data.eval_path:
        return rows, read(cfg.data.eval_path, "data.eval_path")
    train, evals = [], []
    for row in rows:
        (evals if held_out(prompt_key(row["prompt"]), cfg.data.eval_fraction) else train).append(row)
    return train, evals


def tokenize(rows: list[dict], tokenizer, cfg) -> list[dict]:
    """``{"input_ids", "step_ends", "step_labels", "problem"}`` per row that keeps at least one step within
    ``data.max_length`` tokens."""
    from trainer_lib.data.step_labels import encode_steps

    out = []
    for row in rows:
        ids, ends = encode_steps(tokenizer, row["prompt"], row["completions"], cfg.data.max_length, cfg.step_join)
        if ends:
            labels = row["labels"][: len(ends)]
            out.append({"input_ids": ids, "step_ends": ends, "step_labels": labels, "problem": row["prompt"]})
    return out


def step_logits(engine, batch: dict, device):
    """The scalar head at every token of a batch, ``(B, T)`` float32."""
    from trainer_lib.models.heads import token_rewards

    return token_rewards(engine, batch["input_ids"].to(device), batch["attention_mask"].to(device))


def step_values(logits, batch: dict) -> dict:
    """Per-step loss and accuracy (1-D, one value per labelled step, no gradient) of a batch."""
    import torch.nn.functional as F

    mask = batch["step_mask"].to(logits.device).bool()
    chosen, labels = logits.detach()[mask], batch["step_labels"].to(logits.device)[mask]
    return {
        "loss": F.binary_cross_entropy_with_logits(chosen, labels, reduction="none"),
        "step_accuracy": ((chosen > 0) == (labels > 0.5)).float(),
    }


def problem_groups(examples: list[dict], size: int) -> list[list[int]]:
    """Eval micro-batches of about ``size`` rows that never split a problem, so each batch can rank its
    problems' solutions against each other."""
    by_problem: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        by_problem.setdefault(prompt_key(example["problem"]), []).append(i)
    groups, current = [], []
    for ids in by_problem.values():
        if current and len(current) + len(ids) > size:
            groups.append(current)
            current = []
        current = current + ids
    return groups + ([current] if current else [])


def ranking_sums(scores, examples: list[dict]) -> tuple[float, float]:
    """``(wins, pairs)``: over each problem's (all-correct, has-a-wrong-step) pairs of ``examples``, the pairs
    where the all-correct one has the higher ``scores`` entry (ties count half)."""
    by_problem: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        by_problem.setdefault(prompt_key(example["problem"]), []).append(i)
    wins = pairs = 0.0
    for ids in by_problem.values():
        good = [i for i in ids if min(examples[i]["step_labels"]) > 0.5]
        bad = [i for i in ids if min(examples[i]["step_labels"]) <= 0.5]
        for g in good:
            for b in bad:
                pairs += 1
                wins += 1.0 if scores[g] > scores[b] else 0.5 if scores[g] == scores[b] else 0.0
    return wins, pairs


def evaluate(engine, strategy, evals: SplitBatches) -> dict:
    """Mean step loss and accuracy, and the ranking accuracy of solutions by their weakest step."""
    import torch

    from trainer_lib.losses import step_min

    def sums(group: list[int]) -> dict:
        batch = evals.collated(group)
        with torch.no_grad():
            logits = step_logits(engine, batch, strategy.device)
        values = step_values(logits, batch)
        weakest = step_min(torch.sigmoid(logits), batch["step_mask"].to(logits.device)).tolist()
        wins, pairs = ranking_sums(weakest, [evals.examples[i] for i in group])
        return {key: float(v.sum()) for key, v in values.items()} | {
            "steps": float(len(values["loss"])),
            "wins": wins,
            "pairs": pairs,
        }

    zeros = dict.fromkeys((*METRICS, "steps", "wins", "pairs"), 0.0)
    totals = strategy.sharded_sums(evals.groups, sums, zeros, models=(engine,))
    metrics = {key: totals[key] / max(totals["steps"], 1.0) for key in METRICS}
    if totals["pairs"]:
        metrics["ranking_accuracy"] = totals["wins"] / totals["pairs"]
    return metrics


def run(cfg) -> dict:
    """``posttrain reward objective=process``: the PRM's training loop (cfg: the reward stage's config)."""
    from trainer_lib.data.step_labels import collate_steps
    from trainer_lib.data.tokenize import count_tokens
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.loop.cadence import Cadence
    from trainer_lib.losses import prm_step_loss
    from trainer_lib.models.heads import apply_reward_lora, load_reward_model
    from trainer_lib.models.load import load_tokenizer

    resolve_batch_size(cfg)
    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed, parallel=cfg.parallel)
    strategy.setup_distributed()

    # ---- data: step-labelled rows, tokenized a step at a time
    tokenizer = load_tokenizer(cfg.model)
    train_rows, eval_rows = load_rows(cfg)
    train_examples, eval_examples = tokenize(train_rows, tokenizer, cfg), tokenize(eval_rows, tokenizer, cfg)
    if not train_examples:
        raise UserError(f"data.path: {cfg.data.path} has no step-labelled rows with a step within data.max_length")

    def collate_rows(examples):
        return collate_steps(examples, tokenizer.pad_token_id)

    size = cfg.batch_size
    train = SplitBatches(
        train_examples,
        [list(range(i, min(i + size, len(train_examples)))) for i in range(0, len(train_examples), size)],
        collate_rows,
    )
    evals = SplitBatches(eval_examples, problem_groups(eval_examples, cfg.eval_batch_size), collate_rows)
    order = TrainOrder(cfg, train, strategy.data_world_size, strategy.data_rank)

    # ---- model: backbone + scalar head read at every token
    model = load_reward_model(cfg.model, tokenizer.pad_token_id, cfg.engine.precision, placement=strategy.placement())
    engine = strategy.prepare(apply_reward_lora(model, cfg.lora), total_steps=order.steps, **cfg.optimizer_args())
    evaluation = (lambda: evaluate(engine, strategy, evals)) if eval_examples else None
    cadence = Cadence(cfg, strategy, "reward", order.steps, engine, evaluate=evaluation, window_keys=METRICS)
    steps = sum(len(e["step_ends"]) for e in train_examples)
    cadence.restore(f"{len(train_examples)} train / {len(eval_examples)} eval solutions ({steps} train steps)")

    # ---- the loop
    for step in cadence.steps():
        for ids, batch in order.micro_batches(step):
            logits = step_logits(engine, batch, strategy.device)
            mask, labels = batch["step_mask"].to(logits.device), batch["step_labels"].to(logits.device)
            strategy.backward(prm_step_loss(logits, labels, mask), engine)
            strategy.optimizer_step(engine)
            cadence.window.add_all(step_values(logits, batch))
            cadence.window.count(samples=len(ids), tokens=count_tokens(batch))
        cadence.after_step(step, epoch=order.epoch(step))

    summary = cadence.finish(
        {"stage": "reward", "objective": "process", "train_solutions": len(train_examples), "format": "step_labels"}
    )
    settings = {"step_separator": cfg.step_separator, "step_join": cfg.step_join}
    return cadence.save_model(tokenizer, summary | settings, extra_files={PRM_FILE: json.dumps(settings, indent=2)})
