"""The generation interface on one process: batches and their seeds, the torch engine against rollout's own
generate, the choice of engine without vLLM, and clear errors for an export that is not there."""

import json

import pytest

from trainer_lib.errors import ConfigError, UserError
from trainer_lib.eval.generation import (
    TorchEngine,
    batch_seed,
    choose_engine,
    generate_sharded,
    read_export,
    vllm_usable,
)


class EchoEngine:
    """An engine whose text says which prompt, copy and seed produced it, to check what generate_sharded asks."""

    name, tokenizer, collective = "echo", None, False

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, *, n=1, max_new_tokens=64, temperature=0.0, top_p=1.0, stop=(), seed=0):
        self.calls.append((len(prompt_ids), n, seed))
        return [f"{ids[0]}@{seed}" for ids in prompt_ids for _ in range(n)]

    def close(self):
        pass


def test_batch_seeds_are_the_seed_then_distinct():
    assert batch_seed(7, 0) == 7 and batch_seed(0, 0) == 0
    seeds = [batch_seed(7, i) for i in range(50)]
    assert len(set(seeds)) == 50 and seeds == [batch_seed(7, i) for i in range(50)]
    assert all(0 <= s < 2**63 for s in seeds) and batch_seed(8, 1) != batch_seed(7, 1)


def test_batches_of_sequences_in_order_each_with_its_seed():
    engine = EchoEngine()
    texts = generate_sharded(engine, [[10], [11], [12]], batch_size=4, n=3, temperature=0.8, seed=5)
    # 9 sequences (3 copies of each prompt, consecutive) in batches of 4, 4 and 1
    assert engine.calls == [(4, 1, 5), (4, 1, batch_seed(5, 1)), (1, 1, batch_seed(5, 2))]
    b1, b2 = batch_seed(5, 1), batch_seed(5, 2)
    assert texts == ["10@5"] * 3 + ["11@5", f"11@{b1}", f"11@{b1}", f"12@{b1}", f"12@{b1}", f"12@{b2}"]
    assert generate_sharded(engine, [], batch_size=4) == []


def test_torch_engine_gives_rollouts_texts(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.rl.rollout import generate

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [tokenizer(text)["input_ids"] for text in ("Say hello.", "Name a color.", "Is the sky green?")]
    engine = TorchEngine(model, tokenizer)
    for sampling in ({}, {"temperature": 1.0, "top_p": 0.9}):
        texts = generate_sharded(engine, prompts, batch_size=2, max_new_tokens=6, stop=("e",), **sampling)
        whole = generate(
            model, tokenizer, prompts, max_new_tokens=6, stop=["e"], batch_size=2, **{"temperature": 0.0, **sampling}
        )
        if not sampling:  # greedy: the same texts as one rollout over every prompt
            assert texts == whole.completions
        else:  # sampled: the first batch draws from the seed itself, as one rollout's first chunk does
            assert texts[:2] == whole.completions[:2] and len(texts) == 3
    assert all("e" not in text for text in texts)  # cut before the stop string
    engine.close()
    assert engine.model is None


@pytest.mark.skipif(vllm_usable(), reason="vLLM and CUDA are here")
def test_without_vllm_auto_is_torch_and_vllm_is_refused():
    assert choose_engine("auto") == "torch" and choose_engine("torch", 4, "zero3") == "torch"
    with pytest.raises(ConfigError, match=r"^engine: vllm needs the vllm package and a CUDA GPU"):
        choose_engine("vllm")


def test_a_missing_export_or_variant_is_named(tmp_path):
    with pytest.raises(UserError, match=r"^served\.export_dir: .* has no export\.json"):
        read_export(str(tmp_path), "int8")
    (tmp_path / "export.json").write_text(json.dumps({"models": {"fp32": "onnx/fp32/model.onnx"}}))
    with pytest.raises(UserError, match=r"^served\.variant: 'int8' is not in the export \(it has fp32\)"):
        read_export(str(tmp_path), "int8")
    (tmp_path / "export.json").write_text("{not json")
    with pytest.raises(UserError, match=r"^served\.export_dir: .* is not JSON"):
        read_export(str(tmp_path), "fp32")
    (tmp_path / "export.json").write_text(json.dumps({"models": {"fp32": "onnx/fp32/model.onnx"}}))
    assert read_export(str(tmp_path), "fp32")["models"] == {"fp32": "onnx/fp32/model.onnx"}
