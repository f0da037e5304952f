"""How a rank walks a step's update micro-batches: its own, or (``parallel.sequence=S``) each rank's of its
sequence group in turn, every row split over the group.

Rollouts are generated whole on each rank, as without S (a long completion is sampled by one rank, its
KV cache on that rank). Only the training pass is split: for every micro-batch, the S ranks of a group
exchange their micro-batches (token ids, masks, old and reference log-probs, advantages: small CPU
tensors) and run S passes together, each over one member's rows made one padding-free row and cut into S
chunks (:func:`trainer_lib.rl.rollout.split_token_logprobs`); every rank computes the same loss from the
joined log-probs. DeepSpeed counts each pass as a micro-step (the accumulation is S times the data-parallel
one, ``RLConfig.engine_for``), so the loss of S passes is averaged as S ranks' would be, and the
gradients equal those of S data-parallel ranks training on the same rollouts. Old and reference log-probs
before the update are whole-sequence forwards on the rank that sampled the rows.
"""

from __future__ import annotations

from collections.abc import Iterator


def update_passes(strategy):
    """:class:`WholeSequences`, or :class:`SequenceGroup` under ``parallel.sequence > 1``."""
    shards = strategy.sequence_shards()
    return WholeSequences() if shards is None else SequenceGroup(shards)


def _rows(rollout, micro: list[int], per_row: dict) -> tuple:
    part = rollout.select(micro)
    width = part.response_ids.shape[1]
    return part, {key: None if value is None else value[micro, :width] for key, value in per_row.items()}


class WholeSequences:
    """Each rank its own micro-batches, whole sequences."""

    #: the metrics window counts rows once per model replica; a rank's rows are its own here
    rows_counted = 1

    def parts(self, rollout, micro: list[int], per_row: dict) -> Iterator[tuple]:
        """``(rollout part, {key: its rows of each (N, ...) tensor of per_row, or None})`` for ``micro``."""
        yield _rows(rollout, micro, per_row)

    def logprobs(self, engine, part, temperature: float, with_entropy: bool = False, entropy_grad: bool = False):
        from trainer_lib.rl.rollout import token_logprobs

        return token_logprobs(engine, part, temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)

    def values(self, models, part):
        """The critic's values ``(N, R)`` of ``part`` (PPO)."""
        return models.token_values(part)


class SequenceGroup:
    """Every rank of a sequence group each member's micro-batch in turn, split over the group."""

    def __init__(self, shards):
        self.shards = shards
        self.rows_counted = shards.size  # each rank of the group sampled its own rows

    def parts(self, rollout, micro: list[int], per_row: dict) -> Iterator[tuple]:
        part, given = _rows(rollout, micro, per_row)
        given = {key: None if value is None else value.detach().cpu() for key, value in given.items()}
        yield from self.shards.gather_objects((part, given))

    def logprobs(self, engine, part, temperature: float, with_entropy: bool = False, entropy_grad: bool = False):
        from trainer_lib.rl.rollout import split_token_logprobs

        if entropy_grad:  # (PPOConfig refuses entropy_coef > 0 with parallel.sequence)
            raise ValueError("parallel.sequence: the entropy bonus's gradient is not split over a sequence group")
        return split_token_logprobs(engine, part, self.shards, temperature, with_entropy)

    def values(self, models, part):
        from trainer_lib.rl.actor_critic import split_critic_values

        return split_critic_values(models.critic_engine, part, self.shards)
