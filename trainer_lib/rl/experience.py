"""Experience making for online RL: prompts in, scored rollouts and per-token log-probs out.

A step samples ``rollout.n`` completions per prompt with the current policy (:func:`sample`),
scores them with the configured reward sources (:func:`score_rollout`), and computes, with the
weights that sampled them, the per-token log-probs the update needs (:func:`per_micro_batch`
over :func:`trainer_lib.rl.rollout.token_logprobs`, :func:`reference_logprobs`). Held-out prompts
are scored the same way, greedily (:func:`evaluate`).
"""

from __future__ import annotations

import dataclasses
import time

from trainer_lib.errors import UserError
from trainer_lib.rl.prompts import PROMPT_FORMATS

# --------------------------------------------------------------------------- setup and prompts


def start(cfg, priority_signal=None, sequences_per_row: int = 1):
    """What an RL stage starts with: ``(strategy, tokenizer, eval prompt rows, prompt schedule)``.

    The strategy is built from the final engine config (accumulation derived from the mini-batch
    size and the world size), then the process group is joined; the schedule holds the train rows:
    a fixed shuffle, or (``buffer.mode`` uniform or priority) a live pool whose priorities are the
    stage's ``priority_signal`` (default :func:`trainer_lib.rl.buffer.group_reward_std`).
    ``sequences_per_row``: sequences a micro-batch row holds, for ``batch_size=auto`` (online DPO's pair: 2).
    """
    from trainer_lib.engine.batch_size import resolve_batch_size
    from trainer_lib.engine.process_group import planned_world_size
    from trainer_lib.engine.strategy import DeepSpeedStrategy
    from trainer_lib.models.load import load_tokenizer
    from trainer_lib.rewards.functions import check_specs
    from trainer_lib.rl.prompts import PromptSchedule

    check_specs(cfg.reward.functions)
    resolve_batch_size(
        cfg, sequences_per_row=sequences_per_row, sequence_length=cfg.data.max_length + cfg.rollout.max_new_tokens
    )
    strategy = DeepSpeedStrategy(
        cfg.engine_for(planned_world_size()), micro_batch_size=cfg.batch_size, seed=cfg.seed, parallel=cfg.parallel
    )
    strategy.setup_distributed()
    tokenizer = load_tokenizer(cfg.model)
    train_rows, eval_rows = load_prompts(cfg, tokenizer)
    if cfg.buffer.mode == "shuffle":
        return strategy, tokenizer, eval_rows, PromptSchedule(cfg, train_rows, strategy.world_size, strategy.rank)
    from trainer_lib.rl.buffer import BufferedSchedule, group_reward_std

    schedule = BufferedSchedule.build(cfg, train_rows, strategy, tokenizer, priority_signal or group_reward_std)
    return strategy, tokenizer, eval_rows, schedule


_PROCESSORS: dict = {}


def policy_processor(model_cfg, tokenizer):
    """A vision-language policy's processor (holding ``tokenizer``), None for a text policy; loaded once per
    model and tokenizer, as every step's rollout needs it."""
    from trainer_lib.models.load import load_processor

    key = (model_cfg.path, model_cfg.revision, model_cfg.trust_remote_code, id(tokenizer))
    if key not in _PROCESSORS:
        _PROCESSORS[key] = load_processor(model_cfg, tokenizer)
    return _PROCESSORS[key]


