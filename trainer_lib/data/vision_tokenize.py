"""Rows with images, tokenized for a vision-language model (LLaVA-style), and their pixels collated.

A row is rendered as for a text model (:mod:`trainer_lib.data.tokenize`: the chat template, the assistant
spans that carry the loss), with each ``<image>`` placeholder as one image token; the processor then expands
every image token into as many as the image becomes (LLaVA: one per patch) and the two token lists are
walked side by side, so the labels come from the text rendering and **every image position is -100**.

* Placement: a row with images and no ``<image>`` gets them at the start of its first user turn (of its
  prompt, or its text), as TRL places the images of such rows.
* Truncation: a row is cut at ``data.max_length`` only after its last image token; a row whose cut would
  fall inside or before an image is dropped (the model must see every image token an image makes).
* Pixels are not stored: the tokenized row keeps the row's image references (JSON in an ``images``
  column), and the collate loads them (:func:`trainer_lib.data.images.load_image`, which checks each
  file's sha256) and runs the image processor for each micro-batch (:func:`with_images`).
* Packing keeps each sequence's pixels with it: a packed row's images are concatenated in the order of its
  sequences, which is the order of its image tokens, and the model fills image positions in that order.
"""

from __future__ import annotations

import base64
import json

from trainer_lib.data.images import IMAGES, PLACEHOLDER, load_image
from trainer_lib.data.tokenize import IGNORE, is_trainable, span_labels, text_and_spans
from trainer_lib.errors import UserError

#: flash-attention kwargs a packed text batch carries; a VLM hands its kwargs to the vision tower too,
#: where they would describe the text row's sequences, so image batches go without (the text layers then
#: find the boundaries in ``position_ids``, models/attention.py).
BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def place_images(row: dict, fmt: str) -> dict:
    """``row`` with ``<image>`` markers at the start of its first user turn (or text) when it has images
    and no marker at all; unchanged otherwise."""
    refs = row.get(IMAGES) or []
    if not refs or PLACEHOLDER in json.dumps({k: row.get(k) for k in ("text", "messages", "prompt", "completion")}):
        return row
    marks = PLACEHOLDER * len(refs)
    row = dict(row)
    if fmt == "messages" or (fmt == "prompt_completion" and isinstance(row["prompt"], list)):
        key = "messages" if fmt == "messages" else "prompt"
        turns = [dict(m) for m in row[key]]
        first = next((i for i, m in enumerate(turns) if m.get("role") == "user"), 0)
        turns[first]["content"] = marks + (turns[first].get("content") or "")
        row[key] = turns
    else:
        key = "text" if fmt == "text" else "prompt"
        row[key] = marks + row[key]
    return row


def expand_images(ids: list[int], labels: list[int], full: list[int], image_id: int) -> tuple[list, list]:
    """The text tokens ``ids`` (one ``image_id`` per image) and their ``labels`` walked against ``full``, the
    processor's tokens of the same text with every image expanded: image runs get -100, every other token
    must agree."""
    out_ids, out_labels, j = [], [], 0
    for token, label in zip(ids, labels):
        if token == image_id:
            while j < len(full) and full[j] == image_id:
                out_ids.append(image_id)
                out_labels.append(IGNORE)
                j += 1
            continue
        if j >= len(full) or full[j] != token:
            raise UserError("model.path: the processor tokenizes the text differently from the model's tokenizer")
        out_ids.append(token)
        out_labels.append(label)
        j += 1
    if j != len(full):
        raise UserError("model.path: the processor made more tokens than the text and its images account for")
    return out_ids, out_labels


def refuse_stray_image_tokens(ids: list[int], image_id: int, text: str) -> None:
    """A row without images must not hold an image token (the model would look for pixels it has not got)."""
    if image_id in ids:
        raise UserError(
            f"data: a row without images has {PLACEHOLDER} in its text ({text[:80]!r}); a vision-language model "
            "reads it as an image: give the row its image or take the marker out"
        )


