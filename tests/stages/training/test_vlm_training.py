"""posttrain sft on a tiny random LLaVA and rows with images: loss falls, the language model changes and the
vision tower does not, resume is exact, the saved model loads back with its processor; a missing image stops
the run with FILE:ROW:FIELD and nothing written; export refuses the model."""

import json
import os
import shutil

import pytest
import torch

from trainer_lib.cli import main

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 180, 30), "yellow": (230, 220, 40)}
QUESTIONS = ["<image>What colour is it?", "<image>Name the colour.", "Describe the picture.", "<image>Which colour?"]


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    from trainer_lib.demo.tiny_model import make_tiny_vlm

    texts = [f"{q} It is {c}." for q in QUESTIONS for c in COLOURS] * 10
    return make_tiny_vlm(str(tmp_path_factory.mktemp("vlm") / "tiny"), texts)


@pytest.fixture(scope="module")
def image_rows(tmp_path_factory) -> str:
    """16 chat rows, each about one coloured picture beside the file (three with <image>, one without)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("vlm_data")
    for name, rgb in COLOURS.items():
        Image.new("RGB", (32, 24), rgb).save(folder / f"{name}.png")
    path = folder / "rows.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for question in QUESTIONS:
            for name in COLOURS:
                messages = [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is {name}."}]
                fh.write(json.dumps({"messages": messages, "images": [f"{name}.png"]}) + "\n")
    return str(path)


def _sft(model, data, out, *extra):
    args = [
        "sft",
        f"model.path={model}",
        f"data.path={data}",
        f"output_dir={out}",
        "lr=3e-3",
        "batch_size=2",
        "data.max_length=64",
        "data.eval_fraction=0",
        "logging_steps=2",
        "seed=1",
        *extra,
    ]
    assert main(args) == 0


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


def _mean_loss(model_dir, data_path) -> float:
    """Mean loss of a saved VLM over the rows, through its own processor and model classes."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from trainer_lib.data.images import normalize_images
    from trainer_lib.data.tokenize import collate_padded
    from trainer_lib.data.vision_tokenize import tokenize_image_row, with_images

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    collate = with_images(lambda exs: collate_padded(exs, processor.tokenizer.pad_token_id), processor, "cpu")
    losses = []
    with open(data_path) as fh:
        for n, line in enumerate(fh, 1):
            row = json.loads(line)
            row["images"] = normalize_images(row, ("messages",), f"{data_path}:{n}")
            with torch.no_grad():
                losses.append(float(model(**collate([tokenize_image_row(row, "messages", processor, 64)])).loss))
    return sum(losses) / len(losses)


def test_sft_trains_a_vlm_resumes_and_saves_it_with_its_processor(vlm_dir, image_rows, tmp_path, capsys):
    out = tmp_path / "sft"
    args = ("max_steps=8", "save_steps=4", "save_total_limit=0")
    _sft(vlm_dir, image_rows, out, *args)
    reference = _weights(out)
    base = _weights(vlm_dir)
    changed = {k for k in base if not torch.equal(base[k], reference[k])}
    assert any("language_model" in k for k in changed) and any("multi_modal_projector" in k for k in changed)
    assert not any("vision_tower" in k for k in changed)  # frozen
    assert _mean_loss(out, image_rows) < 0.8 * _mean_loss(vlm_dir, image_rows)

    # resume: lose everything after the step-4 checkpoint, run again, get the same weights
    shutil.rmtree(out / "checkpoints" / "step-00000008")
    os.remove(out / "model.safetensors")
    capsys.readouterr()
    _sft(vlm_dir, image_rows, out, *args)
    assert "resuming at step 4" in capsys.readouterr().out
    resumed = _weights(out)
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)

    from transformers import AutoModelForImageTextToText, AutoProcessor

    assert type(AutoProcessor.from_pretrained(out)).__name__ == "LlavaProcessor"
    assert type(AutoModelForImageTextToText.from_pretrained(out)).__name__ == "LlavaForConditionalGeneration"


def test_lora_sft_adapts_only_the_language_model(vlm_dir, image_rows, tmp_path):
    out = tmp_path / "lora"
    _sft(vlm_dir, image_rows, out, "max_steps=2", "save_steps=0", "lora.r=4", "data.packing=false")
    weights, base = _weights(out), _weights(vlm_dir)
    assert set(weights) == set(base)  # merged back into plain LLaVA weights
    changed = {k for k in base if not torch.equal(base[k], weights[k])}
    adapted = ("q_proj", "k_proj", "v_proj", "o_proj")  # lora.target_modules' default
    assert changed and all("language_model" in k and k.split(".")[-2] in adapted for k in changed), changed


