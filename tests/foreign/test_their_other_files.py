"""LLaMA-Factory's DPO, KTO, reward, pretraining and PPO examples with their demo data
(tests/data/foreign/README.md says where they come from): every key of the files is mapped, their
demo data become our rows, and each trains and saves a model with only the model, the output directory
and the step count given on the command line (PPO, after their reward example: extended)."""

import importlib
import json
import os

import pytest
import yaml

from tests.conftest import REPO
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.data.dataset import build_dataset
from trainer_lib.rl.prompts import PROMPT_FORMATS
from trainer_lib.stages.training.ppo import CONFIG as PPOConfig
from trainer_lib.stages.training.sft import SFTConfig

LLAMAFACTORY = os.path.join(REPO, "tests", "data", "foreign", "llamafactory")
#: example file -> (our stage, what its stage key says, the format of its data here, rows read)
EXAMPLES = {
    "examples/train_lora/qwen3_lora_dpo.yaml": ("dpo", "(checked: posttrain dpo)", "preference", 2),
    "examples/train_lora/qwen3_lora_kto.yaml": ("dpo", "loss=kto", "unpaired_preference", 6),
    "examples/train_lora/qwen3_lora_reward.yaml": ("reward", "(checked: posttrain reward)", "preference", 2),
    "examples/train_lora/qwen3_lora_pretrain.yaml": (
        "sft",
        "(checked: posttrain sft, continued pretraining",
        "text",
        3,
    ),
}
PPO_FILE = "examples/train_lora/llama3_lora_ppo.yaml"
#: their keys that are ours as they are
OWN_KEYS = {"output_dir", "logging_steps", "save_steps", "report_to"}


def _mapping(err: str) -> dict[str, str]:
    lines = [line[len("config: ") :] for line in err.splitlines() if line.startswith("config: ")]
    return dict(line.split(" -> ", 1) for line in lines if " -> " in line)


@pytest.fixture
def in_llamafactory(monkeypatch, tmp_path):
    monkeypatch.chdir(LLAMAFACTORY)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("POSTTRAIN_NO_PROGRESS", "1")


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_key_of_their_example_is_mapped_and_their_data_read(name, in_llamafactory, capsys):
    stage, stage_note, fmt, rows = EXAMPLES[name]
    argv = ["train", name, "model_name_or_path=m", "output_dir=o", "max_steps=1", "--print-config"]
    assert main(argv) == 0
    mapping = _mapping(capsys.readouterr().err)
    with open(name, encoding="utf-8") as fh:
        keys = set(yaml.safe_load(fh))
    assert keys - set(mapping) == OWN_KEYS  # every other key says what it became
    assert mapping["stage"].startswith(stage_note) and mapping["dataset"] == "data.dataset"

    config_class = importlib.import_module(f"trainer_lib.stages.training.{stage}").CONFIG
    cfg = load_config(config_class, [name], ["model_name_or_path=m", "output_dir=o", "max_steps=1"], stage=stage)
    _, stats = build_dataset(cfg.data, seed=0)
    assert stats["format"] == fmt and stats["rows_read"] == rows