def encode_refs(refs: list[dict]) -> str:
    """A row's image references as JSON (embedded bytes as base64), for the tokenized split."""
    return json.dumps(
        [
            {**ref, "bytes": None if ref.get("bytes") is None else base64.b64encode(ref["bytes"]).decode()}
            for ref in refs
        ]
    )


def decode_refs(text: str | None) -> list[dict]:
    """The references :func:`encode_refs` wrote."""
    refs = json.loads(text) if text else []
    return [{**ref, "bytes": None if ref.get("bytes") is None else base64.b64decode(ref["bytes"])} for ref in refs]


def tokenize_image_row(row: dict, fmt: str, processor, max_length: int) -> dict | None:
    """``{"input_ids", "labels", "images"}`` for one normalized row (see the module doc); None when the row
    would have to be cut inside an image."""

    tokenizer, image_id = processor.tokenizer, image_token_id(processor)
    refs = row.get(IMAGES) or []
    row = place_images(row, fmt)
    text, spans = text_and_spans(row, fmt, tokenizer)
    text = text.replace(PLACEHOLDER, processor.image_token)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [
        IGNORE if token == image_id else label
        for token, label in zip(ids, span_labels(ids, enc["offset_mapping"], spans))
    ]
    if refs:
        images = [load_image(ref) for ref in refs]
        full = processor(text=[text], images=[images], add_special_tokens=False)["input_ids"][0]
        ids, labels = expand_images(ids, labels, list(full), image_id)
    else:
        refuse_stray_image_tokens(ids, image_id, text)
    if len(ids) > max_length:
        if image_id in ids[max_length:]:
            return None
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "labels": labels, "images": encode_refs(refs)}


def tokenize_image_sft_batch(batch: dict, fmt: str, tokenizer, max_length: int) -> dict:
    """``datasets.map(batched=True)`` form for SFT (``tokenizer`` is the processor): columns ``input_ids``,
    ``labels``, ``length``, ``images``; rows with nothing to learn, or cut inside an image, are dropped."""
    names = list(batch)
    rows = [dict(zip(names, values)) for values in zip(*batch.values())]
    examples = [tokenize_image_row(row, fmt, tokenizer, max_length) for row in rows]
    examples = [ex for ex in examples if ex is not None and is_trainable(ex)]
    return {
        "input_ids": [ex["input_ids"] for ex in examples],
        "labels": [ex["labels"] for ex in examples],
        "length": [len(ex["input_ids"]) for ex in examples],
        IMAGES: [ex["images"] for ex in examples],
    }


# --------------------------------------------------------------------------- collate


def pixel_inputs(processor, refs: list[dict], device) -> dict:
    """The image processor's tensors (``pixel_values``, and any size or grid tensors it makes) for ``refs``,
    loaded now, on ``device``; empty for no images."""
    if not refs:
        return {}
    import torch

    out = processor.image_processor([load_image(ref) for ref in refs], return_tensors="pt")
    return {key: value.to(device) for key, value in out.items() if isinstance(value, torch.Tensor)}


def with_images(collate, processor, device):
    """``collate`` (token ids, labels, masks) plus the pixels of the micro-batch's images, in example order."""

    def collate_with_images(examples: list[dict]) -> dict:
        batch = {key: value for key, value in collate(examples).items() if key not in BOUNDARY_KWARGS}
        refs = [ref for ex in examples for ref in decode_refs(ex.get(IMAGES))]
        return {**batch, **pixel_inputs(processor, refs, device)}

    return collate_with_images


# --------------------------------------------------------------------------- preference pairs (DPO)


