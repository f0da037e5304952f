"""Load tokenizers and models from an HF hub id (at ``model.revision``), a local directory or a URL; add LoRA.

Hub downloads authenticate with ``$HF_TOKEN`` (gated and private repos), which transformers reads
from the environment itself: nothing here takes a token, so none can end up in a config or a log.
"""

from __future__ import annotations

import os

from trainer_lib import storage
from trainer_lib.config import LoraConfig, ModelConfig
from trainer_lib.errors import UserError
from trainer_lib.models import chat_templates

#: ``lora.target_modules=all-linear``: PEFT's name for every linear layer but the output head.
ALL_LINEAR = "all-linear"


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """A local directory for URLs and local paths; hub ids pass through unchanged."""
    if storage.is_remote(path):
        return storage.localize(path)
    expanded = os.path.expanduser(path)
    if os.path.exists(expanded):
        return expanded
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
        raise UserError(f"{key}: {path} does not exist")
    return path  # a hub id such as "org/name"


def hub_revision(cfg: ModelConfig, source: str) -> str | None:
    """``model.revision`` when ``source`` is ``model.path`` itself (another model, e.g. a reward
    model, is not pinned by it)."""
    return (cfg.revision or None) if source == cfg.path else None


def _failed(key: str, what: str, source: str, revision: str | None, exc: Exception) -> UserError:
    at = f" at revision {revision!r}" if revision else ""
    return UserError(storage.redact(f"{key}: could not load {what} from {source}{at}: {exc}"))


def load_tokenizer(cfg: ModelConfig, padding_side: str = "right"):
    from transformers import AutoTokenizer

    source = cfg.tokenizer_path or cfg.path
    key = "model.tokenizer_path" if cfg.tokenizer_path else "model.path"
    revision = hub_revision(cfg, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(source, key), revision=revision, trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise _failed(key, "a tokenizer", source, revision, exc) from None
    if cfg.chat_template:
        chat_templates.apply(tokenizer, cfg.chat_template, source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def torch_dtype(precision: str):
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


def load_causal_lm(cfg: ModelConfig, precision: str = "fp32", path: str | None = None):
    from transformers import AutoModelForCausalLM

    source = path or cfg.path
    revision = hub_revision(cfg, source)
    attention = cfg.attn_implementation
    # the same sdpa, but packed rows are attended per sequence (models/attention.py); not for remote modelling
    # code, whose attention may not take position_ids and would then need transformers' own packed mask
    if attention == "sdpa" and not cfg.trust_remote_code:
        from trainer_lib.models.attention import register

        attention = register()
    try:
        return AutoModelForCausalLM.from_pretrained(
            resolve_model_path(source),
            revision=revision,
            dtype=torch_dtype(precision),
            attn_implementation=attention,
            trust_remote_code=cfg.trust_remote_code,
        )
    except (OSError, ValueError) as exc:  # not a model directory, unknown hub id, missing weights or config
        raise _failed("model.path", "a causal LM", source, revision, exc) from None


def apply_lora(model, lora: LoraConfig, task_type: str = "CAUSAL_LM", modules_to_save: list[str] | None = None):
    """Wrap ``model`` with PEFT LoRA adapters; returns it unchanged when ``lora.r == 0``."""
    if lora.r <= 0:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets: str | list[str] = list(lora.target_modules)
    if targets == [ALL_LINEAR]:
        targets = ALL_LINEAR  # PEFT's shorthand: every nn.Linear except the output head
    else:
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [m for m in targets if m not in names]
        if missing:
            raise UserError(
                f"lora.target_modules: {missing} not found in the model (linear layers include "
                f"e.g. {sorted(n for n in names if n.endswith('proj'))[:8]}, or use all-linear)"
            )
    peft_cfg = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type=task_type,
        modules_to_save=modules_to_save,
    )
    return get_peft_model(model, peft_cfg)


def count_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts; the full sizes under ZeRO-3 too, where each rank holds
    only a partition (``ds_numel`` is the parameter's whole size)."""
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in model.parameters()]
    return sum(n for n, grad in sizes if grad), sum(n for n, _ in sizes)


def disable_dropout(model) -> None:
    """Dropout off for good: in RL it would make the update's log-probs disagree with the
    rollout's (TRL does the same)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
