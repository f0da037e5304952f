"""Prompt masking, packing and the no-cross-contamination guarantee."""

import pytest
import torch

from trainer_lib.data.tokenize import IGNORE, collate_packed, micro_batches, pack, tokenize_sft


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _labelled_text(tokenizer, example):
    return tokenizer.decode([t for t, lab in zip(example["input_ids"], example["labels"]) if lab != IGNORE])


def test_messages_loss_only_on_assistant_turns(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello there!"},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
    ]
    ex = tokenize_sft({"messages": messages}, "messages", tokenizer, 512)
    assert _labelled_text(tokenizer, ex) == "Hello there!<|im_end|>\nBlue.<|im_end|>\n"
    assert len(ex["input_ids"]) == len(ex["labels"])


def test_conversational_prompt_completion_masks_prompt(tokenizer):
    row = {
        "prompt": [{"role": "user", "content": "Say hello."}],
        "completion": [{"role": "assistant", "content": "Hello there!"}],
    }
    ex = tokenize_sft(row, "prompt_completion", tokenizer, 512)
    assert _labelled_text(tokenizer, ex) == "Hello there!<|im_end|>\n"


def test_plain_prompt_completion_and_text(tokenizer):
    ex = tokenize_sft({"prompt": "Q: two plus two? A:", "completion": " Four."}, "prompt_completion", tokenizer, 512)
    assert _labelled_text(tokenizer, ex) == " Four.<|im_end|>"
    ex = tokenize_sft({"text": "Hello there!"}, "text", tokenizer, 512)
    assert all(lab != IGNORE for lab in ex["labels"])


def test_truncation(tokenizer):
    ex = tokenize_sft({"text": "Hello there! " * 50}, "text", tokenizer, 16)
    assert len(ex["input_ids"]) == 16


def test_pack_respects_capacity_and_keeps_every_example():
    lengths = [5, 9, 3, 7, 2, 8, 1, 10]
    bins = pack(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 5  # 45 tokens in bins of 10: first-fit-decreasing reaches the bound
    assert pack(lengths, 10) == bins  # deterministic


def test_micro_batches_group_bins():
    examples = [{"input_ids": [0] * n} for n in (4, 4, 4, 4, 4, 4)]
    groups = micro_batches(examples, batch_size=2, max_length=8, packing=True)
    assert [len(g) for g in groups] == [4, 2]  # 2 bins of 2 examples per micro-batch
    assert micro_batches(examples, 4, 8, packing=False) == [[0, 1, 2, 3], [4, 5]]


def test_collate_packed_resets_positions_and_masks_boundaries():
    batch = collate_packed(
        [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [IGNORE, 5]}]
    )
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[IGNORE, 2, 3, IGNORE, 5]]


def test_packed_forward_has_no_cross_contamination(tiny_model_dir):
    """Each sequence's logits inside a packed row equal its logits alone, and so does the loss."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    a = {"input_ids": [5, 17, 42, 8, 99, 23], "labels": [5, 17, 42, 8, 99, 23]}
    b = {"input_ids": [61, 7, 33, 12], "labels": [61, 7, 33, 12]}
    packed = collate_packed([a, b])
    with torch.no_grad():
        logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits[0]
        alone_a = model(input_ids=torch.tensor([a["input_ids"]]), use_cache=False).logits[0]
        alone_b = model(input_ids=torch.tensor([b["input_ids"]]), use_cache=False).logits[0]
        torch.testing.assert_close(logits[:6], alone_a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[6:], alone_b, atol=1e-5, rtol=1e-5)
        packed_loss = model(**packed, use_cache=False).loss
        sep = [model(input_ids=torch.tensor([x["input_ids"]]), labels=torch.tensor([x["labels"]])).loss for x in (a, b)]
    # token-weighted: a has 5 predicted tokens, b has 3
    torch.testing.assert_close(packed_loss, (sep[0] * 5 + sep[1] * 3) / 8, atol=1e-5, rtol=1e-5)