def load_prompts(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of normalized prompt rows; prompts longer than data.max_length
    tokens are dropped."""
    from trainer_lib.data.dataset import load_training_data

    splits, fmt = load_training_data(
        cfg.data, cfg.seed, allowed_formats=PROMPT_FORMATS, tokenizer=tokenizer, stage="RL (a 'prompt' column)"
    )
    train = [dict(r) for r in splits["train"]]
    evals = [dict(r) for r in splits["eval"]] if "eval" in splits else []
    if not train:
        raise UserError(f"data.path: {cfg.data.path}: no prompts")
    return train, evals


def prompt_inputs(rows: list[dict], tokenizer, n: int) -> tuple[list, list[list[int]], dict[str, list]]:
    """For rows: (raw prompts, prompt token ids, other columns repeated ``n`` times as keyword lists). A row's
    ``tools`` go into its prompt through the chat template, as in SFT and DPO."""
    from trainer_lib.data.preference_batches import encode_prompt

    columns = {key: [row[key] for row in rows for _ in range(n)] for key in rows[0] if key != "prompt"}
    prompts = [row["prompt"] for row in rows]
    return prompts, [encode_prompt(tokenizer, row["prompt"], row.get("tools")) for row in rows], columns


def build_episodes(cfg):
    """A multi-turn run's :class:`trainer_lib.rl.environments.Episodes` (``env.class`` set), else None: one
    completion per prompt. The environment is built once here, so a bad class or setting fails early."""
    if not cfg.env.class_:
        return None
    from trainer_lib.rl.environments import Episodes

    return Episodes(cfg.env, {"code_timeout": cfg.reward.code_timeout, "sandbox_workers": cfg.reward.sandbox_workers})


# --------------------------------------------------------------------------- rewards


def build_rewards(cfg, strategy, tokenizer, reward_model=None):
    """The configured reward sources, combined (the environment's ``env`` with ``env.class``, the functions in
    order, then the reward model, then the classifier, then the CLIP reward, then the LLM judge ``llm_judge``,
    then the PRM ``prm``).
    ``reward_model``: reward.model_path's model already in memory (multi_adapter: its adapter on the
    shared base), else it is loaded here."""
    from trainer_lib.rewards.combine import RewardCombiner
    from trainer_lib.rewards.functions import resolve
    from trainer_lib.rl.environments import environment_sources

    settings = {
        "code_timeout": cfg.reward.code_timeout,
        "sandbox_workers": cfg.reward.sandbox_workers,
        "max_tokens": cfg.rollout.max_new_tokens,
        "length_free_tokens": cfg.reward.length_free_tokens,
    }
    sources = [*environment_sources(cfg.env), *(resolve(spec, **settings) for spec in cfg.reward.functions)]
    if cfg.reward.model_path:
        from trainer_lib.rewards.model import load_reward_scorer

        sources.append(
            (
                "reward_model",
                load_reward_scorer(
                    cfg.reward.model_path,
                    cfg.model,
                    strategy.prepare_frozen,
                    cfg.engine.precision,
                    placement=strategy.placement(train=False),
                    batch_size=cfg.eval_batch_size,
                    max_length=cfg.data.max_length + cfg.rollout.max_new_tokens,
                    model=reward_model,
                ),
            )
        )
    if cfg.reward.classifier_path:
        from trainer_lib.rewards.classifier import ClassifierScorer

        sources.append(
            (
                "classifier",
                ClassifierScorer(
                    cfg.reward.classifier_path,
                    cfg.reward.classifier_label,
                    cfg.reward.classifier_score,
                    batch_size=cfg.eval_batch_size,
                    device=strategy.device,
                    trust_remote_code=cfg.model.trust_remote_code,
                ),
            )
        )
    if cfg.reward.clip_path:
        from trainer_lib.rewards.clip import ClipScorer

        scorer = ClipScorer(
            cfg.reward.clip_path,
            batch_size=cfg.eval_batch_size,
            device=strategy.device,
            trust_remote_code=cfg.model.trust_remote_code,
        )
        sources.append(("clip", scorer))
    if cfg.reward.judge.enabled:
        from trainer_lib.rewards.llm_judge import build_judge

        judge = build_judge(cfg.reward.judge, device=strategy.device, precision=cfg.engine.precision)
        sources.append(("llm_judge", judge))
    if cfg.reward.prm_path:
        from trainer_lib.rewards.prm_scorer import load_prm_scorer

        prm = load_prm_scorer(
            cfg.reward.prm_path,
            cfg.model,
            strategy.prepare_frozen,
            cfg.engine.precision,
            cfg.reward.prm_aggregation,
            placement=strategy.placement(train=False),
            max_length=cfg.data.max_length + cfg.rollout.max_new_tokens,
            batch_size=cfg.eval_batch_size,
            device=strategy.device,
        )
        sources.append(("prm", prm))
    return RewardCombiner(
        sources,
        cfg.reward.weights,
        cfg.reward.clip,
        cfg.reward.normalize,
        reduce=lambda sums: strategy.all_reduce(sums, op="sum"),
    )


def reward_table(rewards, rollout, prompts: list, columns: dict, n: int):
    """Per-source rewards ``(N, S)`` of a rollout's completions (no collective call)."""
    from trainer_lib.rewards.functions import as_completions

    repeated = [p for p in prompts for _ in range(n)]
    return rewards.table(repeated, as_completions(repeated, rollout.completions), columns, completion_ids(rollout))


def completion_ids(rollout) -> list[list[int]]:
    """The token ids of each row's completion: the whole response, or a multi-turn episode's last turn (the
    final answer that ``completions`` holds)."""
    rows = rollout.response_ids.tolist()
    if rollout.episodes is not None:
        return [row[slice(*t.turns[-1])] if t.turns else [] for row, t in zip(rows, rollout.episodes)]
    return [row[: int(length)] for row, length in zip(rows, rollout.response_lengths())]


