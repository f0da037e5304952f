"""Reward models: a causal-LM backbone with a scalar head, in the format reward models are shared in.

The model is ``AutoModelForSequenceClassification`` with ``num_labels=1`` (for Llama:
``LlamaForSequenceClassification``, head ``score``), so the saved directory loads with
``AutoModelForSequenceClassification.from_pretrained(OUT)`` anywhere. The reward of a sequence is
the head's output at its last non-pad token; ``config.pad_token_id`` is set so that batched,
right-padded inputs pick that token. Reward statistics from a reference set are stored in
``config.json`` (``reward_mean``, ``reward_std``) and in ``reward_stats.json`` next to it, so
RL stages can normalize (and clip) rewards with :func:`normalize_rewards`.
"""

from __future__ import annotations

import json
import os

from trainer_lib.config import LoraConfig, ModelConfig
from trainer_lib.errors import UserError

STATS_FILE = "reward_stats.json"
#: The scalar head of ``*ForSequenceClassification`` models (trained in full under LoRA).
HEAD_MODULES = ["score"]


def load_reward_model(
    cfg: ModelConfig,
    pad_token_id: int,
    precision: str = "fp32",
    path: str | None = None,
    placement=None,
    key: str = "model.path",
):
    """A causal-LM checkpoint (new, randomly initialised head) or an existing reward model, its weights
    where ``placement`` says (:class:`trainer_lib.models.load.Placement`: partitioned under ZeRO-3); ``key``
    is the setting that named ``path`` (or ``model.path``), for errors."""
    from transformers import AutoModelForSequenceClassification

    from trainer_lib.models.load import (
        attention_implementation,
        hub_revision,
        load_pretrained,
        resolve_model_path,
        torch_dtype,
    )

    source = path or cfg.path
    revision = hub_revision(cfg, source)
    try:
        model = load_pretrained(
            AutoModelForSequenceClassification,
            resolve_model_path(source, key, revision),
            placement,
            revision=revision,
            num_labels=1,
            dtype=torch_dtype(precision),
            attn_implementation=attention_implementation(cfg),
            trust_remote_code=cfg.trust_remote_code,
        )
    except OSError as exc:  # not a model directory, unknown hub id, missing weights
        raise UserError(f"{key}: could not load a reward model from {source}: {exc}") from None
    model.config.pad_token_id = pad_token_id
    return model


def apply_reward_lora(model, lora: LoraConfig):
    """LoRA on the backbone, the scalar head trained in full (``modules_to_save``)."""
    from trainer_lib.models.load import apply_lora

    return apply_lora(model, lora, task_type="SEQ_CLS", modules_to_save=HEAD_MODULES)


def sequence_rewards(model, inputs: dict):
    """Rewards ``(N,)`` (float32): for padded rows (``input_ids``, ``attention_mask``) the head at each row's
    last non-pad token, as transformers pools; for one packed row (``input_ids``, ``position_ids`` and the
    boundaries of :func:`trainer_lib.data.preference_batches.model_inputs`) the head at each sequence's
    last token, the head applied to those N positions only."""
    if "cu_seq_lens_q" not in inputs:
        out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
        return out.logits.squeeze(-1).float()
    hidden = model(**inputs, use_cache=False, output_hidden_states=-1).hidden_states[-1]
    ends = inputs["cu_seq_lens_q"][1:].long() - 1
    return score_head(model)(hidden[0, ends]).squeeze(-1).float()


def token_rewards(model, input_ids, attention_mask):
    """The scalar head at every token, ``(B, T)`` float32 (a process reward model reads it at step ends):
    the backbone's last hidden states through the head."""
    hidden = model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_hidden_states=True
    ).hidden_states[-1]
    return score_head(model)(hidden).squeeze(-1).float()


def score_head(model):
    """The scalar head module of a reward model, through DeepSpeed's and PEFT's wrappers (under LoRA, the
    trained copy that ``modules_to_save`` keeps)."""
    model = getattr(model, "module", model)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(model, HEAD_MODULES[0])


def store_stats(model, stats: dict) -> None:
    """Record reward statistics in the model's ``config.json`` (saved with it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wrapper
    base.config.update({"reward_mean": stats["reward_mean"], "reward_std": stats["reward_std"]})


def load_stats(model_dir: str) -> dict | None:
    """``reward_stats.json`` of a saved reward model, else ``reward_mean``/``reward_std`` from its
    ``config.json``; None when it has neither."""
    for name in (STATS_FILE, "config.json"):
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if "reward_mean" in data and "reward_std" in data:
                return {"reward_mean": data["reward_mean"], "reward_std": data["reward_std"]}
    return None


def normalize_rewards(rewards, mean: float, std: float, clip: float | None = None, eps: float = 1e-6):
    """``(r - mean) / std``, optionally clipped to ``[-clip, clip]`` (e.g. ``clip=1``)."""
    normalized = (rewards - mean) / max(std, eps)
    return normalized.clamp(-clip, clip) if clip is not None else normalized
