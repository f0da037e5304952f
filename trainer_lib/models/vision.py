"""Vision-language models (LLaVA-style): telling them apart, their processor, LoRA on the language model only,
the frozen vision tower, the processor files saved with the model, and a tiny random one for tests.

A model is vision-language when its config has a ``vision_config`` (LLaVA, Qwen2-VL, Idefics, ...). It loads
with transformers' ``AutoModelForImageTextToText`` and ``AutoProcessor`` (:mod:`trainer_lib.models.load`).
Training takes the processor's image side (its image processor and the number of image tokens an image
becomes); the text is rendered with the stage's tokenizer and chat template as for a text model
(:mod:`trainer_lib.data.vision_tokenize`).

What trains: the language model (all of it, or LoRA adapters on its linear layers) and, in full
fine-tuning, the projector between the towers; the vision tower stays frozen, as LLaVA's second stage
and LLaMA-Factory's ``freeze_vision_tower`` (its default) keep it.
"""

from __future__ import annotations

import json
import logging
import os
import re

from trainer_lib.errors import UserError

log = logging.getLogger(__name__)

#: the vision tower's module name in the architectures transformers builds (LLaVA and its kin; Qwen2-VL).
VISION_TOWERS = ("vision_tower", "visual")
#: the language model's module name (LLaVA, Qwen2-VL and most others in transformers 5).
LANGUAGE_MODEL = "language_model"
#: the files of a processor beside the tokenizer's (image processor, processor settings).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def is_vision_language(config) -> bool:
    """Whether a transformers config (or a model's) is a vision-language model's: a vision tower whose
    output fills image tokens of the text (a dual encoder such as CLIP has a vision tower and no such token)."""
    has_token = any(getattr(config, key, None) is not None for key in ("image_token_id", "image_token_index"))
    return getattr(config, "vision_config", None) is not None and has_token


def source_is_vision_language(source: str, revision: str | None = None, trust_remote_code: bool = False) -> bool:
    """Whether the model at ``source`` (a local directory or hub id) is vision-language, from its config alone."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):  # the loader that follows names what is wrong
        return False
    return is_vision_language(config)


def freeze_vision_tower(model) -> int:
    """Turn off the gradients of the vision tower's parameters; returns how many tensors it froze."""
    frozen = 0
    for name, param in model.named_parameters():
        if any(f".{tower}." in f".{name}" for tower in VISION_TOWERS):
            param.requires_grad_(False)
            frozen += 1
    return frozen


def language_model_targets(model, targets) -> str:
    """PEFT ``target_modules`` as one regular expression (PEFT matches it against whole module names) that
    picks the named linear layers (``all-linear``: every linear layer) inside the language model only, so
    neither the vision tower nor the projector nor the output head gets adapters."""
    import torch

    if targets == "all-linear":
        names = {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and f".{LANGUAGE_MODEL}." in f".{name}"
        }
    else:
        names = set(targets)
    inside = "|".join(re.escape(name) for name in sorted(names))
    return rf"(.*\.)?{LANGUAGE_MODEL}\..*\.({inside})"


def processor_for(local: str, tokenizer, revision: str | None = None, trust_remote_code: bool = False, name=None):
    """The processor of the model at ``local`` (a directory or hub id; ``name``: what the user called it) with the
    stage's ``tokenizer`` in it (the one whose chat template and padding the stage set), or None when the model
    is a text model. Stages call it through :func:`trainer_lib.models.load.load_processor`."""
    name = name or local
    if not source_is_vision_language(local, revision, trust_remote_code):
        return None
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(local, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"model.path: {name} is a vision-language model, but its processor did not load: {exc}"
        ) from None
    if not hasattr(processor, "image_processor") or not getattr(processor, "image_token", None):
        raise UserError(
            f"model.path: {name} is a vision-language model whose processor ({type(processor).__name__}) has no "
            "image processor or image token; posttrain trains LLaVA-style models, whose processor has both"
        )
    processor.tokenizer = tokenizer
    return processor


def image_token_id(processor) -> int:
    """The id of the token each image position holds (LLaVA's ``<image>``)."""
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None:
        token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return int(token_id)


def processor_files(processor) -> dict[str, str]:
    """``{file name: text}`` of the processor's own files (not the tokenizer's), to be saved with the model
    so that the saved directory loads back with ``AutoProcessor``; empty for a text model (None)."""
    import tempfile

    if processor is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        processor.save_pretrained(tmp)
        files = {}
        for name in PROCESSOR_FILES:
            if os.path.isfile(os.path.join(tmp, name)):
                with open(os.path.join(tmp, name), encoding="utf-8") as fh:
                    files[name] = fh.read()
        return files


def processor_fingerprint(processor) -> str:
    """What decides how the processor turns images into tokens and pixels: its image processor's settings and
    its own (patch size, image token, feature strategy); part of the tokenized-cache key."""
    import hashlib

    image_settings = processor.image_processor.to_dict()
    own = {
        key: str(getattr(processor, key, None)) for key in ("image_token", "patch_size", "num_additional_image_tokens")
    }
    own["vision_feature_select_strategy"] = str(getattr(processor, "vision_feature_select_strategy", None))
    text = json.dumps({"image_processor": image_settings, "processor": own}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- a tiny random one for tests


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
    from trainer_lib.demo.tiny_model import build_tiny_llama, train_tokenizer

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
