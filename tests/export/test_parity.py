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
    same = parity.logit_parity(parity.TorchDecoder(exported.model), fp32, prompts)
    assert same["prefill"]["max_abs_diff"] < 1e-3 and same["decode"]["max_abs_diff"] < 1e-3
    assert same["top1_agreement"] == 1.0
    assert same["top1_positions"] == sum(map(len, prompts)) + len(prompts)  # every real position + a decode step
    untrained = parity.TorchDecoder(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval())
    other = parity.logit_parity(untrained, fp32, prompts)
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
