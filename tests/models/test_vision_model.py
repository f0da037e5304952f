"""A tiny random LLaVA: it loads with its processor, its vision tower frozen, LoRA only in the language model;
image rows tokenize with every image position out of the loss, and collate with their pixels in order."""

import json

import pytest
import torch

from trainer_lib.config import LoraConfig, ModelConfig
from trainer_lib.data.tokenize import IGNORE

TEXTS = ["What colour is it? It is red.", "Describe the picture. A blue square.", "A green circle."] * 20
TOKENS_PER_IMAGE = 4  # (28 / 14)^2 patches; CLIP's class token is dropped by the "default" strategy


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    from trainer_lib.demo.tiny_model import make_tiny_vlm

    return make_tiny_vlm(str(tmp_path_factory.mktemp("vlm") / "tiny"), TEXTS)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[dict]:
    """Two normalized image references (as the data layer leaves them): a red and a blue picture."""
    from PIL import Image

    from trainer_lib.data.images import normalize_images

    folder = tmp_path_factory.mktemp("images")
    for name, colour in (("red.png", (255, 0, 0)), ("blue.png", (0, 0, 255))):
        Image.new("RGB", (40, 30), colour).save(folder / name)
    return normalize_images({"images": ["red.png", "blue.png"]}, (), f"{folder / 'rows.jsonl'}:1")


def _processor(vlm_dir):
    from trainer_lib.models.load import load_processor, load_tokenizer

    cfg = ModelConfig(path=vlm_dir)
    return load_processor(cfg, load_tokenizer(cfg))


def test_loads_as_image_text_model_with_the_vision_tower_frozen(vlm_dir):
    from trainer_lib.models.load import load_causal_lm

    model = load_causal_lm(ModelConfig(path=vlm_dir))
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any("vision_tower" in name for name in trainable)
    assert any("multi_modal_projector" in name for name in trainable)
    assert any("language_model" in name for name in trainable)


def test_text_models_load_as_before(tiny_model_dir):
    from trainer_lib.models.load import load_causal_lm, load_processor, load_tokenizer

    cfg = ModelConfig(path=tiny_model_dir)
    model = load_causal_lm(cfg)
    assert type(model).__name__ == "LlamaForCausalLM" and all(p.requires_grad for p in model.parameters())
    assert load_processor(cfg, load_tokenizer(cfg)) is None


def test_lora_adapters_sit_in_the_language_model_only(vlm_dir):
    from trainer_lib.models.load import apply_lora, load_causal_lm

    for targets in (["q_proj", "v_proj"], ["all-linear"]):
        model = apply_lora(load_causal_lm(ModelConfig(path=vlm_dir)), LoraConfig(r=4, target_modules=targets))
        adapted = {name.split(".lora_")[0] for name, p in model.named_parameters() if "lora_" in name}
        assert adapted and all(".language_model." in name for name in adapted), adapted
        assert all("lora_" in name for name, p in model.named_parameters() if p.requires_grad)
        if targets == ["q_proj", "v_proj"]:
            assert {name.rsplit(".", 1)[-1] for name in adapted} == {"q_proj", "v_proj"}
            assert len(adapted) == 4  # 2 layers x (q, v); the vision tower's q_proj/v_proj are left alone


