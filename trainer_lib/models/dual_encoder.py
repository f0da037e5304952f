"""A multimodal reward model: a CLIP-like dual encoder trained on image + text preference pairs.

``posttrain reward`` with a ``model.path`` that transformers loads as a dual encoder (``CLIPModel`` and
models shaped like it: a text tower, an image tower, a projection of each into one space and a learnt
``logit_scale``) trains it with the Bradley-Terry loss on rows whose ``images`` column holds the prompt's
image(s) (:mod:`trainer_lib.data.images`). A completion ``c`` of a row with images ``x_1..x_k`` scores

    s(c) = exp(logit_scale) * mean_j cos(P_t f_t(c), P_v f_v(x_j))

(CLIP's own similarity logit, Radford et al. 2021, eq. in Fig. 3; averaged over the row's images), and a
pair's loss is ``-log sigma(s(chosen) - s(rejected))`` (Bradley-Terry, as for the text reward model).
The towers stay frozen and the two projections and the scale train (``lora.r=0``, the default), or LoRA
adapters on the towers' attention train with them (``lora.r > 0``; ``lora.target_modules`` name CLIP's
``q_proj``/``v_proj`` by default). The result is saved as the dual encoder itself, with its tokenizer and
image processor, so ``reward.clip_path=<output_dir>`` scores PPO/GRPO rollouts with it
(:mod:`trainer_lib.rewards.clip`) and evaluation loads it the same way.

Texts are the completions alone (what a CLIP text tower reads: short descriptions, truncated at its
position limit); a micro-batch holds ``batch_size`` pairs: ``2 x batch_size`` texts and every image of
their rows, in one forward.
"""

from __future__ import annotations

import json
import os

from trainer_lib.errors import UserError

#: the projections and the scale, trained in full (LoRA or not); the towers are frozen without LoRA.
HEAD_PARAMETERS = ("text_projection", "visual_projection", "logit_scale")


def is_dual_encoder(model_path: str | None) -> bool:
    """Whether ``model_path`` (a local directory) holds a dual encoder: a config with a text and a vision
    config whose model has no language-model head (CLIP, SigLIP...). Remote paths are read after download."""
    path = os.path.join(model_path or "", "config.json")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
    architectures = config.get("architectures") or []
    return bool(config.get("text_config") and config.get("vision_config")) and any(
        name.endswith("Model") and "ForConditionalGeneration" not in name for name in architectures
    )


def load_processor(path: str, trust_remote_code: bool = False):
    """The tokenizer and image processor of a dual encoder, as one processor (saved with the model)."""
    from transformers import AutoImageProcessor, AutoTokenizer, ProcessorMixin

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        images = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"model.path: {path}: a dual encoder needs its tokenizer and image processor: {exc}") from None
    return DualProcessor(tokenizer, images) if not isinstance(tokenizer, ProcessorMixin) else tokenizer


class DualProcessor:
    """A dual encoder's tokenizer and image processor together; ``save_pretrained`` writes both."""

    def __init__(self, tokenizer, image_processor):
        self.tokenizer, self.image_processor = tokenizer, image_processor
        self.pad_token_id = tokenizer.pad_token_id

    def save_pretrained(self, out_dir: str) -> None:
        self.tokenizer.save_pretrained(out_dir)
        self.image_processor.save_pretrained(out_dir)


def load_for_training(cfg, placement=None):
    """The dual encoder of ``cfg.model``, fp32 or bf16 (``cfg.engine.precision``), towers frozen and
    projections trained, or LoRA on the towers (``cfg.lora``)."""
    from transformers import AutoModel

    from trainer_lib.models.load import apply_lora, resolve_model_path, torch_dtype

    local = resolve_model_path(cfg.model.path, "model.path")
    model = AutoModel.from_pretrained(
        local, dtype=torch_dtype(cfg.engine.precision), trust_remote_code=cfg.model.trust_remote_code
    )
    if not (hasattr(model, "get_text_features") and hasattr(model, "get_image_features")):
        raise UserError(f"model.path: {cfg.model.path} is a {type(model).__name__}, not a dual encoder")
    if placement is not None and placement.device:
        model.to(placement.device)
    for name, param in model.named_parameters():
        param.requires_grad_(name.split(".")[0] in HEAD_PARAMETERS)
    if cfg.lora.r > 0:
        model = apply_lora(model, cfg.lora, task_type=None, modules_to_save=list(HEAD_PARAMETERS[:2]))
        base = model.get_base_model()
        base.logit_scale.requires_grad_(True)
    return model


