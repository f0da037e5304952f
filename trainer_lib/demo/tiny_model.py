"""The tiny-model kit, and ``posttrain tiny-model``: a BPE tokenizer trained on a corpus and a small
random Llama built from config; a tiny random LLaVA for the vision-language tests and demo.

Tests and the embedded demo use these instead of downloading weights. The result is a normal
Hugging Face directory (``config.json``, ``model.safetensors``, tokenizer files and
``chat_template.jinja``), so every loading path in the product treats it like a real model.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, UserError

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
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.model_max_length = 4096
    return wrapped


def build_tiny_llama(
    tokenizer,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 1024,
    seed: int = 0,
    embedding_rows: int = 0,
):
    """A randomly initialised Llama with the tokenizer's vocabulary and special ids; ``embedding_rows``
    pads the embedding and LM head past the tokenizer's ids, as real vocabularies are padded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=max(len(tokenizer), embedding_rows),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def make_tiny_model(out_dir: str, texts: Iterable[str], vocab_size: int = 2048, **shape) -> str:
    """Train a tokenizer of ``vocab_size`` on ``texts``, build a tiny Llama of ``shape`` (the keywords of
    :func:`build_tiny_llama`: num_layers, hidden_size, num_heads, num_kv_heads, max_positions, seed) and
    save both to ``out_dir``."""
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_llama(tokenizer, **shape)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


#: The keys of ``posttrain tiny-model`` that :func:`make_tiny_model` takes.
MODEL_KEYS = ("vocab_size", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "max_positions", "seed")


@dataclass
class TinyModelConfig:
    corpus: str | None = opt(None, "Text corpus, local or a URL: .txt (a document per line) or JSONL (every string).")
    output_dir: str | None = opt(None, "Where the Hugging Face model directory goes (local or URL).")
    vocab_size: int = opt(1024, "BPE vocabulary size.")
    num_layers: int = opt(2, "Transformer layers.")
    hidden_size: int = opt(128, "Hidden size.")
    num_heads: int = opt(4, "Attention heads.")
    num_kv_heads: int = opt(2, "Key/value heads (grouped-query attention).")
    max_positions: int = opt(1024, "Maximum sequence length.")
    seed: int = opt(0, "Initialisation seed.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        for key in ("corpus", "output_dir"):
            if not getattr(self, key):
                raise ConfigError(f"{key}: required")
        for key in MODEL_KEYS[:-1]:  # every size; the seed may be anything
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key}: expected a positive integer, got {getattr(self, key)}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError("num_heads: must divide hidden_size, and num_kv_heads must divide num_heads")


CONFIG = TinyModelConfig


def read_corpus(path: str) -> list[str]:
    local = storage.localize(path)
    if not os.path.isfile(local):
        raise UserError(f"corpus: {path} is not a file")
    with open(local, encoding="utf-8") as fh:
        if not local.endswith((".jsonl", ".json")):
            return [line.rstrip("\n") for line in fh if line.strip()]
        texts = []
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                texts.extend(_strings(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{n}: invalid JSON ({exc.msg})") from None
        return texts


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def run(cfg: TinyModelConfig) -> dict:
    texts = read_corpus(cfg.corpus)
    if not texts:
        raise UserError(f"corpus: {cfg.corpus} contains no text")
    remote = storage.is_remote(cfg.output_dir)
    parent = tempfile.mkdtemp() if remote else os.path.dirname(os.path.abspath(cfg.output_dir))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(dir=parent, prefix=".tiny-")  # renamed into place when complete
    make_tiny_model(work, texts, **{key: getattr(cfg, key) for key in MODEL_KEYS})
    if remote:
        storage.upload_dir(work, cfg.output_dir)
    else:
        target = os.path.abspath(cfg.output_dir)
        if os.path.isdir(target) and not os.listdir(target):
            os.rmdir(target)
        os.replace(work, target)
    return {
        "stage": "tiny-model",
        "output_dir": cfg.output_dir,
        "corpus_texts": len(texts),
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
    }


def make_tiny_vlm(out_dir: str, texts, vocab_size: int = 300, image_size: int = 28, patch_size: int = 14, seed=0):
    """A tiny random LLaVA (a 1-layer CLIP vision tower, a 2-layer Llama) with a BPE tokenizer trained on
    ``texts`` plus the ``<image>`` token, and its processor (an image becomes ``(image_size / patch_size)^2``
    tokens), saved to ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from trainer_lib.data.images import PLACEHOLDER

    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": [PLACEHOLDER]}, replace_extra_special_tokens=False)
    text_model = build_tiny_llama(tokenizer, num_layers=2, hidden_size=64, seed=seed)
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch_size,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text_model.config,
        image_token_id=tokenizer.convert_tokens_to_ids(PLACEHOLDER),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    image_processor = CLIPImageProcessorPil(  # (the Pillow one: no torchvision needed)
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token, which the "default" strategy drops again
        chat_template=tokenizer.chat_template,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    return out_dir
