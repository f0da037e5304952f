"""The multimodal reward model: ``posttrain reward`` on a CLIP dual encoder and image + text preference pairs.

Its pair scores equal CLIP's scaled cosine computed by hand from the towers and projections, and the
loss the Bradley-Terry loss of those scores; training separates the chosen from the rejected
descriptions; the saved directory scores rollouts through ``reward.clip_path``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from tests.rewards.test_clip_reward import clip_dir  # noqa: F401  (the tiny CLIP fixture)
from trainer_lib.cli import main

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 160, 30)}
SHAPES = ("a red square", "a blue circle", "two green triangles")


@pytest.fixture
def image_pairs(tmp_path) -> str:
    """Preference rows: the image's colour named in the chosen description, another colour in the rejected."""
    names = list(COLOURS)
    rows = []
    for name in names:
        Image.new("RGB", (32, 32), COLOURS[name]).save(tmp_path / f"{name}.png")
    for i in range(12):
        right, wrong = names[i % 3], names[(i + 1) % 3]
        rows.append(
            {
                "prompt": f"Describe product {i} in the picture.",
                "chosen": SHAPES[names.index(right)],
                "rejected": SHAPES[names.index(wrong)],
                "images": [f"{right}.png"],
            }
        )
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_pair_scores_are_clips_scaled_cosine_and_the_loss_bradley_terry(clip_dir, image_pairs):  # noqa: F811
    from transformers import CLIPModel

    from trainer_lib.data.normalize import Normalizer
    from trainer_lib.losses import pairwise_reward_loss
    from trainer_lib.models.dual_encoder import collate_pairs, encode_pairs, load_processor, pair_scores

    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor = load_processor(clip_dir)
    normalize = Normalizer()
    rows = [normalize(f"{image_pairs}:{i + 1}", json.loads(line)) for i, line in enumerate(open(image_pairs))][:3]
    batch = collate_pairs(encode_pairs(rows, processor, 64), processor, 64)
    with torch.no_grad():
        chosen, rejected = pair_scores(model, batch, "cpu")
        loss = pairwise_reward_loss(chosen, rejected)
        expected_chosen, expected_rejected = [], []
        for row in rows:  # by hand: pooled tower outputs through the projection matrices
            image = Image.open(row["images"][0]["path"]).convert("RGB")
            pixels = processor.image_processor(images=image, return_tensors="pt")["pixel_values"]
            v = model.vision_model(pixel_values=pixels).pooler_output[0] @ model.visual_projection.weight.T
            for text, out in ((row["chosen"], expected_chosen), (row["rejected"], expected_rejected)):
                ids = torch.tensor([processor.tokenizer(text)["input_ids"]])
                t = model.text_model(input_ids=ids).pooler_output[0] @ model.text_projection.weight.T
                out.append(float(model.logit_scale.exp() * (t @ v) / (t.norm() * v.norm())))
    assert chosen.tolist() == pytest.approx(expected_chosen, abs=1e-4)
    assert rejected.tolist() == pytest.approx(expected_rejected, abs=1e-4)
    by_hand = [math.log1p(math.exp(-(c - r))) for c, r in zip(expected_chosen, expected_rejected)]
    assert loss.tolist() == pytest.approx(by_hand, abs=1e-4)


@pytest.mark.parametrize("lora", [[], ["lora.r=4", "lora.target_modules=[q_proj,v_proj]"]], ids=["frozen", "lora"])
def test_reward_stage_trains_a_dual_encoder_that_scores_rollouts(clip_dir, image_pairs, tmp_path, lora):  # noqa: F811
    from transformers import CLIPModel

    from trainer_lib.data.normalize import Normalizer
    from trainer_lib.rewards.clip import ClipScorer

    out = tmp_path / "mm_rm"
    argv = ["reward", f"model.path={clip_dir}", f"data.path={image_pairs}", f"output_dir={out}", "max_steps=12"]
    argv += [
        "batch_size=4",
        "lr=5e-2",
        *lora,
        "logging_steps=1",
        "eval_steps=0",
        "save_steps=0",
        "data.eval_fraction=0",
    ]
    assert main([*argv, "report_to=[none]"]) == 0
    metrics = [json.loads(line) for line in open(out / "metrics.jsonl") if '"train"' in line]
    assert metrics[-1]["loss"] < metrics[0]["loss"] and metrics[-1]["accuracy"] == 1.0
    # only the projections and the scale trained; the towers are the base model's
    base, trained = CLIPModel.from_pretrained(clip_dir), CLIPModel.from_pretrained(out)
    assert torch.equal(
        base.text_model.embeddings.token_embedding.weight, trained.text_model.embeddings.token_embedding.weight
    )
    assert not torch.equal(base.text_projection.weight, trained.text_projection.weight)
    # the saved directory is a reward.clip_path: the chosen descriptions now score above the rejected
    scorer = ClipScorer(str(out))
    rows = [Normalizer()(f"{image_pairs}:{i + 1}", json.loads(line)) for i, line in enumerate(open(image_pairs))]
    images = [row["images"] for row in rows]
    chosen = scorer([row["prompt"] for row in rows], [row["chosen"] for row in rows], images=images)
    rejected = scorer([row["prompt"] for row in rows], [row["rejected"] for row in rows], images=images)
    assert all(c > r for c, r in zip(chosen, rejected))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_stats"]["count"] == 24