def similarity(model, batch: dict):
    """``(T,)`` float32 scores: each text's scaled cosine with the mean of its images' cosines (module doc).
    ``batch``: ``input_ids``/``attention_mask`` of T texts, ``pixel_values`` of M images and ``owner``
    ``(M,)``, the text row (pair) each image belongs to, ``text_row`` ``(T,)``, the pair of each text."""
    import torch
    import torch.nn.functional as F

    from trainer_lib.models.load import base_model

    base = getattr(model, "module", model)  # a DeepSpeed engine
    base = base_model(base)
    text_features = base.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    texts = F.normalize(embeddings_of(text_features).float(), dim=-1)
    images = F.normalize(embeddings_of(base.get_image_features(pixel_values=batch["pixel_values"])).float(), dim=-1)
    rows = int(batch["owner"].max()) + 1
    # every text against every image of its own row, averaged: (T, M) masked to the row's images
    same_row = (batch["text_row"][:, None] == batch["owner"][None, :]).float()
    counts = torch.bincount(batch["owner"], minlength=rows).float()[batch["text_row"]]
    cosines = ((texts @ images.T) * same_row).sum(dim=-1) / counts
    return base.logit_scale.float().exp() * cosines


def pair_scores(model, batch: dict, device):
    """(chosen scores, rejected scores), each ``(B,)``: the batch's first B texts are the chosen, the next B
    the rejected completions of the same B rows."""
    moved = {key: value.to(device) for key, value in batch.items() if key != "pairs"}
    scores = similarity(model, moved)
    half = scores.shape[0] // 2
    return scores[:half], scores[half:]


def encode_pairs(rows, processor, max_length: int) -> list[dict]:
    """Normalized preference rows (with ``images``) -> ``{"chosen", "rejected", "images"}`` texts and
    image references; a row without images is a FILE:ROW-style error from the data layer's location."""
    from trainer_lib.data.formats import generated_text

    out = []
    for index, row in enumerate(rows):
        if not row.get("images"):
            raise UserError(
                f"data.path: row {index + 1} has no images; a dual-encoder reward model scores completions "
                "against their prompt's images (an 'images' column, docs/multimodal.md)"
            )
        out.append(
            {
                "chosen": generated_text(row["chosen"]),
                "rejected": generated_text(row["rejected"]),
                "images": row["images"],
            }
        )
    return out


def collate_pairs(examples: list[dict], processor, max_length: int) -> dict:
    """B encoded pairs -> one micro-batch: 2B texts (chosen, then rejected) padded, every image's pixels,
    and which row each text and image belongs to."""
    import torch

    from trainer_lib.data.images import load_image

    texts = [ex["chosen"] for ex in examples] + [ex["rejected"] for ex in examples]
    tokens = processor.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    refs = [(row, ref) for row, ex in enumerate(examples) for ref in ex["images"]]
    pixels = processor.image_processor(images=[load_image(ref) for _, ref in refs], return_tensors="pt")
    rows = torch.arange(len(examples))
    return {
        "input_ids": tokens["input_ids"],
        "attention_mask": tokens["attention_mask"],
        "pixel_values": pixels["pixel_values"],
        "owner": torch.tensor([row for row, _ in refs]),
        "text_row": torch.cat([rows, rows]),
    }


def text_limit(model_path: str, tokenizer) -> int:
    """The text tower's position limit (CLIP: 77), or the tokenizer's."""
    path = os.path.join(model_path, "config.json")
    with open(path, encoding="utf-8") as fh:
        positions = (json.load(fh).get("text_config") or {}).get("max_position_embeddings")
    return min(int(positions or tokenizer.model_max_length), int(tokenizer.model_max_length))


def embeddings_of(output):
    """Projected embeddings from ``get_*_features``: a tensor (transformers 4) or an output whose
    ``pooler_output`` holds them (transformers 5)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    for name in ("pooler_output", "text_embeds", "image_embeds"):
        value = getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"no embeddings in {type(output).__name__}")
