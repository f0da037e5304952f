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
