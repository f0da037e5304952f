"""The PRM step loss and the step-score aggregations against hand computations."""

import math

import pytest
import torch

from trainer_lib.losses import prm_step_loss, step_last, step_mean, step_min
from trainer_lib.losses.process_reward import STEP_AGGREGATIONS


def test_prm_step_loss_by_hand_only_at_step_ends():
    # row 0: steps end at tokens 0 and 2 (labels 1 and 0); token 1 is inside a step (label -100, ignored)
    # row 1: one step, ending at token 0, label 1
    #   BCE(logit 0, y 1)     = -ln(0.5)                     = 0.693147
    #   BCE(logit 2, y 0)     = -ln(1 - sigmoid(2)) = softplus(2) = 2.126928
    #   BCE(logit ln 3, y 1)  = -ln(0.75)                    = 0.287682
    #   mean over the 3 steps = 3.107757 / 3                 = 1.035919
    logits = torch.tensor([[0.0, 5.0, 2.0], [math.log(3), 0.0, 0.0]], requires_grad=True)
    labels = torch.tensor([[1.0, -100.0, 0.0], [1.0, -100.0, -100.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    loss = prm_step_loss(logits, labels, mask)
    assert loss.item() == pytest.approx(1.035919, abs=1e-5)
    loss.backward()
    # d loss / d logit = (sigmoid(logit) - y) / 3 at the step ends, 0 elsewhere
    expected = [[(0.5 - 1) / 3, 0.0, (1 / (1 + math.exp(-2)) - 0) / 3], [(0.75 - 1) / 3, 0.0, 0.0]]
    assert torch.allclose(logits.grad, torch.tensor(expected), atol=1e-6)


def test_prm_step_loss_takes_soft_labels():
    # Math-Shepherd's soft estimate: label 0.5 at p = 0.75: -(0.5 ln 0.75 + 0.5 ln 0.25) = 0.836988
    loss = prm_step_loss(torch.tensor([[math.log(3)]]), torch.tensor([[0.5]]), torch.tensor([[1]]))
    assert loss.item() == pytest.approx(0.836988, abs=1e-5)


def test_aggregations_min_last_mean_by_hand():
    scores = torch.tensor([[0.9, 0.0, 0.2, 0.7], [0.5, 0.6, 0.1, 0.1], [0.3, 0.3, 0.3, 0.3]])
    mask = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # the third completion has no step
    assert step_min(scores, mask, empty=-1.0).tolist() == pytest.approx([0.2, 0.6, -1.0])
    assert step_last(scores, mask, empty=-1.0).tolist() == pytest.approx([0.7, 0.6, -1.0])
    assert step_mean(scores, mask, empty=-1.0).tolist() == pytest.approx([(0.9 + 0.2 + 0.7) / 3, 0.6, -1.0])
    assert step_min(scores, mask)[2].item() == 0.0  # default for no step: 0
    assert set(STEP_AGGREGATIONS) == {"min", "last", "mean"}
    assert STEP_AGGREGATIONS["last"] is step_last