def test_image_tokens_carry_no_loss(vlm_dir, images):
    from trainer_lib.data.vision_tokenize import decode_refs, image_token_id, tokenize_image_row

    processor = _processor(vlm_dir)
    image_id = image_token_id(processor)
    row = {
        "messages": [
            {"role": "user", "content": "<image>What colour is it?"},
            {"role": "assistant", "content": "It is red."},
            {"role": "user", "content": "And this one? <image>"},
            {"role": "assistant", "content": "It is blue."},
        ],
        "images": images,
    }
    ex = tokenize_image_row(row, "messages", processor, max_length=128)
    positions = [i for i, token in enumerate(ex["input_ids"]) if token == image_id]
    assert len(positions) == 2 * TOKENS_PER_IMAGE
    assert all(ex["labels"][i] == IGNORE for i in positions)
    # the assistant turns, and only they, are learned: the labelled tokens decode to both answers
    learned = processor.tokenizer.decode([t for t, label in zip(ex["input_ids"], ex["labels"]) if label != IGNORE])
    assert learned == "It is red.<|im_end|>\nIt is blue.<|im_end|>\n"
    assert [ref["sha256"] for ref in decode_refs(ex["images"])] == [ref["sha256"] for ref in images]

    # no placeholder: the images go to the start of the first user turn
    plain = {"messages": [{"role": "user", "content": "Describe both."}, {"role": "assistant", "content": "Two."}]}
    ex = tokenize_image_row({**plain, "images": images}, "messages", processor, max_length=128)
    first = ex["input_ids"].index(image_id)
    assert ex["input_ids"][first : first + 2 * TOKENS_PER_IMAGE] == [image_id] * (2 * TOKENS_PER_IMAGE)
    assert processor.tokenizer.decode(ex["input_ids"][:first]) == "<|im_start|>user\n"

    # a cut inside an image drops the row; a cut after the last image keeps it
    assert tokenize_image_row({**plain, "images": images}, "messages", processor, max_length=first + 3) is None
    cut = tokenize_image_row({**plain, "images": images}, "messages", processor, max_length=first + 9)
    assert len(cut["input_ids"]) == first + 9


def test_collate_carries_each_sequences_pixels_in_order(vlm_dir, images):
    from trainer_lib.data.tokenize import collate_packed
    from trainer_lib.data.vision_tokenize import encode_refs, with_images

    processor = _processor(vlm_dir)
    examples = [
        {"input_ids": [1, 2], "labels": [1, 2], "images": encode_refs(images[1:])},
        {"input_ids": [3], "labels": [3], "images": encode_refs([])},
        {"input_ids": [4, 5], "labels": [4, 5], "images": encode_refs(images[:1])},
    ]
    batch = with_images(collate_packed, processor, "cpu")(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5]]
    pixels = batch["pixel_values"]
    assert pixels.shape == (2, 3, 28, 28)
    # blue first (the first sequence's image), then red: channel means tell them apart
    assert pixels[0, 2].mean() > pixels[0, 0].mean() and pixels[1, 0].mean() > pixels[1, 2].mean()
    text_only = with_images(collate_packed, processor, "cpu")(examples[1:2])
    assert "pixel_values" not in text_only