def score_rollout(rewards, strategy, rollout, prompts: list, columns: dict, n: int):
    """``(rewards for training (N,), metrics)``: combined, normalized and clipped rewards; the
    metrics hold the raw weighted reward and each source's mean, reduced over ranks."""
    start = time.perf_counter()
    table = reward_table(rewards, rollout, prompts, columns, n)
    rollout.prompts, rollout.reward_table = [p for p in prompts for _ in range(n)], table
    raw = rewards.weighted(table)
    lengths = rollout.loss_mask.sum(1).float()  # the model's tokens (a multi-turn episode's, all turns)
    sums = strategy.all_reduce(
        {
            "count": float(len(raw)),
            "reward": float(raw.sum()),
            "reward_sq": float((raw**2).sum()),
            "length": float(lengths.sum()),
            "finished": float(sum(rollout.finished)),
            **rewards.source_sums(table),
            **episode_sums_of(rollout),
        },
        op="sum",
    )
    count = max(sums["count"], 1.0)
    mean = sums["reward"] / count
    metrics = {
        "reward": mean,
        "reward_std": max(sums["reward_sq"] / count - mean**2, 0.0) ** 0.5,
        **rewards.source_means(sums),
        "response_length": sums["length"] / count,
        "finished_fraction": sums["finished"] / count,
        "generate_time": rollout.stats["generate_time"],
        "generate_tokens_per_s": strategy.all_reduce(rollout.stats["tokens_per_s"], op="sum"),
        "reward_time": time.perf_counter() - start,
    }
    if rollout.episodes is not None:
        from trainer_lib.rl.multi_turn import episode_metrics

        metrics.update(episode_metrics(sums))
    return rewards.combine(table), metrics


def episode_sums_of(rollout) -> dict:
    """A multi-turn rollout's episode statistics as sums (turns, tool calls, done reasons); empty otherwise."""
    if rollout.episodes is None:
        return {}
    from trainer_lib.rl.multi_turn import episode_sums

    return episode_sums(rollout.episodes, rollout.action_mask, rollout.response_mask)


def rollout_samples(rollout, rewards, advantages, n: int, mask=None) -> list[dict]:
    """``samples.jsonl`` rows (:mod:`trainer_lib.loop.samples`) of a scored step's first completions, whole
    groups of ``n`` first: prompt, completion, raw weighted reward, each source's score and the advantage, per row
    ``(N, 1)`` or the mean over the completion's tokens of ``(N, T)`` (``mask``: the loss mask). A multi-turn
    row also shows its episode: the transcript after the prompt, its turns, step rewards and done reason."""
    from trainer_lib.loop.samples import ROWS_PER_LOG

    count = min(len(rollout), ROWS_PER_LOG)
    labels = [label for _, _, label in rewards.sources]
    table = rollout.reward_table
    weighted = rewards.weighted(table).tolist() if table is not None else [None] * len(rollout)
    advantages = advantages.detach().float().cpu()
    if advantages.shape[1] == 1:
        per_row = advantages[:, 0]
    else:
        mask = rollout.loss_mask if mask is None else mask
        mask = mask.float().cpu()[:, : advantages.shape[1]]
        per_row = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
    lengths = rollout.loss_mask.sum(1).tolist()
    rows = []
    for i in range(count):
        scores = table[i].tolist() if table is not None else []
        rows.append(
            {
                "kind": "rollout",
                "group": i // n,
                "prompt": prompt_text(rollout.prompts[i]) if rollout.prompts else "",
                "completion": rollout.completions[i],
                "reward": weighted[i],
                "rewards": {label: value for label, value in zip(labels, scores) if value == value},  # (NaN: none)
                "advantage": float(per_row[i]),
                "length": int(lengths[i]),
                "finished": bool(rollout.finished[i]),
                **episode_sample(rollout, i),
            }
        )
    return rows


def episode_sample(rollout, row: int) -> dict:
    """``{"episode": ...}`` for a multi-turn row of ``samples.jsonl``; empty for a single completion."""
    if rollout.episodes is None:
        return {}
    episode = rollout.episodes[row].episode
    first = next((i for i, m in enumerate(episode.messages) if m.get("role") == "assistant"), len(episode.messages))
    return {
        "episode": {
            "transcript": prompt_text(episode.messages[first:]),
            "turns": episode.turns,
            "rewards": episode.rewards,
            "done_reason": episode.done_reason,
            "tool_calls": episode.tool_calls.valid,
            "malformed_tool_calls": episode.tool_calls.malformed,
            "tool_errors": episode.tool_calls.errors,
        }
    }


