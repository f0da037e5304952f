"""What the PPO and GRPO stages share: config sections, prompts, rewards, the reference policy,
one rollout, and held-out evaluation. Helpers only; each stage's loop stays in its own file.

Batch arithmetic (all counts across ranks, like ``prompts_per_step``)::

    sequences per step     = prompts_per_step * rollout.n
    mini-batch             = mini_batch_size sequences (0: the whole step) -> one optimizer step
    micro-batch            = batch_size sequences per rank and forward pass
    accumulation           = mini_batch_size / (batch_size * world_size), set on the engine
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from trainer_lib.config import ConfigError, opt
from trainer_lib.errors import UserError

#: Datasets the RL stages read prompts from (only the ``prompt`` column is used as input;
#: every other column goes to the reward functions).
PROMPT_FORMATS = ("prompt_only", "prompt_completion", "preference", "unpaired_preference")


@dataclass
class RolloutConfig:
    n: int = opt(4, "Completions sampled per prompt (the group size of GRPO/RLOO).")
    max_new_tokens: int = opt(64, "Most tokens generated per completion.")
    temperature: float = opt(1.0, "Sampling temperature (0: greedy). Log-probs use the same temperature.")
    top_p: float = opt(1.0, "Nucleus sampling threshold (1: off).")
    top_k: int = opt(0, "Sample among the k most likely tokens (0: off).")
    stop: list[str] = opt([], "Stop strings; the completion text ends before the first one "
                              "(comma-separated on the CLI).")
    batch_size: int = opt(64, "Sequences per generate call (per rank).")


@dataclass
class RewardSourcesConfig:
    functions: list[str] = opt([], "Reward functions: built-ins (code_execution, code_style, "
                                   "length_penalty) or module:function / path/file.py:function "
                                   "(comma-separated on the CLI).")
    weights: list[float] = opt([], "One weight per source: the functions in order, then the reward "
                                   "model if reward.model_path is set (empty: all 1.0).")
    model_path: str | None = opt(None, "Reward model (from `posttrain reward`), normalized with its "
                                       "stored mean/std.")
    clip: float = opt(0.0, "Clip the combined reward to [-clip, clip] after normalization (0: off).")
    normalize: str = opt("none", "Normalize the combined reward: with this step's statistics, "
                                 "with running statistics, or not.", ("none", "batch", "running"))
    code_timeout: float = opt(3.0, "code_execution: wall-clock seconds per program in the sandbox.")
    sandbox_workers: int = opt(4, "code_execution: sandbox processes running tests in parallel.")
    length_free_tokens: int = opt(0, "length_penalty: completions up to this many tokens are not "
                                     "penalized; the penalty reaches -1 at rollout.max_new_tokens.")


def validate_rl(cfg) -> None:
    """Checks both RL configs share (batch arithmetic that needs the world size is checked at start)."""
    r = cfg.rollout
    if r.n < 1 or r.max_new_tokens < 1 or r.batch_size < 1:
        raise ConfigError("rollout.n, rollout.max_new_tokens, rollout.batch_size: expected positive integers")
    if r.temperature < 0 or not 0 < r.top_p <= 1 or r.top_k < 0:
        raise ConfigError("rollout: expected temperature >= 0, 0 < top_p <= 1 and top_k >= 0")
    if cfg.reward.clip < 0:
        raise ConfigError(f"reward.clip: expected >= 0, got {cfg.reward.clip}")
    if not cfg.reward.functions and not cfg.reward.model_path:
        raise ConfigError("reward.functions: required (or reward.model_path), e.g. "
                          "reward.functions=code_execution or my_rewards:reward")
    if cfg.prompts_per_step < 1 or cfg.ppo_epochs < 1 or cfg.mini_batch_size < 0:
        raise ConfigError("prompts_per_step, ppo_epochs: expected >= 1; mini_batch_size: expected >= 0")
    if cfg.engine.gradient_accumulation_steps != 1:
        raise ConfigError("engine.gradient_accumulation_steps: RL stages derive it from "
                          "mini_batch_size / (batch_size * world size); set mini_batch_size instead")
    sequences = cfg.prompts_per_step * r.n
    mini = cfg.mini_batch_size or sequences
    if sequences % mini:
        raise ConfigError(f"mini_batch_size: {mini} does not divide the {sequences} sequences of a step "
                          f"(prompts_per_step * rollout.n)")


def make_strategy(cfg):
    """The DeepSpeed strategy, with gradient accumulation derived from the mini-batch size."""
    from trainer_lib.strategy import DeepSpeedStrategy

    strategy = DeepSpeedStrategy(cfg.engine, micro_batch_size=cfg.batch_size, seed=cfg.seed)
    strategy.setup_distributed()
    world = strategy.world_size
    mini = cfg.mini_batch_size or cfg.prompts_per_step * cfg.rollout.n
    if cfg.prompts_per_step % world or mini % (world * cfg.batch_size):
        raise UserError(f"prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the world size "
                        f"({world}), and the mini-batch ({mini} sequences) of batch_size * world size "
                        f"({cfg.batch_size * world})")
    strategy.cfg = dataclasses.replace(cfg.engine, gradient_accumulation_steps=mini // (world * cfg.batch_size))
    return strategy


def updates_per_step(cfg) -> int:
    """Optimizer steps per RL step."""
    sequences = cfg.prompts_per_step * cfg.rollout.n
    return cfg.ppo_epochs * sequences // (cfg.mini_batch_size or sequences)


def step_seed(seed: int, step: int, rank: int) -> int:
    """Sampling seed of one rank at one step: a resumed run draws the same completions."""
    return ((seed * 1_000_003 + step) * 1_009 + rank) % (2**63)


def disable_dropout(model) -> None:
    """Dropout would make the update's log-probs disagree with the rollout's (TRL does the same)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def minibatch_order(count: int, mini: int, micro: int, seed: int) -> list[list[list[int]]]:
    """A shuffled split of ``count`` rows into mini-batches of micro-batches (row lists)."""
    import torch

    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    return [[order[m + i:m + i + micro] for i in range(0, mini, micro)] for m in range(0, count, mini)]