def test_a_missing_image_stops_sft_with_file_row_field_and_writes_nothing(vlm_dir, image_rows, tmp_path, capsys):
    bad = os.path.join(os.path.dirname(image_rows), "bad.jsonl")  # beside the pictures its rows name
    lines = open(image_rows).read().splitlines()[:3]
    lines.append(json.dumps({"messages": json.loads(lines[0])["messages"], "images": ["missing.png"]}))
    with open(bad, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["sft", f"model.path={vlm_dir}", f"data.path={bad}", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:4" in err and "images[0]" in err and "missing.png" in err
    assert not (out / "model.safetensors").exists() and not (out / "checkpoints").exists()


def test_export_refuses_a_vision_language_model(vlm_dir, tmp_path, capsys):
    out = tmp_path / "onnx"
    assert main(["export", f"model_path={vlm_dir}", f"output_dir={out}"]) == 2
    assert "vision-language model" in capsys.readouterr().err
    assert not out.exists()


def test_dpo_trains_a_vlm_on_image_preference_pairs(vlm_dir, image_rows, tmp_path):
    """Pairs whose answers differ only in the colour the picture shows: the held-out (here: the training)
    preference loss falls from log 2, and the saved model keeps its processor."""
    prefs = os.path.join(os.path.dirname(image_rows), "prefs.jsonl")
    names = list(COLOURS)

    def answer(colour: str) -> list[dict]:
        return [{"role": "assistant", "content": f"It is {colour}."}]

    with open(prefs, "w", encoding="utf-8") as fh:
        for question in QUESTIONS:
            for i, name in enumerate(names):
                row = {"prompt": [{"role": "user", "content": question}], "chosen": answer(name)}
                fh.write(json.dumps({**row, "rejected": answer(names[i - 1]), "images": [f"{name}.png"]}) + "\n")
    out = tmp_path / "dpo"
    args = ["dpo", f"model.path={vlm_dir}", f"data.path={prefs}", f"data.eval_path={prefs}", f"output_dir={out}"]
    args += ["lr=3e-3", "batch_size=4", "data.max_length=64", "max_steps=8", "eval_steps=100", "save_steps=0"]
    assert main(args) == 0
    evals = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "eval"]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 8
    assert evals[0]["loss"] == pytest.approx(0.6931, abs=1e-3) and evals[-1]["loss"] < 0.6, evals
    assert evals[-1]["rewards/accuracy"] > 0.7
    weights, base = _weights(out), _weights(vlm_dir)
    assert not any(torch.equal(weights[k], base[k]) for k in base if "language_model" in k and "layers.1." in k)
    assert all(torch.equal(weights[k], base[k]) for k in base if "vision_tower" in k)
    assert (out / "processor_config.json").exists()


def test_grpo_trains_a_vlm_and_ppo_refuses_one(vlm_dir, image_rows, tmp_path, capsys):
    """GRPO samples with the prompts' pictures (tests/models/test_vision_model.py checks the pixels reach
    generate and every forward) and updates the language model; PPO's critic takes no images: refused."""
    from tests.conftest import REPO

    prompts = tmp_path / "prompts.jsonl"
    folder = os.path.dirname(image_rows)
    with open(prompts, "w", encoding="utf-8") as fh:
        for question in QUESTIONS:
            for name in COLOURS:
                row = {"prompt": [{"role": "user", "content": question}], "images": [f"{folder}/{name}.png"]}
                fh.write(json.dumps(row) + "\n")
    reward = os.path.join(REPO, "tests", "rewards", "length_reward.py") + ":reward"
    common = [f"model.path={vlm_dir}", f"data.path={prompts}", f"reward.functions={reward}", "rollout.n=4"]
    common += ["prompts_per_step=4", "rollout.max_new_tokens=8", "batch_size=8", "data.eval_fraction=0"]
    out = tmp_path / "grpo"
    assert main(["grpo", *common, f"output_dir={out}", "max_steps=4", "logging_steps=2", "lr=1e-3"]) == 0
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4] and all("reward" in r and "kl" in r for r in train)
    weights, base = _weights(out), _weights(vlm_dir)
    assert not all(torch.equal(weights[k], base[k]) for k in base if "language_model" in k)
    assert all(torch.equal(weights[k], base[k]) for k in base if "vision_tower" in k)
    assert (out / "processor_config.json").exists()  # it loads back with AutoProcessor

    assert main(["ppo", *common, f"output_dir={tmp_path / 'ppo'}", "max_steps=1"]) == 2
    assert "vision-language model" in capsys.readouterr().err
