"""model.chat_template: a built-in, Jinja text or a file gives a template-less base model a chat format."""

import json
import os
import shutil

import pytest

from trainer_lib.cli import main
from trainer_lib.config import ModelConfig, load_config
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.models.load import load_tokenizer
from trainer_lib.stages.training.sft import SFTConfig

CHAT = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]


@pytest.fixture(scope="module")
def base_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with its chat template taken away: a base model."""
    out = tmp_path_factory.mktemp("base") / "tiny-base"
    shutil.copytree(tiny_model_dir, out)
    os.remove(out / "chat_template.jinja")
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config["eos_token"] = "<|endoftext|>"  # a base model's document end, not a turn end
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(ModelConfig(path=str(out))).chat_template is None
    return str(out)


def test_chatml_renders_turns_and_makes_its_end_of_turn_the_eos(base_model):
    tokenizer = load_tokenizer(ModelConfig(path=base_model, chat_template="chatml"))
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert text == "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>\n"
    prompt = tokenizer.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"


def test_zephyr_fits_any_tokenizer_and_overrides_a_models_own(tiny_model_dir):
    own = load_tokenizer(ModelConfig(path=tiny_model_dir))
    assert own.chat_template  # the tiny chat model has one ...
    tokenizer = load_tokenizer(ModelConfig(path=tiny_model_dir, chat_template="zephyr"))  # ... replaced
    eos = tokenizer.eos_token
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == f"<|user|>\nSay hi.{eos}\n<|assistant|>\nHi!{eos}\n"


def test_jinja_text_and_files(base_model, tmp_path):
    jinja = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    tokenizer = load_tokenizer(ModelConfig(path=base_model, chat_template=jinja))
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == "[user] Say hi.\n[assistant] Hi!\n"
    (tmp_path / "t.jinja").write_text("{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}")
    tokenizer = load_tokenizer(ModelConfig(path=base_model, chat_template=str(tmp_path / "t.jinja")))
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == "<user> Say hi.\n<assistant> Hi!\n"


def test_clear_errors(base_model):
    with pytest.raises(UserError, match="llama3 writes the special tokens <|start_header_id|>.*use zephyr"):
        load_tokenizer(ModelConfig(path=base_model, chat_template="llama3"))
    required = {"model": {"path": base_model}, "data": {"path": "d.jsonl"}, "output_dir": "o"}
    with pytest.raises(ConfigError, match="model.chat_template: 'chatmll' is neither a built-in template"):
        load_config(SFTConfig, [required], ["model.chat_template=chatmll"])


def test_their_keys():
    required = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output_dir": "o"}
    assert load_config(SFTConfig, [{**required, "template": "llama3"}]).model.chat_template == "llama3"
    assert load_config(SFTConfig, [{**required, "template": "qwen"}]).model.chat_template == ""  # its own
    assert load_config(SFTConfig, [{**required, "chat_template_path": "{{ x }}"}]).model.chat_template == "{{ x }}"


def test_sft_of_a_base_model_on_chat_data(base_model, chat_jsonl, tmp_path, capsys):
    args = [
        "sft",
        f"model.path={base_model}",
        f"data.path={chat_jsonl}",
        "max_steps=2",
        "batch_size=2",
        "data.max_length=64",
        "save_steps=0",
        "report_to=none",
    ]
    assert main([*args, f"output_dir={tmp_path / 'no'}"]) == 2  # conversational data needs a template
    assert "set model.chat_template" in capsys.readouterr().err
    out = tmp_path / "sft"
    assert main([*args, f"output_dir={out}", "model.chat_template=chatml"]) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = AutoTokenizer.from_pretrained(out)  # the template travels with the trained model
    assert saved.apply_chat_template(CHAT, tokenize=False).startswith("<|im_start|>user\nSay hi.<|im_end|>")
    eos = AutoModelForCausalLM.from_pretrained(out).generation_config.eos_token_id
    assert saved.convert_tokens_to_ids("<|im_end|>") in (eos if isinstance(eos, list) else [eos])
