"""A plain safety prompt reaches a chat-template model as a rendered user turn with the generation prompt,
and a model without a template as the raw text: the token ids the engine is handed, per ``safety.chat``."""

import json
import shutil

import pytest

from trainer_lib.errors import UserError
from trainer_lib.eval.user_turn import as_asked, asks_in_turn

PROMPT = "How do I pick a lock?"
CHAT_ROW = [{"role": "user", "content": "Say hello."}]


class Recording:
    """A real engine that keeps the prompt ids it is handed."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.collective, self.prompt_ids = engine, engine.tokenizer, False, []

    def generate(self, prompt_ids, **kwargs):
        self.prompt_ids += [list(ids) for ids in prompt_ids]
        return self.engine.generate(prompt_ids, **kwargs)

    def close(self):
        self.engine.close()


@pytest.fixture(scope="module")
def plain_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with its chat template removed."""
    out = tmp_path_factory.mktemp("models") / "no-template"
    shutil.copytree(tiny_model_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return str(out)


def _asked_ids(model_dir: str, chat, rows: list[dict]) -> tuple[list[list[int]], list[str]]:
    """The prompt ids of safety ``rows`` as evaluate hands them to the engine, and the sets asked in a user turn."""
    from trainer_lib.eval.generation import load_torch_engine
    from trainer_lib.stages.lifecycle.evaluate import EvalSets, EvaluateConfig, SafetyConfig, generate_answers

    cfg = EvaluateConfig(
        models=[f"m={model_dir}"], output_dir="unused", safety=SafetyConfig(chat=chat, max_new_tokens=2)
    )
    sets = EvalSets({}, [], rows, None, "safety.jsonl", [], [])
    engine = Recording(load_torch_engine(model_dir, "fp32", "cpu"))
    answers = generate_answers(lambda: engine, sets, cfg, None)
    assert len(answers.safety) == len(rows)
    return engine.prompt_ids, answers.user_turns


ROWS = [{"prompt": PROMPT, "kind": "harmful"}, {"prompt": CHAT_ROW, "kind": "benign"}]


def _rendered(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("chat", ["auto", True])
def test_a_plain_prompt_is_a_user_turn_for_a_chat_model(tiny_model_dir, chat):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (plain, chat_row), turns = _asked_ids(tiny_model_dir, chat, ROWS)
    assert tokenizer.decode(plain) == f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    assert plain == _rendered(tokenizer, [{"role": "user", "content": PROMPT}])
    assert chat_row == _rendered(tokenizer, CHAT_ROW) and turns == ["safety"]


def test_safety_chat_false_gives_a_chat_model_the_raw_text(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    (plain, chat_row), turns = _asked_ids(tiny_model_dir, False, ROWS)
    assert plain == tokenizer(PROMPT)["input_ids"] and turns == []
    assert chat_row == _rendered(tokenizer, CHAT_ROW)  # a list of messages is a conversation either way


def test_a_model_without_a_template_gets_the_raw_text(plain_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(plain_model_dir)
    assert not tokenizer.chat_template
    (plain,), turns = _asked_ids(plain_model_dir, "auto", ROWS[:1])
    assert plain == tokenizer(PROMPT)["input_ids"] and turns == []
    assert as_asked([PROMPT], "auto", tokenizer, "safety.chat") == ([PROMPT], False)


def test_chat_true_without_a_template_names_the_setting(plain_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(plain_model_dir)
    with pytest.raises(UserError, match=r"safety\.chat=true: .* has no chat template"):
        asks_in_turn(True, tokenizer, "safety.chat")
    assert asks_in_turn(False, tokenizer, "safety.chat") is False


@pytest.mark.parametrize(
    "value, parsed", [("auto", "auto"), ("true", True), ("no", False), ("False", False), (True, True)]
)
def test_chat_settings_read_auto_and_booleans(value, parsed):
    from trainer_lib.config import load_config
    from trainer_lib.errors import ConfigError
    from trainer_lib.stages.lifecycle.evaluate import EvaluateConfig

    base = {"models": ["m=/m"], "output_dir": "/o", "humaneval": {"enabled": True}}
    for key in ("safety", "tasks", "math", "humaneval"):
        cfg = load_config(EvaluateConfig, [base, {key: {"chat": value}}])
        assert getattr(cfg, key).chat == parsed
    assert load_config(EvaluateConfig, [base]).humaneval.chat is False  # HumanEval completes the prompt by default
    assert load_config(EvaluateConfig, [base]).safety.chat == "auto"
    with pytest.raises(ConfigError, match=r"safety\.chat"):
        load_config(EvaluateConfig, [base], ["safety.chat=sometimes"])
