"""A process reward model (from ``posttrain reward objective=process``) as a reward function.

Each completion is split into steps with the PRM's ``step_separator`` (from its ``prm.json``), tokenized
after its prompt as the PRM was trained (:func:`trainer_lib.data.step_labels.encode_steps`), and scored at
each step's last token; the step scores (sigmoid of the head) become one reward by an aggregation of
:data:`trainer_lib.losses.process_reward.STEP_AGGREGATIONS`: ``min`` (the weakest step, Math-Shepherd's
choice), ``last`` or ``mean``. A completion without a step gets 0.

``steps`` (PPO): the step scores stay token-level rewards, each on the response token that ends its step
(:meth:`PRMScorer.step_scores`, placed by :func:`trainer_lib.rl.experience.step_token_rewards`) so that GAE
credits the step where it is; the scalar the scorer returns then (for the logged ``rewards/prm`` and the
held-out reward) is their mean, and it is left out of the completion's training reward.
"""

from __future__ import annotations

import json
import os

from trainer_lib.data.formats import generated_text
from trainer_lib.data.step_labels import PRM_FILE, STEP_JOIN, STEP_SEPARATOR, collate_steps, encode_steps, split_steps
from trainer_lib.errors import UserError


class PRMScorer:
    """``scorer(prompts, completions, **columns) -> list[float]``: each completion's aggregated step score.

    Args:
        model: a reward model (scalar head) trained as a PRM, frozen; tokenizer: its tokenizer.
        aggregation: ``min``, ``last`` or ``mean``.
        separator, join: the PRM's step settings (``prm.json``).
        max_length: most tokens of prompt and steps; later steps are left out.
        batch_size: sequences per forward pass; device: where the inputs go.
    """

    def __init__(
        self,
        model,
        tokenizer,
        aggregation: str = "min",
        separator: str = STEP_SEPARATOR,
        join: str = STEP_JOIN,
        max_length: int = 1024,
        batch_size: int = 8,
        device="cpu",
    ):
        from trainer_lib.losses.process_reward import STEP_AGGREGATIONS

        if aggregation not in (*STEP_AGGREGATIONS, "steps"):
            raise UserError(
                f"reward.prm_aggregation: expected one of {sorted(STEP_AGGREGATIONS)} or steps, got {aggregation!r}"
            )
        self.model, self.tokenizer = model, tokenizer
        self.token_level = aggregation == "steps"  # (RewardCombiner leaves it out of the completion's reward)
        self.aggregate = STEP_AGGREGATIONS["mean" if self.token_level else aggregation]
        self.separator, self.join = separator, join
        self.max_length, self.batch_size, self.device = max_length, batch_size, device
        self.__name__ = "prm"  # the reward's metric name (rewards/prm)

    @staticmethod
    def settings(path: str) -> dict:
        """The PRM's step settings from ``prm.json`` in its directory; an error when it has none."""
        file = os.path.join(path, PRM_FILE)
        if not os.path.exists(file):
            raise UserError(
                f"reward.prm_path: {path} has no {PRM_FILE}; train one with posttrain reward objective=process"
            )
        with open(file, encoding="utf-8") as fh:
            return json.load(fh)

    def __call__(self, prompts: list, completions: list, **columns) -> list[float]:
        rewards: list[float] = []
        for probabilities, step_mask in self._scored(prompts, completions):
            rewards.extend(self.aggregate(probabilities, step_mask).tolist())
        return rewards

    def step_scores(self, prompts: list, completions: list) -> list[list[tuple[int, float]]]:
        """Each completion's steps as ``(where the step ends in the completion's text, its score)``; the steps
        that did not fit in ``max_length`` tokens are left out."""
        ends = []
        for completion in completions:
            text, position, found = generated_text(completion), 0, []
            for step in split_steps(text, self.separator):
                position = text.index(step, position) + len(step)
                found.append(position)
            ends.append(found)
        scores: list[list[float]] = []
        for probabilities, step_mask in self._scored(prompts, completions):
            scores += [row[kept.bool()].tolist() for row, kept in zip(probabilities, step_mask)]
        return [list(zip(where, values)) for where, values in zip(ends, scores)]

    def placed(self, rollout, tokenizer):
        """``(N, R)``: each step's score on the response token whose decoded prefix completes the step's text
        (``rollout``: an RL rollout with the prompts its rewards saw; ``tokenizer``: the policy's)."""
        import torch

        placed = torch.zeros(rollout.response_ids.shape, dtype=torch.float32)
        lengths = rollout.response_lengths().tolist()
        scored = self.step_scores(rollout.prompts, rollout.completions)
        for row, (ids, steps) in enumerate(zip(rollout.response_ids.tolist(), scored)):
            for end, score in steps:
                placed[row, token_ending_at(tokenizer, ids[: max(int(lengths[row]), 1)], end)] += score
        return placed

    def _scored(self, prompts: list, completions: list):
        """``(step probabilities (B, T), step mask (B, T))`` a batch at a time: the sigmoid of the head at every
        token, and 1 at each step's last token."""
        import torch

        from trainer_lib.models.heads import token_rewards

        examples = []
        for prompt, completion in zip(prompts, completions):
            steps = split_steps(generated_text(completion), self.separator)
            ids, ends = encode_steps(self.tokenizer, prompt, steps, self.max_length, self.join)
            examples.append({"input_ids": ids or [self.tokenizer.pad_token_id], "step_ends": ends})
        for start in range(0, len(examples), self.batch_size):
            batch = collate_steps(examples[start : start + self.batch_size], self.tokenizer.pad_token_id)
            with torch.no_grad():
                logits = token_rewards(
                    self.model, batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
                )
            yield torch.sigmoid(logits), batch["step_mask"].to(logits.device)


def token_ending_at(tokenizer, ids: list[int], end: int) -> int:
    """The first of ``ids`` whose decoded prefix reaches ``end`` characters (the last one if none does)."""
    low, high = 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(ids[: middle + 1], skip_special_tokens=True)) >= end:
            high = middle
        else:
            low = middle + 1
    return low


def load_prm_scorer(
    path: str, model_cfg, prepare, precision: str, aggregation: str, placement=None, **settings
) -> PRMScorer:
    """The PRM at ``path`` (local, a URL or a hub id; trained by ``posttrain reward objective=process``), its
    weights where ``placement`` says, wrapped by ``prepare`` (``strategy.prepare_frozen``), with its own
    tokenizer and step settings."""
    import dataclasses

    from trainer_lib.models.heads import load_reward_model
    from trainer_lib.models.load import load_tokenizer, resolve_model_path

    key = "reward.prm_path"
    local = resolve_model_path(path, key)
    steps = PRMScorer.settings(local)
    cfg = dataclasses.replace(model_cfg, path=path, tokenizer_path=None, revision="", chat_template="")
    tokenizer = load_tokenizer(cfg)
    model = prepare(load_reward_model(cfg, tokenizer.pad_token_id, precision, path, placement, key))
    return PRMScorer(
        model,
        tokenizer,
        aggregation,
        steps.get("step_separator", STEP_SEPARATOR),
        steps.get("step_join", STEP_JOIN),
        **settings,
    )
