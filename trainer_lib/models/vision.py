"""Vision-language models (LLaVA-style): telling them apart, their processor, LoRA on the language model only,
the frozen vision tower, and the processor files saved with the model (a tiny random one for tests is
:func:`trainer_lib.demo.tiny_model.make_tiny_vlm`).

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
