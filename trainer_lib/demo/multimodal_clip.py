"""A tiny CLIP for the multimodal demo: built from a config, trained contrastively on (picture, true
description) pairs, saved as a normal Hugging Face directory (model, tokenizer, image processor) that
``reward.clip_path`` and :class:`trainer_lib.rewards.clip.ClipScorer` load.

Training is CLIP's own objective (Radford et al. 2021, eq. in Fig. 3): symmetric cross-entropy over
the logit-scaled cosine matrix of a batch. Each batch holds one picture of every (shape, colour)
class, so no two pairs in it share a description and the diagonal is the only right answer.
"""

from __future__ import annotations

import random

#: the towers: 2 layers of width 64, 32-pixel pictures cut into 8x8 patches, a 32-dim joint space.
TOWER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
PROJECTION_DIM = 32
MAX_TEXT = 32


def build_tiny_clip(texts: list[str], image_side: int, seed: int):
    """``(model, tokenizer, image_processor)``: a random CLIPModel with a BPE tokenizer trained on ``texts``
    (every text closed by the eos token CLIP pools at) and a CLIPImageProcessor for ``image_side`` pixels."""
    import torch
    from tokenizers.processors import TemplateProcessing
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from trainer_lib.demo.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(texts, vocab_size=320, min_frequency=1)
    eos = tokenizer.eos_token_id
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"$A {tokenizer.eos_token}", special_tokens=[(tokenizer.eos_token, eos)]
    )
    tokenizer.model_max_length = MAX_TEXT
    text = {**TOWER, "vocab_size": len(tokenizer), "max_position_embeddings": MAX_TEXT}
    text.update(eos_token_id=eos, bos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    vision = {**TOWER, "image_size": image_side, "patch_size": 8}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=PROJECTION_DIM)
    torch.manual_seed(seed)
    processor = CLIPImageProcessor(
        size={"shortest_edge": image_side}, crop_size={"height": image_side, "width": image_side}
    )
    return CLIPModel(config), tokenizer, processor


def train_tiny_clip(records: list[dict], out_dir: str, seed: int, steps: int = 300, lr: float = 2e-3) -> dict:
    """Train a tiny CLIP on ``records`` (``image`` path, ``text``) and save it to ``out_dir``; returns
    ``{"steps", "loss_first", "loss_last"}`` (the mean loss of the first and last 20 steps)."""
    import torch
    import torch.nn.functional as F
    from PIL import Image

    texts = sorted({r["text"] for r in records})
    with Image.open(records[0]["image"]) as first:
        side = first.size[0]
    model, tokenizer, processor = build_tiny_clip(texts, side, seed)
    pixels = processor(images=[Image.open(r["image"]).convert("RGB") for r in records], return_tensors="pt")
    pixels = pixels["pixel_values"]
    ids = tokenizer(texts, padding=True, return_tensors="pt")
    by_text: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        by_text.setdefault(record["text"], []).append(i)
    rng = random.Random(f"{seed}:clip")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    model.train()
    for _ in range(steps):
        picks = [rng.choice(by_text[t]) for t in texts]  # one picture per description: the diagonal is right
        out = model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], pixel_values=pixels[picks])
        logits = out.logits_per_image  # (picture, text): logit_scale * cosine
        labels = torch.arange(len(texts))
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return {"steps": steps, "loss_first": sum(losses[:20]) / 20, "loss_last": sum(losses[-20:]) / 20}