# --------------------------------------------------------------------------- prompts


def load_prompts(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of normalized prompt rows; prompts longer than data.max_length
    tokens are dropped."""
    from trainer_lib.data.dataset import load_training_data

    splits, fmt = load_training_data(cfg.data, cfg.seed, allowed_formats=PROMPT_FORMATS, tokenizer=tokenizer,
                                     stage="RL (a 'prompt' column)")
    train = [dict(r) for r in splits["train"]]
    evals = [dict(r) for r in splits["eval"]] if "eval" in splits else []
    if not train:
        raise UserError(f"data.path: {cfg.data.path}: no prompts")
    return train, evals


def prompt_inputs(rows: list[dict], tokenizer, n: int) -> tuple[list, list[list[int]], dict[str, list]]:
    """For rows: (raw prompts, prompt token ids, other columns repeated ``n`` times as keyword lists)."""
    from trainer_lib.data.preference import encode_prompt

    columns = {key: [row[key] for row in rows for _ in range(n)] for key in rows[0] if key != "prompt"}
    prompts = [row["prompt"] for row in rows]
    return prompts, [encode_prompt(tokenizer, p) for p in prompts], columns


# --------------------------------------------------------------------------- rewards


def build_rewards(cfg, strategy, tokenizer):
    """The configured reward sources, combined (functions in order, then the reward model)."""
    from trainer_lib.rewards.combine import RewardCombiner
    from trainer_lib.rewards.functions import resolve

    settings = {"code_timeout": cfg.reward.code_timeout, "sandbox_workers": cfg.reward.sandbox_workers,
                "max_tokens": cfg.rollout.max_new_tokens, "length_free_tokens": cfg.reward.length_free_tokens}
    sources = [resolve(spec, **settings) for spec in cfg.reward.functions]
    if cfg.reward.model_path:
        from trainer_lib.rewards.model import load_reward_scorer

        sources.append(("reward_model", load_reward_scorer(
            cfg.reward.model_path, cfg.model, strategy.prepare_frozen, cfg.engine.precision,
            batch_size=cfg.eval_batch_size, max_length=cfg.data.max_length + cfg.rollout.max_new_tokens)))
    return RewardCombiner(sources, cfg.reward.weights, cfg.reward.clip, cfg.reward.normalize,
                          reduce=lambda sums: strategy.all_reduce(sums, op="sum"))


def as_completions(prompts: list, texts: list[str], n: int) -> list:
    """Completions as reward functions get them: text, or an assistant message for chat prompts."""
    return [[{"role": "assistant", "content": text}] if isinstance(prompts[i // n], list) else text
            for i, text in enumerate(texts)]


# --------------------------------------------------------------------------- policy and reference


def load_reference(cfg, strategy):
    """The frozen reference policy; None under LoRA, where the policy with adapters off is it."""
    if cfg.lora.r > 0:
        return None
    from trainer_lib.models.load import load_causal_lm

    return strategy.prepare_frozen(load_causal_lm(cfg.model, cfg.engine.precision))


def reference_logprobs(reference, policy, rollout, temperature: float):
    """Token log-probs under the reference (or under ``policy`` with its LoRA adapters disabled)."""
    import torch

    from trainer_lib.rollout import token_logprobs

    with torch.no_grad():
        if reference is not None:
            return token_logprobs(reference, rollout, temperature)[0]
        with policy.module.disable_adapter():
            return token_logprobs(policy, rollout, temperature)[0]


def per_micro_batch(fn, rollout, micro: int):
    """``fn(part)`` over row chunks of ``rollout``, results padded back into one ``(N, R)`` tensor."""
    import torch

    out = torch.zeros(rollout.response_ids.shape, dtype=torch.float32)
    for start in range(0, len(rollout), micro):
        rows = list(range(start, min(start + micro, len(rollout))))
        values = fn(rollout.select(rows)).float().cpu()
        out[start:start + len(rows), :values.shape[1]] = values
    return out


def sample(engine, strategy, tokenizer, rows: list[dict], rollout_cfg, seed: int):
    """Generate ``rollout.n`` completions per row with the engine's current weights."""
    from trainer_lib.rollout import generate

    prompts, prompt_ids, columns = prompt_inputs(rows, tokenizer, rollout_cfg.n)
    module = strategy.unwrap(engine)
    with strategy.gathered(module):  # ZeRO-3: generate needs the full weights
        rollout = generate(module, tokenizer, prompt_ids, n=rollout_cfg.n,
                           max_new_tokens=rollout_cfg.max_new_tokens, temperature=rollout_cfg.temperature,
                           top_p=rollout_cfg.top_p, top_k=rollout_cfg.top_k, stop=rollout_cfg.stop,
                           batch_size=rollout_cfg.batch_size, seed=seed)
    return rollout, prompts, columns


def score(rewards, strategy, rollout, prompts: list, columns: dict, n: int):
    """``(rewards for training (N,), metrics)``: combined, normalized and clipped rewards; the
    metrics hold the raw weighted reward and each source's mean, reduced over ranks."""
    start = time.perf_counter()
    completions = as_completions(prompts, rollout.completions, n)
    ids = [row[:int(length)] for row, length in zip(rollout.response_ids.tolist(), rollout.response_lengths())]
    table, means = rewards.score([p for p in prompts for _ in range(n)], completions, columns, ids)
    raw = rewards.weighted(table)
    lengths = rollout.response_lengths().float()
    sums = strategy.all_reduce({"count": float(len(raw)), "reward": float(raw.sum()),
                                "reward_sq": float((raw ** 2).sum()), "length": float(lengths.sum()),
                                "finished": float(sum(rollout.finished))}, op="sum")
    count = max(sums["count"], 1.0)
    mean = sums["reward"] / count
    metrics = {"reward": mean, "reward_std": max(sums["reward_sq"] / count - mean ** 2, 0.0) ** 0.5, **means,
               "response_length": sums["length"] / count, "finished_fraction": sums["finished"] / count,
               "generate_time": rollout.stats["generate_time"],
               "generate_tokens_per_s": strategy.all_reduce(rollout.stats["tokens_per_s"], op="sum"),
               "reward_time": time.perf_counter() - start}
    return rewards.combine(table), metrics


def evaluate(engine, strategy, tokenizer, rows: list[dict], rewards, rollout_cfg, seed: int) -> dict:
    """Mean raw (weighted, not normalized) reward of greedy completions of held-out prompts."""
    import torch

    mine = rows[strategy.rank::strategy.world_size]
    greedy = dataclasses.replace(rollout_cfg, n=1, temperature=0.0)
    table = torch.zeros((0, len(rewards.sources)), dtype=torch.float64)
    means: dict = {}
    lengths = torch.zeros(0)
    if mine:
        rollout, prompts, columns = sample(engine, strategy, tokenizer, mine, greedy, seed)
        completions = as_completions(prompts, rollout.completions, 1)
        ids = [r[:int(n)] for r, n in zip(rollout.response_ids.tolist(), rollout.response_lengths())]
        table, means = rewards.score(prompts, completions, columns, ids)
        lengths = rollout.response_lengths().float()
    else:  # still take part in the collective sums
        table, means = rewards.score([], [], {k: [] for k in rows[0] if k != "prompt"}, [])
    sums = strategy.all_reduce({"total": float(rewards.weighted(table).sum()), "count": float(len(table)),
                                "length": float(lengths.sum())}, op="sum")
    count = max(sums["count"], 1.0)
    return {"reward": sums["total"] / count, "response_length": sums["length"] / count, **means}