def prompt_text(prompt) -> str:
    """A prompt as text: a string as it is, a conversation as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    lines = []
    for message in prompt or []:
        content = message.get("content", "") if isinstance(message, dict) else message
        if isinstance(content, list):  # multimodal parts: their text
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        lines.append(f"{message.get('role', '?')}: {content}" if isinstance(message, dict) else str(content))
    return "\n".join(lines)


def sample_and_score(
    engine, strategy, tokenizer, schedule, step: int, cfg, rewards, logits_processor=None, episodes=None
):
    """Step ``step``'s experience: ``(rollout, rewards for training (N,), metrics)`` for the prompts the
    ``schedule`` gives this rank, sampled with the step's seed; reward functions may read the step.
    A live prompt pool first takes in feedback files, may sample several rounds (dynamic sampling) and
    learns each prompt's priority from its scores (:mod:`trainer_lib.rl.buffer`). ``logits_processor``
    restricts what may be sampled (NLPO's action mask, :mod:`trainer_lib.rl.nlpo`). ``episodes``: a
    multi-turn run's (:mod:`trainer_lib.rl.environments`), whose episodes replace single completions."""
    schedule.before_step(step)
    rewards.trainer_state = schedule.trainer_state(step)

    processor = policy_processor(cfg.model, tokenizer)

    def sample_and_score_rows(rows: list[dict], seed: int):
        rollout, prompts, columns = sample(
            engine,
            strategy,
            tokenizer,
            rows,
            cfg.rollout,
            seed,
            logits_processor,
            processor=processor,
            episodes=episodes,
        )
        scores, metrics = score_rollout(rewards, strategy, rollout, prompts, columns, cfg.rollout.n)
        return rollout, scores, metrics

    return schedule.collect(step, sample_and_score_rows)


def held_out_evaluation(engine, strategy, tokenizer, rows: list[dict], rewards, cfg, episodes=None):
    """The stage's ``evaluate()`` for its Cadence: greedy held-out reward (of greedy episodes, with
    ``episodes``); None without eval prompts."""
    if not rows:
        return None
    processor = policy_processor(cfg.model, tokenizer)
    return lambda: evaluate(engine, strategy, tokenizer, rows, rewards, cfg.rollout, cfg.seed, processor, episodes)


def evaluate(
    engine, strategy, tokenizer, rows: list[dict], rewards, rollout_cfg, seed: int, processor=None, episodes=None
) -> dict:
    """Mean raw (weighted, not normalized) reward of greedy completions of held-out prompts (``processor``: a
    vision-language policy's, whose prompts carry their images; ``episodes``: a multi-turn run's, played
    greedily)."""
    greedy = dataclasses.replace(rollout_cfg, n=1, temperature=0.0)
    chunks = [rows[i : i + greedy.batch_size] for i in range(0, len(rows), greedy.batch_size)]

    def sums(chunk: list[dict]) -> dict:
        rollout, prompts, columns = sample(
            engine, strategy, tokenizer, chunk, greedy, seed, processor=processor, episodes=episodes
        )
        table = reward_table(rewards, rollout, prompts, columns, 1)
        return {
            "total": float(rewards.weighted(table).sum()),
            "count": float(len(table)),
            "length": float(rollout.loss_mask.sum()),
            **rewards.source_sums(table),
        }

    zeros = {"total": 0.0, "count": 0.0, "length": 0.0, **rewards.source_sums(None)}
    totals = strategy.sharded_sums(chunks, sums, zeros)
    count = max(totals["count"], 1.0)
    return {
        "reward": totals["total"] / count,
        "response_length": totals["length"] / count,
        **rewards.source_means(totals),
    }


# --------------------------------------------------------------------------- policy and reference


def load_reference(cfg, strategy):
    """The frozen reference policy; None under LoRA, where the policy with adapters off is it."""
    if cfg.lora.r > 0:
        return None
    from trainer_lib.models.load import load_causal_lm

    return strategy.prepare_frozen(
        load_causal_lm(cfg.model, cfg.engine.precision, placement=strategy.placement(train=False))
    )


def reference_logprobs(reference, policy, rollout, temperature: float):
    """Token log-probs under the reference (or under ``policy`` with its LoRA adapters disabled)."""
    import torch

    from trainer_lib.rl.rollout import token_logprobs

    with torch.no_grad():
        if reference is not None:
            return token_logprobs(reference, rollout, temperature)[0]
        with policy.module.disable_adapter():
            return token_logprobs(policy, rollout, temperature)[0]


def step_token_rewards(rewards, rollout, tokenizer):
    """``(N, R)`` rewards on tokens from the token-level sources (the PRM with ``reward.prm_aggregation=steps``,
    the environment with ``env.reward=turns``), each placed by its source and times its weight, or None
    without such a source. PPO adds them to its per-token rewards before GAE."""
    sources = rewards.token_level()
    if not sources:
        return None
    return sum(weight * source.placed(rollout, tokenizer) for weight, source in sources)


def close(*held) -> None:
    """Release what a run's reward sources and episodes hold (a sandbox's workers); None is skipped."""
    for thing in held:
        if thing is not None:
            thing.close()


def window_counts(rollout, rows_counted: int = 1) -> dict:
    """The metrics window's ``samples`` and ``tokens`` of a step's rollout; ``rows_counted``: the ranks that
    sampled rows of their own among those the window counts once (a sequence group's, rl/update_passes.py)."""
    return {"samples": len(rollout) * rows_counted, "tokens": rollout_tokens(rollout) * rows_counted}


def per_micro_batch(fn, rollout, micro: int):
    """``fn(part)`` over row chunks of ``rollout``, results padded back into one ``(N, R)`` tensor."""
    import torch

    out = torch.zeros(rollout.response_ids.shape, dtype=torch.float32)
    for start in range(0, len(rollout), micro):
        rows = list(range(start, min(start + micro, len(rollout))))
        values = fn(rollout.select(rows)).float().cpu()
        out[start : start + len(rows), : values.shape[1]] = values
    return out


def sample(
    engine,
    strategy,
    tokenizer,
    rows: list[dict],
    rollout_cfg,
    seed: int,
    logits_processor=None,
    *,
    processor=None,
    episodes=None,
):
    """Generate ``rollout.n`` completions per row with the engine's current weights; with a vision-language
    policy's ``processor``, each prompt's image tokens expanded and its pixels passed to generation; with
    ``episodes``, ``rollout.n`` multi-turn episodes per row instead (:func:`sample_episodes`)."""
    from trainer_lib.rl.rollout import generate

    if episodes is not None:
        return sample_episodes(
            episodes, engine, strategy, tokenizer, rows, rollout_cfg, seed, logits_processor, processor
        )
    prompts, prompt_ids, columns = prompt_inputs(rows, tokenizer, rollout_cfg.n)
    pixel_values = None
    if processor is not None:
        from trainer_lib.data.vision_tokenize import image_prompts

        prompt_ids, pixel_values = image_prompts(rows, processor)
    # ZeRO-3: weights fetched layer by layer by DeepSpeed's hooks, all ranks stepping together
    rollout = generate(
        strategy.unwrap(engine),
        tokenizer,
        prompt_ids,
        n=rollout_cfg.n,
        max_new_tokens=rollout_cfg.max_new_tokens,
        temperature=rollout_cfg.temperature,
        top_p=rollout_cfg.top_p,
        top_k=rollout_cfg.top_k,
        stop=rollout_cfg.stop,
        batch_size=rollout_cfg.batch_size,
        seed=seed,
        synced_gpus=strategy.partitions_parameters and strategy.world_size > 1,
        logits_processor=logits_processor,
        pixel_values=pixel_values,
        record_logprobs=rollout_cfg.tis_cap > 0 and rollout_cfg.temperature > 0,
    )
    return rollout, prompts, columns


def sample_episodes(episodes, engine, strategy, tokenizer, rows, rollout_cfg, seed: int, logits_processor, processor):
    """``rollout.n`` episodes per row (:class:`trainer_lib.rl.environments.Episodes`), each one's reward in
    the ``env_reward`` column beside the rows' own columns."""
    from trainer_lib.rl.environments import ENV_REWARD_COLUMN

    if processor is not None or logits_processor is not None:
        raise UserError("env.class: multi-turn episodes take neither images nor NLPO's action mask yet")
    if strategy.partitions_parameters and strategy.world_size > 1:
        raise UserError(
            "env.class: multi-turn episodes are not supported under engine.zero_stage=3 on several ranks yet "
            "(every rank would have to step its forwards together); use ZeRO 0-2"
        )
    record = rollout_cfg.tis_cap > 0 and rollout_cfg.temperature > 0
    rollout, env_rewards = episodes.rollout(strategy.unwrap(engine), tokenizer, rows, rollout_cfg, seed, record)
    columns = {key: [row[key] for row in rows for _ in range(rollout_cfg.n)] for key in rows[0] if key != "prompt"}
    columns[ENV_REWARD_COLUMN] = env_rewards
    return rollout, [row["prompt"] for row in rows], columns


def rollout_tokens(rollout) -> int:
    """Non-padding tokens (prompt and response) of a rollout's sequences."""
    return int(rollout.prompt_mask.sum()) + int(rollout.response_mask.sum())
