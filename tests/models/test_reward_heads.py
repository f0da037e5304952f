"""A reward model scores packed rows as it scores padded ones: the head at each sequence's last token."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from trainer_lib.data.preference_batches import collate_pairs, model_inputs
from trainer_lib.models.attention import register
from trainer_lib.models.heads import apply_reward_lora, sequence_rewards
from trainer_lib.stages.training.reward import pair_losses

PAD = 0


def reward_model():
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama",
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=PAD,
    )
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=register())


def pairs():
    gen = torch.Generator().manual_seed(3)

    def ids(n):
        return torch.randint(1, 61, (n,), generator=gen).tolist()

    return [
        {"prompt_ids": ids(p), "chosen_ids": ids(c), "rejected_ids": ids(r), "margin": 0.5}
        for p, c, r in [(5, 3, 7), (2, 9, 4), (6, 1, 2)]
    ]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_packed_rewards_and_gradients_equal_padded(lora):
    from trainer_lib.config import LoraConfig

    model = reward_model()
    if lora:
        model = apply_reward_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    padded, packed = collate_pairs(pairs(), PAD), collate_pairs(pairs(), PAD, packed=True)
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed
    want = sequence_rewards(model, model_inputs(padded, "cpu"))
    got = sequence_rewards(model, model_inputs(packed, "cpu"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    grads = []
    for batch in (padded, packed):
        model.zero_grad()
        pair_losses(model, batch, "cpu")[0].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("score" in name for name in grads[1])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
