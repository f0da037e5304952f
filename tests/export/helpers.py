"""A tiny model trained for a few steps: random tiny models have flat logits, so near-ties
would make greedy and quantized comparisons flaky; a fitted one has clear winners."""

from __future__ import annotations

import pytest

ROWS = [
    ("What is two plus two?", "Four."),
    ("Name a color.", "Blue."),
    ("Say hello.", "Hello there!"),
    ("Write a Python function add_one(x).", "def add_one(x):\n    return x + 1"),
    ("Is the sky green?", "No, the sky is blue."),
]


def train_briefly(model_dir: str, out_dir: str, steps: int = 40, lr: float = 3e-3) -> str:
    """Fit ``model_dir`` to ROWS for ``steps`` full-batch AdamW steps and save it to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batch = tokenizer([q + " " + a + tokenizer.eos_token for q, a in ROWS], return_tensors="pt", padding=True)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    for _ in range(steps):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def trained_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    return train_briefly(tiny_model_dir, str(tmp_path_factory.mktemp("models") / "trained"))


def prompt_ids(tokenizer, texts=tuple(q for q, _ in ROWS)) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in texts]


@pytest.fixture(scope="session")
def near_tie_model_dir(trained_model_dir, tmp_path_factory) -> str:
    """The trained model with its (tied) vocabulary matrix squeezed towards its mean row: every
    token's logit is a large common part plus a margin about 1e-3 of the trained one, finer than
    fp16's resolution at that magnitude, so FP16 picks other tokens while FP32 still agrees."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(trained_model_dir)
    with torch.no_grad():
        weight = model.get_output_embeddings().weight
        mean = weight.mean(0)
        weight.copy_(20 * mean + 1e-3 * (weight - mean))
    out = str(tmp_path_factory.mktemp("models") / "near_tie")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(trained_model_dir).save_pretrained(out)
    return out
