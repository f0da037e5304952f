"""OrtDecoder: greedy generation through onnxruntime equals PyTorch's model.generate token for
token, batches with left padding equal one-by-one runs, eos and sampling behave, and the module
never imports torch (the Triton backend loads it alone)."""

import subprocess
import sys

import pytest
import torch

from tests.export.helpers import prompt_ids
from trainer_lib.export.ort_generate import OrtDecoder, pad_left

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def decoder(exported):
    return OrtDecoder(exported.fp32, threads=1)


def torch_generate(exported, ids, eos):
    with torch.inference_mode():
        out = exported.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=exported.tokenizer.pad_token_id,
        )
    return out[0, len(ids) :].tolist()


def test_greedy_equals_pytorch_generate(decoder, exported):
    eos = exported.tokenizer.eos_token_id
    prompts = prompt_ids(exported.tokenizer)
    expected = [torch_generate(exported, ids, eos) for ids in prompts]
    assert [decoder.generate([ids], NEW_TOKENS, eos_token_id=eos)[0] for ids in prompts] == expected
    assert any(eos in row for row in expected) and any(len(row) == NEW_TOKENS for row in expected)
    assert decoder.generate(prompts, NEW_TOKENS, eos_token_id=eos) == expected  # one left-padded batch


def test_eos_and_length(decoder, exported):
    ids = prompt_ids(exported.tokenizer)[0]
    first = decoder.generate([ids], 1)[0]
    assert len(first) == 1
    assert decoder.generate([ids], NEW_TOKENS, eos_token_id=first[0]) == [first]  # stops at eos, keeps it
    assert decoder.generate([ids], NEW_TOKENS, eos_token_id=[first[0], 10**6]) == [first]
    assert len(decoder.generate([ids], NEW_TOKENS, eos_token_id=None)[0]) == NEW_TOKENS
    assert decoder.last_timing["decode_steps"] == NEW_TOKENS - 1
    assert decoder.generate([ids], 0) == [[]]


def test_sampling(decoder, exported):
    prompts = prompt_ids(exported.tokenizer)[:2]
    greedy = decoder.generate(prompts, NEW_TOKENS)
    assert decoder.generate(prompts, NEW_TOKENS, temperature=1e-4, seed=1) == greedy  # a sharp softmax is argmax
    hot = decoder.generate(prompts, NEW_TOKENS, temperature=5.0, seed=3)
    assert hot == decoder.generate(prompts, NEW_TOKENS, temperature=5.0, seed=3)  # reproducible
    assert hot != greedy  # near-uniform sampling over a 300-token vocabulary does not follow argmax
    vocab = exported.model.config.vocab_size
    assert all(0 <= t < vocab for row in hot for t in row)


def test_pad_left():
    tokens, mask, positions = pad_left([[5, 6, 7], [8]], pad_token_id=1)
    assert tokens.tolist() == [[5, 6, 7], [1, 1, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_rejects_empty_prompts(decoder):
    with pytest.raises(ValueError, match="input_ids"):
        decoder.generate([[1, 2], []], 4)


def test_imports_neither_torch_nor_transformers():
    code = (
        "import sys, trainer_lib.export.ort_generate\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