def test_their_ppo_example_prompts_are_their_sft_datasets(in_llamafactory):
    """The PPO example reads identity and alpaca_en_demo: their prompts, the answers kept as completions."""
    with open(PPO_FILE, encoding="utf-8") as fh:
        their = yaml.safe_load(fh)
    assert their["stage"] == "ppo" and their["reward_model"]
    keys = ["model.path=m", "output_dir=o", f"dataset={their['dataset']}", "data.eval_fraction=0"]
    cfg = load_config(SFTConfig, None, keys)
    dd, stats = build_dataset(cfg.data, seed=0, allowed_formats=PROMPT_FORMATS, stage="RL")
    assert stats["format"] == "prompt_completion" and stats["rows"]["train"] == 10
    # its model and generation keys
    generation = {
        k: their[k] for k in ("model_name_or_path", "output_dir", "reward_model", "max_new_tokens", "top_k", "top_p")
    }
    ppo = load_config(PPOConfig, [{**generation, "dataset_name": "d"}], stage="ppo")
    assert ppo.reward.model_path == "saves/llama3-8b/lora/reward"
    assert (ppo.rollout.max_new_tokens, ppo.rollout.top_k, ppo.rollout.top_p) == (512, 0, 0.9)
    assert dd["train"][0]["prompt"] == [{"role": "user", "content": "hi"}]
    assert dd["train"][0]["completion"][0]["role"] == "assistant"
    # the whole file: its step is per_device_train_batch_size x gradient_accumulation_steps prompts, one
    # completion each, one update of the whole step per PPO epoch (its mini-batches accumulate to it)
    whole = load_config(PPOConfig, [PPO_FILE], ["model_name_or_path=m", "output_dir=o", "max_steps=1"], stage="ppo")
    assert (whole.prompts_per_step, whole.rollout.n, whole.mini_batch, whole.batch_size) == (8, 1, 8, 1)
    assert whole.updates_per_step() == whole.ppo_epochs == 4


@pytest.fixture(scope="module")
def lf_demo_model(tmp_path_factory) -> str:
    """A 2-layer Llama whose tokenizer is trained on every demo file, so that a row is words, not letters."""
    from trainer_lib.demo.tiny_model import make_tiny_model

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, (list, dict)):
            for item in value.values() if isinstance(value, dict) else value:
                yield from strings(item)

    texts = []
    for name in ("dpo_en_demo.json", "kto_en_demo.json"):
        with open(os.path.join(LLAMAFACTORY, "data", name), encoding="utf-8") as fh:
            texts += [" ".join(strings(row)) for row in json.load(fh)]
    with open(os.path.join(LLAMAFACTORY, "data", "c4_demo.jsonl"), encoding="utf-8") as fh:
        texts += [json.loads(line)["text"] for line in fh]
    out = tmp_path_factory.mktemp("models") / "lf-demo"
    return make_tiny_model(str(out), texts * 2, vocab_size=1000, num_layers=2, hidden_size=64, seed=0)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_their_other_examples_train_and_save_a_model(name, lf_demo_model, in_llamafactory, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", name, f"model_name_or_path={lf_demo_model}", f"output_dir={out}", "max_steps=1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["format"] == EXAMPLES[name][2]
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


@pytest.mark.extended  # 4-7 min here: their max_new_tokens=512, which a random model fills, 4 PPO epochs
def test_their_ppo_example_trains_with_the_reward_model_their_reward_example_made(
    lf_demo_model, tmp_path, monkeypatch, capsys
):
    """The PPO file names its reward model by path (saves/llama3-8b/lora/reward): their reward example,
    trained into that path, is it. Only the model, the output dirs and max_steps are given; the model's
    tokenizer has Llama 3's special tokens, which the file's `template: llama3` writes."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama3 = str(tmp_path / "llama3-tiny")
    tokenizer = AutoTokenizer.from_pretrained(lf_demo_model)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    model = AutoModelForCausalLM.from_pretrained(lf_demo_model)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(llama3)
    tokenizer.save_pretrained(llama3)
    work = tmp_path / "llamafactory"
    shutil.copytree(LLAMAFACTORY, work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("POSTTRAIN_NO_PROGRESS", "1")
    with open(PPO_FILE, encoding="utf-8") as fh:
        reward_dir = yaml.safe_load(fh)["reward_model"]
    reward = ["examples/train_lora/qwen3_lora_reward.yaml", f"model_name_or_path={llama3}"]
    assert main(["train", *reward, f"output_dir={reward_dir}", "max_steps=1"]) == 0
    out = tmp_path / "ppo"
    assert main(["train", PPO_FILE, f"model_name_or_path={llama3}", f"output_dir={out}", "max_steps=1"]) == 0
    err = capsys.readouterr().err
    assert "gradient_accumulation_steps -> rollout.n=1, prompts_per_step=8, mini_batch_size=0" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stage"] == "ppo" and summary["steps"] == 1
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
