"""The LM head a tile at a time inside real models: the same loss, log-probs and gradients as full
logits, the fallbacks, and the memory it saves at a real vocabulary."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import trainer_lib.losses.chunked_head as chunked
from trainer_lib.models.lm_head import causal_lm_loss, head_weight, scored_logprobs, use_full_logits

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    monkeypatch.setattr(chunked, "TILE_ELEMENTS", 97 * 5)  # 5-row tiles: every batch spans several


def tiny(model_type="llama", **extra):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**SMALL, **extra}))


def batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 97, (3, 12), generator=gen)
    labels = ids.clone()
    labels[:, :5] = -100  # prompts
    labels[2, 9:] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def grads(model) -> dict:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_causal_lm_loss_equals_transformers_loss_and_gradients():
    model = tiny()
    want = model(**batch()).loss
    want.backward()
    want_grads = grads(model)
    model.zero_grad()
    got = causal_lm_loss(model, batch())
    got.backward()
    assert head_weight(model) is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    got_grads = grads(model)
    assert got_grads.keys() == want_grads.keys() and "lm_head.weight" in got_grads
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_scored_logprobs_of_a_frozen_head_equal_full_logits_with_lora_gradients():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    data = batch()
    ids, mask = data["input_ids"], (data["labels"] != -100)[:, 1:].float()
    inputs = {"input_ids": ids, "attention_mask": data["attention_mask"]}
    logits = model(**inputs).logits[:, :-1] / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask
    (want * torch.linspace(-1, 1, 11)).sum().backward()
    want_grads = grads(model)
    model.zero_grad()
    got, entropy = scored_logprobs(model, inputs, ids[:, 1:], mask, temperature=0.7, with_entropy=True)
    (got * torch.linspace(-1, 1, 11)).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want_entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1) * mask
    torch.testing.assert_close(entropy, want_entropy.detach(), rtol=1e-5, atol=1e-6)
    got_grads = grads(model)
    assert got_grads.keys() == want_grads.keys() and all("lora" in name for name in got_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def padded_batch(left: bool):
    """Rows of 12, 7 and 4 real tokens, padded on the left (with positions counted from each row's first
    real token, as a rollout numbers them) or on the right (no positions: transformers counts columns)."""
    data = batch()
    mask = torch.ones_like(data["input_ids"])
    for row, real in ((1, 7), (2, 4)):
        pads = slice(0, 12 - real) if left else slice(real, 12)
        mask[row, pads] = 0
        data["input_ids"][row, pads] = 0
        data["labels"][row, pads] = -100
        data["labels"][row, 12 - real if left else 0] = -100  # a row's first token is nobody's target
    data["labels"][:, :3] = -100
    data["attention_mask"] = mask
    if left:
        data["position_ids"] = (mask.cumsum(1) - 1).clamp(min=0)
    return data


@pytest.mark.parametrize("attention", ["sdpa", "posttrain_sdpa", "eager"])
@pytest.mark.parametrize("left", [True, False], ids=["left-padded", "right-padded"])
def test_a_padded_batch_runs_padding_free_with_the_padded_losses_and_gradients(attention, left):
    from trainer_lib.models.attention import register
    from trainer_lib.models.lm_head import padding_free_inputs

    register()
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **SMALL)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    data = padded_batch(left)
    inputs = {key: value for key, value in data.items() if key != "labels"}
    keep, packed = padding_free_inputs(model, inputs)
    assert packed["input_ids"].shape == (1, 23) and int(keep.sum()) == 23  # the 36 padded positions hold 23 tokens
    seen = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape), with_kwargs=True
    )

    mask = (data["labels"] != -100)[:, 1:].float()
    logits = model(**inputs).logits[:, :-1]
    want_nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), data["labels"][:, 1:].reshape(-1))
    want_logps = torch.log_softmax(logits, -1).gather(-1, data["input_ids"][:, 1:, None]).squeeze(-1) * mask
    (want_nll + (want_logps * torch.linspace(-1, 1, 11)).sum()).backward()
    want_grads = grads(model)
    model.zero_grad()
    got_nll = causal_lm_loss(model, data)
    got_logps, _ = scored_logprobs(model, inputs, data["input_ids"][:, 1:], mask)
    (got_nll + (got_logps * torch.linspace(-1, 1, 11)).sum()).backward()
    assert seen[1:] == [(1, 23), (1, 23)]  # the padded reference, then both tiled paths padding-free
    torch.testing.assert_close(got_nll, want_nll, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_logps, want_logps, rtol=1e-5, atol=1e-5)
    got_grads = grads(model)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_models_whose_logits_are_not_a_plain_projection_take_full_logits():
    assert head_weight(tiny("gemma2", head_dim=8, final_logit_softcapping=30.0)) is None
    marked = tiny()
    use_full_logits(marked)  # model.chunked_lm_head=false
    assert head_weight(marked) is None
    assert scored_logprobs(marked, {"input_ids": batch()["input_ids"]}, batch()["input_ids"], batch()["labels"]) is None
    torch.testing.assert_close(causal_lm_loss(marked, batch()), tiny()(**batch()).loss)

    class OlderRemoteCode(type(tiny())):  # a forward from before logits_to_keep
        def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    older = OlderRemoteCode(tiny().config)
    assert head_weight(older) is None
    assert causal_lm_loss(older, batch()).isfinite()


STEP = textwrap.dedent(
    """
    import json, resource, sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trainer_lib.models.lm_head import causal_lm_loss, use_full_logits
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    model = LlamaForCausalLM(config)
    if sys.argv[1] == "full":
        use_full_logits(model)
    ids = torch.randint(0, 151936, (1, 1024))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    causal_lm_loss(model, {"input_ids": ids, "labels": ids}).backward()
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"peak_growth_mib": grew / 1024}))
    """
)


def peak_growth_mib(path: str) -> float:
    out = subprocess.run([sys.executable, "-c", STEP, path], capture_output=True, text=True, check=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_mib"]


def test_a_real_vocabulary_sft_step_never_holds_the_full_logits():
    """One 1,024-token SFT step at Qwen2.5's 151,936-token vocabulary: its float32 logits alone are
    594 MiB, so a full-logits step grows past that (three times over); the tiled one (128 MiB
    tiles) stays under it, and under 0.4x the full-logits step."""
    tiled, full = peak_growth_mib("tiled"), peak_growth_mib("full")
    logits_mib = 1024 * 151936 * 4 / 2**20
    assert full > logits_mib, (tiled, full)
    assert tiled < logits_mib and tiled < 0.4 * full, (tiled, full)
