"""One optimizer step of the preference loop (:mod:`.dpo`), and the policy's log-probs of a batch.

:class:`MicroBatchSteps` is the loop data and tensor parallelism run: per micro-batch one forward of
the policy over chosen and rejected together, the reference's log-probs, the objective, backward and
step. :class:`PipelineSteps` runs the same step through DeepSpeed's pipeline engine
(``parallel.pipeline > 1``): the step's micro-batches flow through the stages in one ``train_batch``;
the last stage turns its logits into each sequence's summed completion log-prob and applies the
objective, the reference log-probs travelling with the micro-batch as labels; the per-pair metrics it
keeps come back to every rank of the pipeline afterwards. Both give the same losses, gradients and
metrics (``tests/engine/test_model_parallel.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class MicroBatchSteps:
    """``objective(policy, reference, batch) -> (B,)`` losses; ``metrics(policy, reference, batch) -> dict``
    of per-pair values (:func:`trainer_lib.stages.training.dpo.batch_metrics`)."""

    def __init__(self, engine, strategy, objective: Callable, metrics: Callable):
        self.engine, self.strategy, self.objective, self.metrics = engine, strategy, objective, metrics
        self.last: tuple[list[int], dict] = ([], {})  # the step's last micro-batch: example ids, per-pair metrics

    def logps(self, batch: dict):
        """The policy's :class:`~trainer_lib.models.reference.SequenceLogps` of a collated batch."""
        from trainer_lib.models.reference import forward_logps

        return forward_logps(self.engine, batch, self.strategy.device, self.strategy.sequence_shards())

    def train(self, micro_batches: Iterable, reference, window) -> None:
        from trainer_lib.data.tokenize import count_tokens

        for ids, batch in micro_batches:
            policy = self.logps(batch)
            ref = reference("train", ids, batch) if reference is not None else None
            losses = self.objective(policy, ref, batch)
            self.strategy.backward(losses.mean(), self.engine)
            self.strategy.optimizer_step(self.engine)
            values = {"loss": losses, **self.metrics(policy, ref, batch)}
            window.add_all(values)
            window.count(samples=len(ids), tokens=count_tokens(batch))
            self.last = (list(ids), {key: value.detach() for key, value in values.items()})


class PipelineSteps(MicroBatchSteps):
    """Paired losses only (their objective needs nothing of the batch beyond the log-probs)."""

    @staticmethod
    def labels(batch: dict, reference) -> tuple:
        """What the last stage needs of a micro-batch: ids, completion mask, segment ids (empty: padded
        rows) and the reference's stacked log-probs (empty: reference-free)."""
        import torch

        empty = torch.empty(0)
        segments = batch.get("segment_ids", empty.long())
        stacked = reference.stacked().float().cpu() if reference is not None else empty
        return batch["input_ids"], batch["completion_mask"], segments, stacked

    @staticmethod
    def policy(logits, labels):
        """The sequences' summed completion log-probs from the last stage's logits."""
        from trainer_lib.data.preference_batches import sequence_logps, split_halves
        from trainer_lib.models.reference import SequenceLogps

        ids, mask, segments, _ = labels
        summed, counts = sequence_logps(logits, ids, mask, segments if segments.numel() else None)
        return SequenceLogps(*split_halves(summed), *split_halves(counts))

    def logps(self, batch: dict):
        from trainer_lib.engine.pipeline import last_stage_outputs
        from trainer_lib.models.reference import SequenceLogps

        def stacked(logits, labels):
            return self.policy(logits, labels).stacked()

        [rows] = last_stage_outputs(self.engine, [batch], [self.labels(batch, None)], stacked)
        rows = rows.to(self.strategy.device)
        return SequenceLogps(rows[:, 0], rows[:, 1], rows[:, 2].long(), rows[:, 3].long())

    def train(self, micro_batches: Iterable, reference, window) -> None:
        from trainer_lib.data.tokenize import count_tokens
        from trainer_lib.engine.pipeline import from_last_stage, train_step
        from trainer_lib.models.reference import SequenceLogps

        taken = list(micro_batches)
        refs = [reference("train", ids, batch) if reference is not None else None for ids, batch in taken]
        kept: list[dict] = []

        def loss_fn(logits, labels):
            policy = self.policy(logits, labels)
            stacked = labels[3]
            ref = SequenceLogps(*stacked.unbind(-1)) if stacked.numel() else None
            losses = self.objective(policy, ref, {})
            values = {"loss": losses, **self.metrics(policy, ref, {})}
            kept.append({key: value.detach().cpu() for key, value in values.items()})
            return losses.mean()

        self.engine.module.loss_fn = loss_fn
        train_step(self.engine, [batch for _, batch in taken], [self.labels(b, r) for (_, b), r in zip(taken, refs)])
        for values in from_last_stage(self.engine, kept):
            window.add_all(values)
        if taken:
            self.last = (list(taken[-1][0]), values)
        for ids, batch in taken:
            window.count(samples=len(ids), tokens=count_tokens(batch))
