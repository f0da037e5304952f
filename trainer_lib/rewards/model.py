"""A trained reward model as a reward function, normalized with the statistics stored with it.

The sequence is built exactly as the reward stage built its training pairs (prompt rendered
with the generation prompt, then the completion as a chat turn closed by eos, or plain text
plus eos) with the reward model's own tokenizer, so the policy's tokenizer may differ.
"""

from __future__ import annotations

import torch

from trainer_lib.data.preference_batches import encode_completion, encode_prompt


class RewardModelScorer:
    """``scorer(prompts, completions, **columns) -> list[float]``: ``(r - mean) / std``."""

    def __init__(
        self, model, tokenizer, mean: float = 0.0, std: float = 1.0, batch_size: int = 16, max_length: int = 2048
    ):
        self.model, self.tokenizer = model, tokenizer
        self.mean, self.std = mean, std
        self.batch_size, self.max_length = batch_size, max_length

    def _encode(self, prompt, completion) -> list[int]:
        ids = encode_prompt(self.tokenizer, prompt) + encode_completion(self.tokenizer, prompt, completion)
        return ids[-self.max_length :]

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **columns) -> list[float]:
        from trainer_lib.models.heads import normalize_rewards, sequence_rewards

        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        sequences = [self._encode(p, c) for p, c in zip(prompts, completions)]
        out: list[float] = []
        for start in range(0, len(sequences), self.batch_size):
            chunk = sequences[start : start + self.batch_size]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, seq in enumerate(chunk):  # right padding: the head reads the last real token
                ids[i, : len(seq)] = torch.tensor(seq)
                mask[i, : len(seq)] = 1
            rewards = sequence_rewards(self.model, {"input_ids": ids.to(device), "attention_mask": mask.to(device)})
            out.extend(normalize_rewards(rewards.cpu(), self.mean, self.std).tolist())
        return out


def load_reward_scorer(
    path: str,
    model_cfg,
    prepare,
    precision: str = "fp32",
    placement=None,
    batch_size: int = 16,
    max_length: int = 2048,
    model=None,
    key: str = "reward.model_path",
) -> RewardModelScorer:
    """Load the reward model at ``path`` (local, a URL or a hub id), its weights where ``placement`` says
    (``strategy.placement(train=False)``: partitioned under ZeRO-3); ``prepare`` wraps it
    (``strategy.prepare_frozen``). Without stored statistics rewards are used as they are.
    ``model``: the reward model already in memory (a reward adapter on a shared base), so only
    the tokenizer and statistics are read from ``path``. ``key``: the setting that named ``path``, for errors."""
    import dataclasses

    from trainer_lib.models.heads import load_reward_model, load_stats
    from trainer_lib.models.load import load_tokenizer, resolve_model_path

    local = resolve_model_path(path, key)  # first: a missing or bad location (a damaged GGUF) names its key
    # the reward model's own tokenizer and template, not the policy's revision or template
    cfg = dataclasses.replace(model_cfg, path=path, tokenizer_path=None, revision="", chat_template="")
    tokenizer = load_tokenizer(cfg)
    if model is None:
        model = prepare(load_reward_model(cfg, tokenizer.pad_token_id, precision, path, placement, key))
    stats = load_stats(local) or {"reward_mean": 0.0, "reward_std": 1.0}
    return RewardModelScorer(model, tokenizer, stats["reward_mean"], stats["reward_std"], batch_size, max_length)
