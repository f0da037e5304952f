"""Process reward models (PRMs): the step loss that trains one, and how its step scores become one
reward per completion. Tensors in, tensors out.

A PRM scores a solution step by step: one logit per token, read only at the token that ends a step
(``step_mask`` 1 there, 0 elsewhere; where steps end in the text is the caller's business). Shapes are
``(B, T)`` over the scored sequence, as in :mod:`trainer_lib.losses.advantages`. Nothing here imports
more than torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer_lib.losses.advantages import masked_mean, masked_sum


def prm_step_loss(step_logits: torch.Tensor, step_labels: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of each step's score against its label, at the step's end token
    (Math-Shepherd, Wang et al. 2024, the PRM loss, eq. 2; Lightman et al. 2023, "Let's Verify Step by
    Step", train their PRM to predict each step's label at its last token):

        r_s  = sigmoid(logit at the end token of step s)
        loss = -mean_s [ y_s log r_s + (1 - y_s) log(1 - r_s) ]

    the mean over every step of the batch (a long solution weighs by its number of steps). ``step_labels``
    is 1 for a correct step and 0 for a wrong one, or in between (Math-Shepherd's soft estimate: the
    fraction of completions from that step that reach the right answer). Labels off the mask are ignored,
    whatever they hold (e.g. -100).
    """
    marked = step_mask.bool()
    labels = torch.where(marked, step_labels.to(step_logits.dtype), torch.zeros_like(step_logits))
    per_step = F.binary_cross_entropy_with_logits(step_logits, labels, reduction="none")
    return masked_mean(per_step, step_mask.to(step_logits.dtype))


# --------------------------------------------------------------------------- step scores -> one reward
# Each takes step scores (the PRM's probabilities, sigmoid of its logits) in token layout ``(B, T)`` with
# ``step_mask`` marking the step ends, and returns ``(B,)``; a completion without a step gets ``empty``.
# Math-Shepherd ranks solutions by their lowest step; Lightman et al. by the product of the steps' scores
# (min does about as well there). As a GRPO reward, min says "as good as the weakest step", last trusts
# the PRM's view of the whole solution at its end, mean gives partial credit.


def step_min(step_scores: torch.Tensor, step_mask: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
    """The lowest step score of each completion."""
    marked = step_mask.bool()
    lowest = torch.where(marked, step_scores, torch.full_like(step_scores, float("inf"))).min(dim=-1).values
    return torch.where(marked.any(dim=-1), lowest, torch.full_like(lowest, empty))


def step_last(step_scores: torch.Tensor, step_mask: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
    """The score at the last step end of each completion."""
    marked = step_mask.bool()
    positions = torch.arange(step_scores.shape[-1], device=step_scores.device).expand_as(step_scores)
    last = torch.where(marked, positions, torch.full_like(positions, -1)).max(dim=-1).values
    scores = step_scores.gather(-1, last.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(last >= 0, scores, torch.full_like(scores, empty))


def step_mean(step_scores: torch.Tensor, step_mask: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
    """The mean step score of each completion."""
    mask = step_mask.to(step_scores.dtype)
    mean = masked_mean(step_scores, mask, dim=-1)
    return torch.where(masked_sum(torch.ones_like(mask), mask, dim=-1) > 0, mean, torch.full_like(mean, empty))


#: The aggregations by name, for a setting that picks one.
STEP_AGGREGATIONS = {"min": step_min, "last": step_last, "mean": step_mean}