def test_processor_files_load_back(vlm_dir, tmp_path):
    from transformers import AutoProcessor

    from trainer_lib.data.vision_tokenize import processor_fingerprint
    from trainer_lib.models.vision import processor_files

    processor = _processor(vlm_dir)
    files = processor_files(processor)
    assert "processor_config.json" in files and json.loads(files["processor_config.json"])
    processor.tokenizer.save_pretrained(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    again = AutoProcessor.from_pretrained(tmp_path)
    assert processor_fingerprint(again) == processor_fingerprint(processor)
    assert processor_files(None) == {}
    again.image_processor.crop_size = {"height": 56, "width": 56}  # another number of tokens per image
    assert processor_fingerprint(again) != processor_fingerprint(processor)


def test_padded_forward_runs_with_pixels(vlm_dir, images):
    """The collated batch is what the model takes: a forward with labels gives a finite loss."""
    from trainer_lib.data.tokenize import collate_padded
    from trainer_lib.data.vision_tokenize import tokenize_image_row, with_images
    from trainer_lib.models.load import load_causal_lm

    processor = _processor(vlm_dir)
    row = {"messages": [{"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": "Red."}]}
    ex = tokenize_image_row({**row, "images": images[:1]}, "messages", processor, max_length=64)
    batch = with_images(lambda exs: collate_padded(exs, processor.tokenizer.pad_token_id), processor, "cpu")([ex, ex])
    model = load_causal_lm(ModelConfig(path=vlm_dir))
    with torch.no_grad():
        assert torch.isfinite(model(**batch).loss)


def test_preference_pairs_share_their_prompts_images(vlm_dir, images):
    """Chosen and rejected rows both see the prompt's image: the pixels come twice, in row order, and
    reach the model through model_inputs (other pixels, other log-probs)."""
    from trainer_lib.data.preference_batches import collate_pairs, model_inputs
    from trainer_lib.data.vision_tokenize import image_token_id, tokenize_image_pair, with_pair_images
    from trainer_lib.models.load import load_causal_lm
    from trainer_lib.models.reference import forward_logps

    processor = _processor(vlm_dir)
    row = {
        "prompt": [{"role": "user", "content": "What colour is it?"}],
        "chosen": [{"role": "assistant", "content": "It is red."}],
        "rejected": [{"role": "assistant", "content": "It is blue."}],
    }
    red, blue = (tokenize_image_pair({**row, "images": [ref]}, processor, 64) for ref in images)
    assert red["prompt_ids"].count(image_token_id(processor)) == TOKENS_PER_IMAGE
    assert red["prompt_ids"] == blue["prompt_ids"] and red["images"] != blue["images"]
    model = load_causal_lm(ModelConfig(path=vlm_dir)).eval()
    for packed in (False, True):
        batch = with_pair_images(lambda rows, p=packed: collate_pairs(rows, 0, packed=p), processor)([red, blue])
        assert batch["pixel_values"].shape == (4, 3, 28, 28)  # red, blue (chosen rows), red, blue (rejected rows)
        assert torch.equal(batch["pixel_values"][:2], batch["pixel_values"][2:])
        assert "pixel_values" in model_inputs(batch, "cpu")
        with torch.no_grad():
            logps = forward_logps(model, batch, "cpu")
        assert not torch.allclose(logps.chosen[0], logps.chosen[1])  # same tokens, other picture
    assert tokenize_image_pair({**row, "images": images[:1]}, processor, len(red["prompt_ids"])) is None  # no room


def test_rollouts_carry_their_prompts_pixels(vlm_dir, images):
    """GRPO's rollouts: prompts with their image tokens expanded, pixels passed to generate and kept per row
    (select picks each row's own), no image token generated, and the pixels reach every forward."""
    import dataclasses

    from trainer_lib.data.vision_tokenize import image_prompts, image_token_id
    from trainer_lib.models.load import load_causal_lm
    from trainer_lib.rl.rollout import generate, token_logprobs

    processor = _processor(vlm_dir)
    image_id = image_token_id(processor)
    ask = [{"role": "user", "content": "<image>Colour?"}]
    rows = [{"prompt": ask, "images": images[:1]}, {"prompt": ask, "images": images[1:]}, {"prompt": "No picture."}]
    ids, pixels = image_prompts(rows, processor)
    assert [row.count(image_id) for row in ids] == [TOKENS_PER_IMAGE, TOKENS_PER_IMAGE, 0] and pixels[2] is None
    model = load_causal_lm(ModelConfig(path=vlm_dir))
    rollout = generate(model, processor.tokenizer, ids, n=2, max_new_tokens=6, temperature=1.0, pixel_values=pixels)
    assert rollout.image_counts == [1, 1, 1, 1, 0, 0] and rollout.pixel_values.shape == (4, 3, 28, 28)
    assert image_id not in rollout.response_ids.tolist()  # suppressed: a response never holds an image token
    part = rollout.select([1, 2, 5])
    assert part.image_counts == [1, 1, 0] and torch.equal(part.pixel_values, rollout.pixel_values[[1, 2]])
    assert rollout.select([4, 5]).pixel_values is None
    with torch.no_grad():
        own = token_logprobs(model, rollout)[0]
        swapped = token_logprobs(model, dataclasses.replace(rollout, pixel_values=rollout.pixel_values.flip(0)))[0]
    assert not torch.allclose(own[:4], swapped[:4]) and torch.allclose(own[4:], swapped[4:])


def test_a_row_without_images_may_not_hold_an_image_marker(vlm_dir):
    from trainer_lib.data.vision_tokenize import tokenize_image_row
    from trainer_lib.errors import UserError

    processor = _processor(vlm_dir)
    row = {"messages": [{"role": "user", "content": "<image>Colour?"}, {"role": "assistant", "content": "Red."}]}
    with pytest.raises(UserError, match="a row without images has <image>"):
        tokenize_image_row(row, "messages", processor, 64)
    plain = {"messages": [{"role": "user", "content": "Colour?"}, {"role": "assistant", "content": "Red."}]}
    assert tokenize_image_row(plain, "messages", processor, 64)["images"] == "[]"  # a text row trains as text