def tokenize_image_pair(row: dict, processor, max_length: int) -> dict | None:
    """``{"prompt_ids", "chosen_ids", "rejected_ids"[, "margin"], "images"}`` for a normalized preference row
    whose images belong to its prompt (chosen and rejected share them): the prompt's image tokens expanded
    by the processor, the completions as :mod:`trainer_lib.data.preference_batches` encodes them. The prompt
    is kept whole (its images must stay); the completions are cut to fit, and a row whose prompt leaves no
    room for them is dropped (None)."""
    from trainer_lib.data.preference_batches import encode_completion

    tokenizer, refs = processor.tokenizer, row.get(IMAGES) or []
    if PLACEHOLDER in json.dumps([row["chosen"], row["rejected"]]):
        raise UserError(f"data: a completion holds {PLACEHOLDER}; the images of a preference row belong to its prompt")
    prompt, tools = place_images(row, "prompt_completion")["prompt"], row.get("tools")
    prompt_ids = encode_image_prompt(processor, prompt, refs, tools)
    room = max_length - len(prompt_ids)
    if room < 1:
        return None
    out = {
        "prompt_ids": prompt_ids,
        "chosen_ids": encode_completion(tokenizer, prompt, row["chosen"], tools)[:room],
        "rejected_ids": encode_completion(tokenizer, prompt, row["rejected"], tools)[:room],
        "images": encode_refs(refs),
    }
    if row.get("margin") is not None:
        out["margin"] = float(row["margin"])
    return out


def encode_image_prompt(processor, prompt, refs: list[dict], tools=None) -> list[int]:
    """Prompt token ids as :func:`trainer_lib.data.preference_batches.encode_prompt` makes them, with each image's
    tokens expanded by the processor (``prompt``'s ``<image>`` markers already placed, :func:`place_images`)."""
    from trainer_lib.data.preference_batches import encode_prompt
    from trainer_lib.data.tokenize import render_prompt

    if not refs:
        ids = encode_prompt(processor.tokenizer, prompt, tools)
        refuse_stray_image_tokens(ids, image_token_id(processor), json.dumps(prompt))
        return ids
    text = render_prompt(processor.tokenizer, prompt, tools).replace(PLACEHOLDER, processor.image_token)
    special = not isinstance(prompt, list)  # as encode_prompt: chat templates add their own special tokens
    images = [load_image(ref) for ref in refs]
    return list(processor(text=[text], images=[images], add_special_tokens=special)["input_ids"][0])


def image_prompts(rows: list[dict], processor) -> tuple[list[list[int]], list]:
    """For RL prompt rows: ``(prompt token ids, pixel_values per row)``, the pixels a ``(images, 3, H, W)``
    tensor on the host, or None for a row without images."""
    ids, pixels = [], []
    for row in rows:
        refs = row.get(IMAGES) or []
        prompt = place_images(row, "prompt_completion")["prompt"]
        ids.append(encode_image_prompt(processor, prompt, refs, row.get("tools")))
        pixels.append(pixel_inputs(processor, refs, "cpu")["pixel_values"] if refs else None)
    return ids, pixels


def tokenize_image_pairs_batch(batch: dict, tokenizer, max_length: int) -> dict:
    """``datasets.map(batched=True)`` form of :func:`tokenize_image_pair` (``tokenizer`` is the processor)."""
    names = list(batch)
    rows = [dict(zip(names, values)) for values in zip(*batch.values())]
    examples = [ex for ex in (tokenize_image_pair(row, tokenizer, max_length) for row in rows) if ex is not None]
    keys = ("prompt_ids", "chosen_ids", "rejected_ids", IMAGES)
    out = {key: [ex[key] for ex in examples] for key in keys}
    if "margin" in batch:
        out["margin"] = [ex.get("margin") for ex in examples]
    return out


def with_pair_images(collate, processor):
    """A preference collate (``2B`` rows: chosen, then rejected) plus the pixels of each row's prompt images:
    every example's images twice, in row order, on the host as the rest of the batch."""

    def collate_with_images(examples: list[dict]) -> dict:
        refs = [ref for ex in examples for ref in decode_refs(ex.get(IMAGES))]
        return {**collate(examples), **pixel_inputs(processor, refs + refs, "cpu")}

    return collate_with_images


def image_token_id(processor) -> int:
    """The id of the token each image position holds (LLaVA's ``<image>``)."""
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None:
        token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return int(token_id)


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
