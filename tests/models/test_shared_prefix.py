"""Shared prefixes: rows that begin alike (the completions of one prompt) run their common beginning once, and every
row's states and gradients are those of the padded forward of the whole batch."""

import pytest
import torch

from tests.models.test_attention import SMALL, tiny
from trainer_lib.models import lm_head
from trainer_lib.models.attention import NAME, register


def tiny_llama(attention: str):
    register()
    return tiny("llama", attention)


def rollout_batch(prompts: list[int], completions: list[int], group: int) -> dict:
    """A rollout's layout: left-padded prompts (``group`` rows of each), right-padded completions."""
    gen = torch.Generator().manual_seed(3)
    rows = []
    for length in prompts:
        prompt = torch.randint(3, 97, (length,), generator=gen).tolist()
        rows += [
            (prompt, torch.randint(3, 97, (completions[len(rows)],), generator=gen).tolist()) for _ in range(group)
        ]
    width_p, width_c = max(prompts), max(completions)
    ids = torch.zeros(len(rows), width_p + width_c, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (prompt, completion) in enumerate(rows):
        ids[i, width_p - len(prompt) : width_p] = torch.tensor(prompt)
        ids[i, width_p : width_p + len(completion)] = torch.tensor(completion)
        mask[i, width_p - len(prompt) : width_p + len(completion)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def test_prefix_groups_join_rows_that_begin_alike_and_keep_a_token_of_their_own():
    a, b = [(t, t) for t in range(40)], [(t + 50, t) for t in range(40)]
    rows = [a + [(1, 40)], a + [(2, 40), (3, 41)], a + [(1, 40)], b + [(4, 40)], b, [(9, 0)] * 5]
    groups = lm_head.prefix_groups(rows)
    # the first three share 40 tokens (the third row repeats the first: it still keeps a token of its own),
    # the next two 39 (b alone is 40 long), and the last shares nothing
    assert groups == [(40, [0, 1, 2]), (39, [3, 4]), (5, [5])]
    # a row that would shrink a group's prefix more than it saves starts its own group
    short = [(t, t) for t in range(17)] + [(7, 17)]
    assert lm_head.prefix_groups([a + [(1, 40)], a + [(2, 40)], a + [(3, 40)], short]) == [
        (40, [0, 1, 2]),
        (18, [3]),
    ]


@pytest.mark.parametrize("group, shuffled", [(1, False), (4, False), (4, True)])
def test_shared_prefix_states_and_gradients_equal_the_padded_forward(group, shuffled):
    model = tiny_llama(NAME)
    prompts, completions = [30, 24, 41], [9, 12, 5, 7, 3, 11, 8, 10, 6, 4, 12, 2][: 3 * group]
    inputs = rollout_batch(prompts, completions, group)
    if shuffled:  # an update's micro-batch: the rollouts in a shuffled order
        order = torch.randperm(len(completions), generator=torch.Generator().manual_seed(7))
        inputs = {key: value[order] for key, value in inputs.items()}
    keep = inputs["attention_mask"].bool()
    shared = lm_head.shared_prefix_inputs(model, inputs)
    if group == 1:  # nothing to share: the batch runs padding-free, each row whole
        assert shared is None
        return
    packed = shared[1]
    real = int(keep.sum())
    assert packed["input_ids"].shape[1] == real - sum((group - 1) * p for p in prompts)  # each prompt once

    weights = torch.randn(
        keep.shape[0], keep.shape[1], SMALL["hidden_size"], generator=torch.Generator().manual_seed(5)
    )

    def states_and_grads(share: bool):
        model.zero_grad()
        hidden = lm_head.final_hidden(model, inputs, share_prefixes=share)
        (hidden[keep] * weights[keep]).sum().backward()
        return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain_states, plain_grads = states_and_grads(False)
    shared_states, shared_grads = states_and_grads(True)
    torch.testing.assert_close(shared_states[keep], plain_states[keep], rtol=1e-5, atol=1e-5)
    assert (shared_states[~keep] == 0).all()
    assert shared_grads.keys() == plain_grads.keys() and len(plain_grads) > 10
    for name, grad in plain_grads.items():
        # the same sums in another order: equal to float rounding, relative to the largest entry
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()), msg=name)


def test_no_sharing_where_the_attention_is_not_ours():
    model = tiny_llama("sdpa")
    inputs = rollout_batch([30, 24], [9, 12, 5, 7, 3, 11, 8, 10], 4)
    assert lm_head.shared_prefix_inputs(model, inputs) is None


def test_gradient_checkpointing_keeps_the_shared_states():
    model = tiny_llama(NAME).train()
    inputs = rollout_batch([30, 24], [9, 12, 5, 7, 3, 11, 8, 10], 4)
    keep = inputs["attention_mask"].bool()
    plain = lm_head.final_hidden(model, inputs)
    model.gradient_checkpointing_enable()
    shared = lm_head.final_hidden(model, inputs, share_prefixes=True)
    shared[keep].pow(2).sum().backward()  # the recomputation in backward is handed the same groups
    torch.testing.assert_close(shared[keep], plain[keep].detach(), rtol=1e-5, atol=1e-5)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_no_sharing_for_a_model_with_a_sliding_window():
    register()
    model = tiny("mistral", NAME, sliding_window=16)
    assert lm_head.shared_prefix_inputs(model, rollout_batch([30, 24], [9, 12, 5, 7, 3, 11, 8, 10], 4)) is None
