"""posttrain_sdpa: packed rows attended per sequence, exactly as if each sequence ran alone; otherwise sdpa."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from trainer_lib.models.attention import NAME, register, sequence_starts

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny(model_type: str, attention: str, **extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SMALL, **extra)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()


def packed_row(lengths):
    ids = torch.randint(3, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids, positions


def test_sequence_starts_are_where_the_positions_restart():
    assert sequence_starts(torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1]])) == [0, 3, 5, 6]
    assert sequence_starts(torch.tensor([[5, 6, 7]])) == [0]  # one sequence, offset (a continuation)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
def test_a_packed_row_gives_each_sequence_the_logits_it_gets_alone(model_type):
    register()
    lengths = [7, 1, 12, 5]
    ids, positions = packed_row(lengths)
    model = tiny(model_type, NAME)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        offsets = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        alone = torch.cat(
            [model(input_ids=ids[:, a:b], use_cache=False).logits for a, b in zip(offsets[:-1], offsets[1:])], dim=1
        )
    assert torch.allclose(packed, alone, atol=1e-5)


def test_gradients_match_transformers_block_diagonal_sdpa():
    register()
    ids, positions = packed_row([9, 4, 15])
    grads = {}
    for attention in ("sdpa", NAME):
        model = tiny("llama", attention).train()
        loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss
        loss.backward()
        grads[attention] = (loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[NAME][0] == pytest.approx(grads["sdpa"][0], abs=1e-6)
    assert torch.allclose(grads[NAME][1], grads["sdpa"][1], atol=1e-6)


def test_padded_batches_and_generation_are_plain_sdpa():
    register()
    ids = torch.randint(3, 97, (3, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as in generation
    mask[2, :1] = 0
    outputs = {}
    for attention in ("sdpa", NAME):
        model = tiny("llama", attention)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        generated = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0
        )
        outputs[attention] = (logits * mask[..., None], generated)
    assert torch.allclose(outputs[NAME][0], outputs["sdpa"][0], atol=1e-5)
    assert torch.equal(outputs[NAME][1], outputs["sdpa"][1])
