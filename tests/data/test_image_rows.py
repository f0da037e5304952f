"""The images column: LLaMA-Factory's mllm_demo rows load unchanged, every prompt format carries images
(paths, s3:// URLs, hub image features), and a bad image or placeholder count names FILE:ROW:FIELD."""

import hashlib
import io
import json
import os
import shutil

import pytest
from PIL import Image

from tests.conftest import REPO
from trainer_lib.config import load_config
from trainer_lib.data import images
from trainer_lib.data.dataset import build_dataset
from trainer_lib.data.formats import canonical_key
from trainer_lib.data.normalize import Normalizer
from trainer_lib.errors import DataError, UserError
from trainer_lib.stages.training.sft import SFTConfig

DEMO = os.path.join(REPO, "tests", "data", "multimodal")
COLOURS = {"1.png": (255, 0, 0), "2.png": (0, 0, 255), "3.png": (0, 255, 0)}


def _png(path, colour=(255, 0, 0), size=(8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    data = buffer.getvalue()
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    return data


def _sha(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """tests/data/multimodal (mllm_demo.json and its dataset_info.json) with its PNGs drawn, in a temp dir."""
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data"
    shutil.copytree(DEMO, root)
    for name, colour in COLOURS.items():
        _png(str(root / "mllm_demo_data" / name), colour)
    return root


def _build(*keys):
    cfg = load_config(SFTConfig, None, ["model.path=m", "output_dir=o", "data.eval_fraction=0", *keys]).data
    return build_dataset(cfg, seed=0)


def test_mllm_demo_rows_load_unchanged_by_path_and_by_dataset_info(demo, monkeypatch):
    monkeypatch.chdir(demo.parent)  # relative image paths resolve against the file's folder, not here
    dd, stats = _build(f"data.path={demo / 'mllm_demo.json'}")
    assert stats["format"] == "messages" and stats["columns"] == ["messages", "images"]
    raw = json.load(open(demo / "mllm_demo.json"))
    rows = list(dd["train"])
    assert [r["messages"] for r in rows] == [r["messages"] for r in raw]  # the text as it was
    third = rows[2]["images"]
    assert [ref["path"] for ref in third] == [str(demo / "mllm_demo_data" / n) for n in ("1.png", "3.png")]
    assert [ref["sha256"] for ref in third] == [_sha(ref["path"]) for ref in third]
    assert all(ref["bytes"] is None for ref in third)  # references, not pixels
    assert images.load_image(third[1]).getpixel((0, 0)) == COLOURS["3.png"]

    by_name, stats = _build(f"data.dataset_dir={demo}", "data.dataset=mllm_demo")  # LLaMA-Factory's registry entry
    assert (stats["source_format"], stats["format"]) == ("sharegpt", "messages")
    assert list(by_name["train"]) == rows


def test_every_prompt_format_carries_images(tmp_path):
    _png(str(tmp_path / "img" / "a.png"))
    where = str(tmp_path / "rows.jsonl")
    ref = {"bytes": None, "path": str(tmp_path / "img" / "a.png"), "sha256": _sha(tmp_path / "img" / "a.png")}
    rows = {
        "alpaca": {"instruction": "<image>Describe it.", "output": "Red.", "images": ["img/a.png"]},
        "prompt_only": {"prompt": "Describe the picture.", "images": "img/a.png"},  # one image, no placeholder
        "text": {"text": "<image> is red.", "images": '["img/a.png"]'},  # a CSV cell: a JSON list
        "preference": {"prompt": "<image>Colour?", "chosen": "Red.", "rejected": "Blue.", "images": ["img/a.png"]},
        "prompt_completion": {"prompt": [{"role": "user", "content": "<image>?"}], "completion": [], "images": [ref]},
    }
    for fmt, row in rows.items():
        out = Normalizer()(f"{where}:3", row)
        assert out["images"] == [ref], fmt
    renamed = Normalizer("alpaca", columns={"prompt": "q", "response": "a", "images": "pictures"})
    out = renamed(f"{where}:4", {"q": "<image>Colour?", "a": "Red.", "pictures": ["img/a.png"]})
    assert out["images"] == [ref] and "pictures" not in out
    with open(tmp_path / "img" / "a.png", "ab") as fh:
        fh.write(b"edited")  # a file changed after its row was read is caught when it is loaded
    with pytest.raises(UserError, match="changed since its dataset was read"):
        images.load_image(ref)


def test_hub_image_features_and_s3_urls(tmp_path, s3_bucket, monkeypatch):
    import boto3
    import datasets

    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    png = _png(None, (0, 0, 255))
    features = datasets.Features({"prompt": datasets.Value("string"), "images": [datasets.Image()]})
    saved = datasets.Dataset.from_dict(
        {"prompt": ["<image>What colour?"], "images": [[{"bytes": png, "path": "blue.png"}]]}, features=features
    )
    saved.save_to_disk(str(tmp_path / "hub"))
    dd, _ = _build(f"data.path={tmp_path / 'hub'}")  # datasets hands the images over decoded
    (ref,) = dd["train"][0]["images"]
    assert ref["path"] is None and images.load_image(ref).getpixel((0, 0)) == (0, 0, 255)
    out = Normalizer()("hub[train]:row 0", {"prompt": "x", "images": [{"bytes": png, "path": "blue.png"}]})
    assert out["images"] == [{"bytes": png, "path": "blue.png", "sha256": hashlib.sha256(png).hexdigest()}]

    s3 = boto3.client("s3")
    s3.put_object(Bucket=s3_bucket, Key="set/img/b.png", Body=png)
    row = {"prompt": "<image>Colour?", "images": ["img/b.png"]}  # relative to the data's prefix
    s3.put_object(Bucket=s3_bucket, Key="set/rows.jsonl", Body=(json.dumps(row) + "\n").encode())
    dd, _ = _build(f"data.path=s3://{s3_bucket}/set/rows.jsonl")
    (ref,) = dd["train"][0]["images"]
    assert ref["path"] == f"s3://{s3_bucket}/set/img/b.png" and ref["sha256"] == hashlib.sha256(png).hexdigest()
    assert images.load_image(ref).getpixel((0, 0)) == (0, 0, 255)


def _error(row, location="d.jsonl:4"):
    with pytest.raises(DataError) as err:
        Normalizer()(location, row)
    return str(err.value)


def test_bad_images_name_file_row_and_field(tmp_path, demo, monkeypatch):
    where = str(tmp_path / "d.jsonl")
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    whole = _png(str(tmp_path / "whole.png"), size=(64, 64))
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    _png(str(tmp_path / "wide.png"), size=(20, 4))
    ok = "whole.png"
    assert _error({"prompt": "x", "images": [ok, "gone.png"]}, f"{where}:4") == (
        f"{where}:4: field 'images[1]': expected an image file that exists (looked for {tmp_path / 'gone.png'}), "
        "got str 'gone.png'"
    )
    assert _error({"prompt": "x", "images": ["junk.png"]}, f"{where}:5").startswith(
        f"{where}:5: field 'images[0]': expected an image that decodes (PIL: cannot identify image file), got str"
    )
    assert f"{where}:6: field 'images[0]': expected an image that decodes (PIL: " in _error(
        {"prompt": "x", "images": ["cut.png"]}, f"{where}:6"
    )
    assert _error({"prompt": "x", "images": [7]}, f"{where}:7").startswith(
        f"{where}:7: field 'images[0]': expected an image: a path, a storage URL, or"
    )
    monkeypatch.setattr(images, "MAX_SIDE", 16)
    assert _error({"prompt": "x", "images": ["wide.png"]}, f"{where}:8") == (
        f"{where}:8: field 'images[0]': expected an image of at most 16 pixels a side (this one is 20x4), "
        "got str 'wide.png'"
    )

    (demo / "mllm_demo_data" / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")  # a full build: nothing is kept
    with pytest.raises(DataError, match=r"mllm_demo.json:18: field 'images\[1\]': expected an image that decodes"):
        _build(f"data.path={demo / 'mllm_demo.json'}")
    cache = os.path.join(os.environ["POSTTRAIN_CACHE"], "data")
    kept = [f for _, _, files in os.walk(cache) for f in files if f.endswith(".arrow")]
    assert kept == []


def test_placeholders_must_match_the_images(tmp_path):
    _png(str(tmp_path / "a.png"))
    where = str(tmp_path / "d.jsonl")
    conversation = [{"role": "user", "content": "<image> and <image>?"}, {"role": "assistant", "content": "Both."}]
    assert _error({"messages": conversation, "images": ["a.png"]}, f"{where}:2") == (
        f"{where}:2: field 'images': expected 2 images, one per <image> placeholder in the text (messages), "
        "got list ['a.png']"
    )
    assert _error({"prompt": "<image>?", "images": []}, f"{where}:3").startswith(
        f"{where}:3: field 'images': expected 1 images, one per <image> placeholder in the text (prompt)"
    )
    assert len(Normalizer()(f"{where}:4", {"messages": conversation, "images": ["a.png", "a.png"]})["images"]) == 2
    text_only = {"prompt": "What does <image> mean in HTML?"}  # no images column: a text row as before
    assert Normalizer()(f"{where}:5", text_only) == text_only


def test_same_text_about_another_image_is_not_a_duplicate(tmp_path):
    _png(str(tmp_path / "red.png"), (255, 0, 0))
    _png(str(tmp_path / "blue.png"), (0, 0, 255))
    _png(str(tmp_path / "red_copy.png"), (255, 0, 0))
    where = f"{tmp_path / 'd.jsonl'}:1"
    keys = [
        canonical_key(Normalizer()(where, {"prompt": "<image>Colour?", "images": [name]}), "prompt_only")
        for name in ("red.png", "blue.png", "red_copy.png")
    ]
    assert keys[0] != keys[1] and keys[0] == keys[2]  # by content, not by file name
    assert canonical_key({"prompt": "Colour?"}, "prompt_only") == '{"prompt":"Colour?"}'  # text rows: as before
