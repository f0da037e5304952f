"""Preference tokenization (every form prepare produces), one-pass collation, sequence log-probs."""

import math

import pytest
import torch

from trainer_lib.data.formats import normalize_row
from trainer_lib.data.preference_batches import (
    assign_kl_completions,
    average_logps,
    collate_pairs,
    collate_unpaired,
    completion_text,
    sequence_logps,
    split_halves,
    token_fingerprint,
    tokenize_pair,
    tokenize_unpaired,
    unpair,
)
from trainer_lib.data.tokenize import render_prompt


@pytest.fixture(scope="module")
def tokenizer():
    from trainer_lib.demo.tiny_model import train_tokenizer

    return train_tokenizer(["What is two plus two? Four. Five. The answer is four, not five."] * 4, vocab_size=300)


def conv(role, text):
    return [{"role": role, "content": text}]


def decode(tokenizer, ids):
    return tokenizer.decode(ids)


# Every form of preference row that prepare accepts, normalized like prepare normalizes it.
RAW_FORMS = {
    "plain explicit": {"prompt": "What is two plus two?", "chosen": " Four.", "rejected": " Five."},
    "plain implicit": {"chosen": "What is two plus two? Four.", "rejected": "What is two plus two? Five."},
    "chat explicit": {
        "prompt": conv("user", "What is two plus two?"),
        "chosen": conv("assistant", "Four."),
        "rejected": conv("assistant", "Five."),
    },
    "chat implicit": {
        "chosen": conv("user", "What is two plus two?") + conv("assistant", "Four."),
        "rejected": conv("user", "What is two plus two?") + conv("assistant", "Five."),
    },
}


@pytest.mark.parametrize("form", sorted(RAW_FORMS))
def test_every_preference_form_tokenizes_to_prompt_plus_completions(tokenizer, form):
    row = normalize_row(RAW_FORMS[form], "preference", "row:1")
    ex = tokenize_pair(row, tokenizer, 128)
    assert decode(tokenizer, ex["prompt_ids"]) == render_prompt(tokenizer, row["prompt"])
    eos = tokenizer.eos_token
    chosen, rejected = decode(tokenizer, ex["chosen_ids"]), decode(tokenizer, ex["rejected_ids"])
    assert chosen.endswith(eos) and rejected.endswith(eos)  # scored / generated up to eos
    assert "Four." in chosen and "Five." in rejected and "two plus two" not in chosen


def test_chat_completion_is_the_rendered_turn_cut_after_eos(tokenizer):
    prompt, answer = conv("user", "What is two plus two?"), conv("assistant", "Four.")
    full = tokenizer.apply_chat_template(prompt + answer, tokenize=False)
    text = completion_text(tokenizer, prompt, answer)
    assert render_prompt(tokenizer, prompt) + text == full.rstrip("\n")
    assert text == "Four.<|im_end|>"


def test_plain_completion_gets_eos(tokenizer):
    assert completion_text(tokenizer, "Q?", " Four.") == " Four.<|im_end|>"


def test_margin_column_is_carried(tokenizer):
    row = {"prompt": "Q?", "chosen": " Four.", "rejected": " Five.", "margin": 2}
    assert tokenize_pair(row, tokenizer, 64)["margin"] == 2.0


def test_truncation_keeps_prompt_end_and_completion_start(tokenizer):
    row = {"prompt": "What is two plus two? " * 10, "chosen": " Four." * 10, "rejected": " Five."}
    ex = tokenize_pair(row, tokenizer, 24)
    assert len(ex["prompt_ids"]) + len(ex["chosen_ids"]) <= 24
    assert len(ex["prompt_ids"]) + len(ex["rejected_ids"]) <= 24
    full_prompt = tokenizer(row["prompt"])["input_ids"]
    assert ex["prompt_ids"] == full_prompt[-len(ex["prompt_ids"]) :]
    assert ex["chosen_ids"] == tokenizer(" Four." * 10 + "<|im_end|>")["input_ids"][: len(ex["chosen_ids"])]


def test_collate_pairs_puts_chosen_then_rejected_in_one_batch():
    examples = [
        {"prompt_ids": [5, 6], "chosen_ids": [7, 8, 9], "rejected_ids": [10], "margin": 1.0},
        {"prompt_ids": [5], "chosen_ids": [11], "rejected_ids": [12, 13], "margin": 0.5},
    ]
    batch = collate_pairs(examples, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 11, 0, 0, 0], [5, 6, 10, 0, 0], [5, 12, 13, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert batch["completion_mask"].int().tolist() == [
        [0, 0, 1, 1, 1],
        [0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 1, 1, 0, 0],
    ]
    assert batch["margin"].tolist() == [1.0, 0.5]


def test_unpaired_examples_and_kl_completions(tokenizer):
    pairs = [{"prompt_ids": [i], "chosen_ids": [10 + i], "rejected_ids": [20 + i]} for i in range(3)]
    examples = unpair(pairs)
    assert [(e["prompt_ids"], e["completion_ids"], e["label"]) for e in examples[:2]] == [
        ([0], [10], True),
        ([0], [20], False),
    ]
    examples = assign_kl_completions(examples, seed=0, max_length=8)
    # a derangement: every example gets another example's completion; fixed by the seed
    sources = [
        next(j for j, o in enumerate(examples) if o["completion_ids"] == e["kl_completion_ids"]) for e in examples
    ]
    assert all(src != i for i, src in enumerate(sources)) and sorted(sources) == list(range(6))
    again = assign_kl_completions(unpair(pairs), seed=0, max_length=8)
    assert [e["kl_completion_ids"] for e in again] == [e["kl_completion_ids"] for e in examples]
    batch = collate_unpaired(examples[:2], pad_token_id=0)
    assert batch["input_ids"].shape[0] == 4 and batch["label"].tolist() == [True, False]
    assert batch["input_ids"][2, 1] == examples[0]["kl_completion_ids"][0]
    row = tokenize_unpaired({"prompt": "Q?", "completion": " Four.", "label": False}, tokenizer, 64)
    assert row["label"] is False and decode(tokenizer, row["completion_ids"]) == " Four.<|im_end|>"


def test_sequence_logps_sum_only_completion_tokens():
    # vocab 3; row 0: tokens [0, 1, 2] with completion = tokens 1..2; row 1: [0, 2, pad] completion = token 2 only
    logits = torch.zeros(2, 3, 3)
    logits[0, 0] = torch.tensor([0.0, math.log(3.0), 0.0])  # p(1 | 0) = 3 / 5
    input_ids = torch.tensor([[0, 1, 2], [0, 2, 0]])
    mask = torch.tensor([[False, True, True], [False, True, False]])
    summed, counts = sequence_logps(logits, input_ids, mask)
    expected = [math.log(3 / 5) + math.log(1 / 3), math.log(1 / 3)]
    torch.testing.assert_close(summed, torch.tensor(expected))
    assert counts.tolist() == [2, 1]
    torch.testing.assert_close(average_logps(summed, counts), torch.tensor([expected[0] / 2, expected[1]]))


def test_split_halves_and_fingerprint():
    first, second = split_halves(torch.arange(6))
    assert first.tolist() == [0, 1, 2] and second.tolist() == [3, 4, 5]
    a = [{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]}]
    b = [{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [4]}]
    assert token_fingerprint(a, "ref") == token_fingerprint(a, "ref")
    assert token_fingerprint(a, "ref") != token_fingerprint(b, "ref") != token_fingerprint(a, "other")
