"""Tiny-model kit: a BPE tokenizer trained on a corpus and a small Llama built from config.

Tests and the embedded demo use these instead of downloading weights. The result is a normal
Hugging Face directory (``config.json``, ``model.safetensors``, tokenizer files and
``chat_template.jinja``), so every loading path in the product treats it like a real model.
"""

from __future__ import annotations

from collections.abc import Iterable

# ChatML-style template; the eos token closes every turn so generation stops after one answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, min_frequency: int = 2):
    """Byte-level BPE trained in-process, wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|im_end|>",
        bos_token=None, unk_token=None, additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.model_max_length = 4096
    return wrapped


def build_tiny_llama(tokenizer, num_layers: int = 2, hidden_size: int = 64, num_heads: int = 4,
                     num_kv_heads: int = 2, intermediate_size: int | None = None,
                     max_positions: int = 1024, seed: int = 0):
    """A randomly initialised Llama with the tokenizer's vocabulary and special ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size, max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True, rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def make_tiny_model(out_dir: str, texts: Iterable[str], vocab_size: int = 2048, num_layers: int = 2,
                    hidden_size: int = 64, num_heads: int = 4, num_kv_heads: int = 2,
                    max_positions: int = 1024, seed: int = 0) -> str:
    """Train a tokenizer on ``texts``, build a tiny Llama and save both to ``out_dir``."""
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_llama(tokenizer, num_layers=num_layers, hidden_size=hidden_size,
                             num_heads=num_heads, num_kv_heads=num_kv_heads,
                             max_positions=max_positions, seed=seed)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
