"""The parity figures can tell an exported model from a different one, and measure latency."""

import pytest
from transformers import AutoModelForCausalLM

from tests.export.helpers import prompt_ids
from trainer_lib.export import parity
from trainer_lib.export.ort_generate import OrtDecoder


@pytest.fixture(scope="module")
def fp32(exported):
    return OrtDecoder(exported.fp32, threads=1)


def test_same_model_agrees_a_different_one_does_not(exported, fp32, tiny_model_dir):
    prompts = prompt_ids(exported.tokenizer)
    same = parity.logit_parity(parity.reference_logits(parity.TorchDecoder(exported.model), prompts), fp32)
    assert same["prefill"]["max_abs_diff"] < 1e-3 and same["decode"]["max_abs_diff"] < 1e-3
    assert same["top1_agreement"] == 1.0
    assert same["top1_positions"] == sum(map(len, prompts)) + len(prompts)  # every real position + a decode step
    untrained = parity.TorchDecoder(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval())
    other = parity.logit_parity(parity.reference_logits(untrained, prompts), fp32)
    assert other["prefill"]["max_abs_diff"] > 1.0 and other["top1_agreement"] < 0.5


def test_greedy_parity_counts_mismatches(exported, fp32):
    prompts = prompt_ids(exported.tokenizer)[:3]
    eos = exported.tokenizer.eos_token_id
    expected = parity.torch_greedy(exported.model, prompts, 6, eos, exported.tokenizer.pad_token_id)
    assert parity.greedy_parity(expected, fp32, prompts, 6, eos)["greedy_matches"] == 3
    expected[1] = expected[1][:-1] + [expected[1][-1] + 1]
    result = parity.greedy_parity(expected, fp32, prompts, 6, eos)
    assert result == {"greedy_exact_match": 2 / 3, "greedy_matches": 2, "greedy_prompts": 3}


def test_decode_latency(fp32, exported):
    result = parity.decode_latency(fp32, prompt_ids(exported.tokenizer)[0], steps=5)
    assert result["decode_ms_per_token"] > 0
    assert result["tokens_per_s"] == pytest.approx(1000 / result["decode_ms_per_token"], rel=1e-3)


def test_reference_computed_once_equals_pytorch_run_beside(exported):
    """The stage frees the model after ``reference_logits``; PyTorch against its own stored figures
    must then agree exactly (same prompts, same decode token, same positions)."""
    prompts = prompt_ids(exported.tokenizer)
    torch_decoder = parity.TorchDecoder(exported.model)
    reference = parity.reference_logits(torch_decoder, prompts)
    assert reference.prefill.shape == (sum(map(len, prompts)), exported.model.config.vocab_size)
    assert reference.decode.shape == (len(prompts), 1, exported.model.config.vocab_size)
    same = parity.logit_parity(reference, torch_decoder)
    assert same["prefill"]["max_abs_diff"] == same["decode"]["max_abs_diff"] == 0.0
    assert same["top1_agreement"] == 1.0


def test_chunks_of_prompts_give_the_figures_of_one_batch(exported, fp32, monkeypatch):
    """A real vocabulary over thousands of positions does not fit in memory at once: the reference's
    logits go to a file and both sides run a chunk of prompts at a time, with the same figures."""
    prompts = prompt_ids(exported.tokenizer)
    torch_decoder = parity.TorchDecoder(exported.model)
    whole = parity.logit_parity(parity.reference_logits(torch_decoder, prompts), fp32)
    monkeypatch.setattr(parity, "CHUNK_TOKENS", 12)  # a prompt or two per chunk
    assert len(parity.prompt_chunks(prompts)) > 2
    chunked = parity.logit_parity(parity.reference_logits(torch_decoder, prompts), fp32)
    assert chunked["top1_agreement"] == whole["top1_agreement"]
    assert chunked["top1_positions"] == whole["top1_positions"]
    for part in ("prefill", "decode"):
        assert chunked[part]["max_abs_diff"] == pytest.approx(whole[part]["max_abs_diff"], rel=0.5, abs=1e-4)
        assert chunked[part]["mean_abs_diff"] == pytest.approx(whole[part]["mean_abs_diff"], rel=0.5, abs=1e-5)


def test_prompt_chunks_hold_the_budget():
    assert parity.prompt_chunks([[1] * 10] * 5, budget=25) == [(0, 2), (2, 4), (4, 5)]
    assert parity.prompt_chunks([[1] * 100, [1] * 3], budget=50) == [(0, 1), (1, 2)]  # a long prompt alone
    assert parity.prompt_chunks([]) == []
