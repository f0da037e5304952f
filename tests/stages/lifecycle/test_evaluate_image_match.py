"""posttrain evaluate with image_match: each model's greedy completions to held-out prompts with images,
judged by a held-out CLIP (retrieval among distractors and the mean CLIP score), in metrics.json, the
per-problem rows, the report and the gate."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tests.rewards.test_clip_reward import clip_dir  # noqa: F401  (the tiny CLIP fixture)
from trainer_lib.cli import main

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 160, 30), "yellow": (230, 220, 40)}


@pytest.fixture
def image_prompts(tmp_path) -> str:
    """Eight held-out prompts, two per colour (the label: the true description), each with its picture."""
    rows = []
    for i, (name, colour) in enumerate([*COLOURS.items(), *COLOURS.items()]):
        Image.new("RGB", (32, 32), colour).save(tmp_path / f"{name}{i}.png")
        rows.append({"prompt": f"Describe product {i}.", "images": [f"{name}{i}.png"], "label": f"a {name} thing"})
    path = tmp_path / "image_prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_evaluate_scores_image_text_match_and_gates_on_it(tiny_model_dir, clip_dir, image_prompts, tmp_path):  # noqa: F811
    from trainer_lib.eval.image_text_match import cosine_table, match_metrics
    from trainer_lib.rewards.clip import ClipScorer

    out = tmp_path / "eval"
    argv = ["evaluate", f"models=base={tiny_model_dir}", f"output_dir={out}", "humaneval.enabled=false"]
    argv += [f"image_match.path={image_prompts}", f"image_match.scorer_path={clip_dir}", "image_match.distractors=3"]
    argv += ["image_match.max_new_tokens=6", "gate.rules=[image_text_match_accuracy>=0.0]"]
    assert main(argv) == 0
    result = json.loads((out / "metrics.json").read_text())
    metrics = result["models"]["base"]
    assert 0.0 <= metrics["image_text_match_accuracy"] <= 1.0 and 0.0 <= metrics["clip_score_mean"] <= 1.0
    assert result["data"]["image_match"] == {"count": 8} and result["gate"]["passed"]
    rows = [json.loads(line) for line in open(out / "per_problem" / "base_image_match.jsonl")]
    assert len(rows) == 8 and {r["label"] for r in rows} == {f"a {name} thing" for name in COLOURS}
    # the same numbers from the completions it wrote, scored again here (the line-ups from the same seed)
    from trainer_lib.data.normalize import Normalizer
    from trainer_lib.eval.image_text_match import choose_distractors

    refs = [
        Normalizer()(f"{image_prompts}:{i + 1}", json.loads(line))["images"][0]
        for i, line in enumerate(open(image_prompts))
    ]
    table = cosine_table(ClipScorer(clip_dir), [r["completion"] for r in rows], refs).tolist()
    again = match_metrics(table, choose_distractors([r["label"] for r in rows], 3, 0))
    assert metrics["image_text_match_accuracy"] == pytest.approx(again["image_text_match_accuracy"])
    assert metrics["clip_score_mean"] == pytest.approx(again["clip_score_mean"], abs=1e-6)
    assert "Image prompts" in (out / "report.html").read_text()


def test_image_match_needs_a_scorer(tiny_model_dir, image_prompts, tmp_path, capsys):
    argv = ["evaluate", f"models=base={tiny_model_dir}", f"output_dir={tmp_path}", f"image_match.path={image_prompts}"]
    assert main(argv) == 2
    assert "image_match.scorer_path: required" in capsys.readouterr().err
