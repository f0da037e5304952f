"""reward.clip_path: the CLIP-space reward equals (cos + 1) / 2 of embeddings computed by hand from a tiny
random CLIPModel's towers and projection weights, loaded from a local directory as a real one is."""

import types

import pytest
import torch
from PIL import Image

from trainer_lib.data.normalize import Normalizer
from trainer_lib.errors import ConfigError, UserError

WORDS = ["a red square", "a blue circle", "two green triangles", "a small yellow star", "nothing at all"]
COLOURS = [(255, 0, 0), (0, 0, 255), (0, 160, 0)]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> str:
    """A 2-layer CLIP (32-pixel images, 16-dim projections), its BPE tokenizer (every text closed by the
    eos token CLIP pools at) and a CLIPImageProcessor, saved as one HF directory."""
    from tokenizers.processors import TemplateProcessing
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from trainer_lib.demo.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(WORDS * 20, vocab_size=300)
    eos = tokenizer.eos_token_id
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"$A {tokenizer.eos_token}", special_tokens=[(tokenizer.eos_token, eos)]
    )
    tokenizer.model_max_length = 64
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    text = {**tower, "vocab_size": len(tokenizer), "max_position_embeddings": 64}
    text.update(eos_token_id=eos, bos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    config = CLIPConfig(text_config=text, vision_config={**tower, "image_size": 32, "patch_size": 8}, projection_dim=16)
    torch.manual_seed(0)
    out = str(tmp_path_factory.mktemp("models") / "clip")
    CLIPModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


@pytest.fixture
def image_rows(tmp_path):
    """Prompt rows as the data layer normalizes them: one image each, and one row with two."""
    for i, colour in enumerate(COLOURS):
        Image.new("RGB", (40, 24), colour).save(tmp_path / f"{i}.png")
    normalize = Normalizer()
    where = f"{tmp_path / 'prompts.jsonl'}:1"
    names = [["0.png"], ["1.png"], ["2.png", "0.png"]]
    return [normalize(where, {"prompt": "Describe the picture.", "images": n})["images"] for n in names]


def _by_hand(clip_dir, texts, refs_per_text):
    """(cos + 1) / 2 from the towers' pooled outputs and the projection matrices, averaged over images."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(clip_dir).eval()
    tokenizer, processor = AutoTokenizer.from_pretrained(clip_dir), AutoImageProcessor.from_pretrained(clip_dir)
    expected = []
    with torch.no_grad():
        for text, refs in zip(texts, refs_per_text):
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            t = model.text_model(input_ids=ids).pooler_output[0] @ model.text_projection.weight.T
            cosines = []
            for ref in refs:
                pixels = processor(images=Image.open(ref["path"]).convert("RGB"), return_tensors="pt")["pixel_values"]
                v = model.vision_model(pixel_values=pixels).pooler_output[0] @ model.visual_projection.weight.T
                cosines.append(float(t @ v / (t.norm() * v.norm())))
            expected.append((sum(cosines) / len(cosines) + 1) / 2)
    return expected


def test_clip_reward_equals_cosine_computed_by_hand(clip_dir, image_rows):
    from trainer_lib.rewards.clip import ClipScorer

    texts = ["a red square", "two green triangles", "a blue circle and a red square", "a small yellow star"]
    refs = [image_rows[0], image_rows[1], image_rows[2], image_rows[0]]
    expected = _by_hand(clip_dir, texts, refs)
    scorer = ClipScorer(clip_dir, batch_size=3)  # texts in batches of 3 with padding; 3 distinct images
    got = scorer(["Describe the picture."] * 4, texts, images=refs)
    assert got == pytest.approx(expected, abs=1e-5)
    assert all(0.0 <= g <= 1.0 for g in got) and max(got) - min(got) > 1e-3
    assert len(scorer.image_cache) == 3  # the shared image was embedded once
    conversations = [[{"role": "assistant", "content": t}] for t in texts]  # chat completions score their text
    assert scorer(["p"] * 4, conversations, images=refs) == pytest.approx(expected, abs=1e-5)


def test_clip_reward_refuses_a_prompt_without_images_and_a_model_that_is_not_clip(clip_dir, image_rows, tiny_model_dir):
    from trainer_lib.rewards.clip import ClipScorer

    scorer = ClipScorer(clip_dir)
    with pytest.raises(UserError, match="reward.clip_path: the prompt 'Name a colour.' has no images"):
        scorer(["Describe.", "Name a colour."], ["red", "blue"], images=[image_rows[0], []])
    with pytest.raises(UserError, match="has no images"):
        scorer(["Describe."], ["red"])  # no images column at all
    with pytest.raises(UserError, match="reward.clip_path: could not load a CLIP-like model"):
        ClipScorer(tiny_model_dir)  # a causal LM: no image processor


def test_clip_reward_combines_with_other_sources(clip_dir, image_rows):
    from trainer_lib.config import load_config
    from trainer_lib.rl.experience import build_rewards
    from trainer_lib.stages.training.grpo import GRPOConfig

    base = ["model.path=m", "output_dir=o", "data.path=d.jsonl"]
    with pytest.raises(ConfigError, match="reward.clip_path"):
        load_config(GRPOConfig, None, base)  # no reward source at all
    keys = [*base, f"reward.clip_path={clip_dir}", "reward.functions=length_penalty", "reward.weights=0.5,2.0"]
    cfg = load_config(GRPOConfig, None, keys)
    strategy = types.SimpleNamespace(device="cpu", all_reduce=lambda sums, op: sums)
    combiner = build_rewards(cfg, strategy, tokenizer=None)
    assert [label for _, _, label in combiner.sources] == ["length_penalty", "clip"]
    texts = ["a red square", "two green triangles"]
    ids = [[1, 2, 3], [1] * 60]
    rewards, means = combiner(["Describe."] * 2, texts, {"images": image_rows[:2]}, ids)
    clip = _by_hand(clip_dir, texts, image_rows[:2])
    length = [fn(["Describe."] * 2, texts, completion_ids=ids) for _, fn, _ in combiner.sources[:1]][0]
    expected = [0.5 * p + 2.0 * c for p, c in zip(length, clip)]
    assert rewards.tolist() == pytest.approx(expected, abs=1e-5)
    assert means["rewards/clip"] == pytest.approx(sum(clip) / 2, abs=1e-6)


def test_grpo_with_the_clip_reward(clip_dir, tiny_model_dir, tmp_path):
    """The images column travels from the prompt file through the RL stage to the reward, end to end."""
    import json

    from tests.stages.training.rl_helpers import one_thread
    from trainer_lib.cli import main

    for i, colour in enumerate(COLOURS):
        Image.new("RGB", (32, 32), colour).save(tmp_path / f"{i}.png")
    with open(tmp_path / "prompts.jsonl", "w", encoding="utf-8") as fh:
        for i in range(8):
            row = {"prompt": [{"role": "user", "content": f"Describe picture {i}."}], "images": [f"{i % 3}.png"]}
            fh.write(json.dumps(row) + "\n")
    out = tmp_path / "grpo"
    args = [f"model.path={tiny_model_dir}", f"data.path={tmp_path / 'prompts.jsonl'}", f"output_dir={out}"]
    args += [f"reward.clip_path={clip_dir}", "rollout.n=4", "prompts_per_step=4", "rollout.max_new_tokens=8"]
    args += ["batch_size=8", "max_steps=2", "save_steps=0", "logging_steps=1", "data.eval_fraction=0"]
    with one_thread():
        assert main(["grpo", *args, "report_to=none"]) == 0
    train = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["split"] == "train"]
    assert len(train) == 2 and all(0.0 < r["rewards/clip"] < 1.0 for r in train)
