"""The multimodal demo: its pictures are deterministic and show what their attributes say, the teacher's
mistakes are the documented ones, and the runner goes end to end (pictures, two CLIPs, tiny-model, SFT,
GRPO with the CLIP reward, the image-text match of both models) on a shrunk setting."""

import hashlib
import json
import random

import pytest

from trainer_lib.demo.multimodal_images import COLOURS, SHAPES, Product, draw, make_products, make_splits

BACKGROUND = (235, 235, 230)


def _filled(image, product: Product, x: int, y: int) -> bool:
    """Is pixel (x, y) painted with the product's tint (nearer to it than to the background)?"""
    pixel = image.getpixel((x, y))
    to_tint = sum((a - b) ** 2 for a, b in zip(pixel, product.tint))
    return to_tint < sum((a - b) ** 2 for a, b in zip(pixel, BACKGROUND))


def shape_from_pixels(image, product: Product) -> str:
    """Read the shape back from three probes around the centre: a square fills its top-left corner, a
    triangle its bottom-left corner but not its top-left, a circle neither (both lie outside radius r)."""
    (x, y), r = product.centre, product.radius
    side = round(r * 0.85)
    if _filled(image, product, x - side, y - side):
        return "square"
    return "triangle" if _filled(image, product, x - r + 2, y + r - 1) else "circle"


def colour_from_pixels(image, product: Product) -> str:
    """The palette colour nearest the mean of the painted pixels."""
    painted = [
        image.getpixel((x, y)) for x in range(image.width) for y in range(image.height) if _filled(image, product, x, y)
    ]
    mean = [sum(p[c] for p in painted) / len(painted) for c in range(3)]
    return min(COLOURS, key=lambda name: sum((a - b) ** 2 for a, b in zip(mean, COLOURS[name])))


def test_pictures_are_deterministic_and_show_their_attributes(tmp_path):
    products = make_products(48, seed=3, salt="policy")
    assert products == make_products(48, seed=3, salt="policy") != make_products(48, seed=4, salt="policy")
    assert {(p.shape, p.colour) for p in products} == {(s, c) for s in SHAPES for c in COLOURS}  # the whole grid
    for product in products:
        image = draw(product)
        assert image.size == (32, 32) and image.tobytes() == draw(product).tobytes()
        assert shape_from_pixels(image, product) == product.shape, product
        assert colour_from_pixels(image, product) == product.colour, product
        assert product.description == f"a {product.colour} {product.shape}"


def test_splits_never_share_a_picture(tmp_path):
    sizes = {"reward_clip": 12, "scorer_clip": 12, "policy": 12, "heldout": 12}
    splits = make_splits(str(tmp_path), seed=0, sizes=sizes)
    digests = {}
    for name, records in splits.items():
        assert len(records) == 12
        for record in records:
            with open(record["image"], "rb") as fh:
                digests.setdefault(hashlib.sha256(fh.read()).hexdigest(), []).append(name)
    assert len(digests) == 48  # 48 distinct files: no picture in two splits (or twice in one)
    rows = [json.loads(line) for line in open(tmp_path / "heldout" / "products.jsonl")]
    assert rows == splits["heldout"]


def test_the_teacher_makes_only_its_documented_mistakes():
    from trainer_lib.demo.multimodal import CONFUSIONS, teacher_caption

    rng = random.Random(0)
    for colour in COLOURS:
        record = {"colour": colour, "shape": "circle"}
        written = [teacher_caption(record, 0.7, rng) for _ in range(400)]
        wrong = [w for w in written if w != f"a {colour} circle"]
        if colour in CONFUSIONS:
            assert set(wrong) == {f"a {CONFUSIONS[colour]} circle"}
            assert 0.6 < len(wrong) / 400 < 0.8
        else:
            assert not wrong


def test_the_runner_refuses_bad_arguments_before_touching_anything(tmp_path, capsys):
    from trainer_lib.demo.multimodal import arguments

    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "todo.txt").write_text("mine")
    for argv, message in (
        (["--out", str(keep)], "holds something other than an earlier demo run"),
        (["--sizes", "24,24"], "--sizes: expected four counts of at least 12"),
        (["--mistakes", "1.5"], "--mistakes: expected a share between 0 and 1"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            arguments(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert (keep / "todo.txt").read_text() == "mine"


def _run_demo(tmp_path, *settings):
    from trainer_lib.demo.multimodal import main

    out = tmp_path / "demo"
    code = main(["--seed", "0", "--out", str(out), *settings])
    return code, json.load(open(out / "metrics.json"))


def test_the_runner_end_to_end_on_a_shrunk_setting(tmp_path):
    """Every step runs and metrics.json has the evaluate stage's layout; too few steps to claim anything."""
    code, result = _run_demo(
        tmp_path, "--sizes", "24,24,24,24", "--clip-steps", "40", "--sft-steps", "2", "--rl-steps", "1"
    )
    assert code in (0, 1) and result["passed"] == result["gate"]["passed"] == (code == 0)
    rule = result["gate"]["rules"][0]
    assert rule["rule"] == "image_text_match_accuracy>=baseline+0.15"
    assert rule["threshold"] == pytest.approx(result["models"]["sft"]["image_text_match_accuracy"] + 0.15)
    assert set(result["models"]) == {"sft", "grpo", "true_captions"}
    assert (result["candidate"], result["baseline"], result["data"]["heldout"]) == ("grpo", "sft", 24)
    for metrics in result["models"].values():
        assert 0.0 <= metrics["image_text_match_accuracy"] <= 1.0 and 0.0 <= metrics["clip_score_mean"] <= 1.0
        assert (metrics["pairs"], metrics["distractors"]) == (24, 4)
    truth = result["models"]["true_captions"]
    assert truth["caption_exact"] == 1.0
    assert truth["image_text_match_accuracy"] > 0.5  # 40 steps already lift the scorer well above chance (0.2)
    assert result["clips"]["scorer_clip"]["loss_last"] < result["clips"]["scorer_clip"]["loss_first"]
    grpo_log = [json.loads(line) for line in open(tmp_path / "demo" / "grpo" / "metrics.jsonl")]
    assert any("rewards/clip" in row for row in grpo_log)  # GRPO was rewarded by the CLIP


@pytest.mark.extended
def test_grpo_with_the_clip_reward_beats_sft_by_the_claimed_margin(tmp_path):
    """The demo's claim on seed 0 at its default settings (about a minute and a half on 2 cores)."""
    code, result = _run_demo(tmp_path)
    assert code == 0 and result["gain"] >= 0.15
