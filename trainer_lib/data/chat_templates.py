"""``model.chat_template``: a chat template for base models that have none, or to replace a model's own.

The value is one of

* a built-in name: ``chatml`` (``<|im_start|>role ... <|im_end|>``, Qwen's and many fine-tunes'
  format), ``llama3`` (``<|start_header_id|>role<|end_header_id|> ... <|eot_id|>``), or ``zephyr``
  (``<|role|>`` tags, every turn closed by the tokenizer's own eos, so it fits any tokenizer);
* Jinja text (anything with ``{{`` or ``{%``), as in a tokenizer's ``chat_template``;
* the path (local or URL) of a Jinja file, like TRL's ``chat_template_path``.

A built-in whose turns end with a token of its own (``<|im_end|>``, ``<|eot_id|>``) makes that token
the tokenizer's eos, so generation stops where the template ends a turn; it needs its special tokens
in the tokenizer's vocabulary (no embedding is added here). The template is saved with the trained
model, so later stages and users load it with the tokenizer. Pure Python; nothing heavy is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainer_lib.errors import ConfigError, UserError


@dataclass(frozen=True)
class BuiltinTemplate:
    jinja: str
    tokens: tuple[str, ...] = ()  # special tokens it writes, which the vocabulary must have
    end_of_turn: str | None = None  # the token that closes a turn: the tokenizer's eos with this template


BUILTINS: dict[str, BuiltinTemplate] = {
    "chatml": BuiltinTemplate(
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        ("<|im_start|>", "<|im_end|>"),
        "<|im_end|>",
    ),
    "llama3": BuiltinTemplate(
        "{{ bos_token }}"
        "{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
        " + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|eot_id|>",
    ),
    "zephyr": BuiltinTemplate(
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    ),
}


def is_jinja(value: str) -> bool:
    return "{{" in value or "{%" in value


def check(value: str, key: str = "model.chat_template") -> None:
    """A ConfigError unless ``value`` is empty, a built-in name, Jinja text, a URL or an existing file."""
    if not value or value in BUILTINS or is_jinja(value) or "://" in value:
        return
    if not os.path.isfile(os.path.expanduser(value)):
        raise ConfigError(
            f"{key}: {value!r} is neither a built-in template ({', '.join(BUILTINS)}), Jinja text, "
            f"nor an existing Jinja file"
        )


def _text(value: str, key: str) -> str:
    if is_jinja(value):
        return value
    from trainer_lib import storage

    try:
        return storage.read_text(value)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{key}: could not read the template file {value}: {exc}") from None


def apply(tokenizer, value: str, source: str = "", key: str = "model.chat_template") -> None:
    """Give ``tokenizer`` the chat template ``value`` (replacing its own); ``source`` names the tokenizer
    in errors."""
    builtin = BUILTINS.get(value)
    if builtin is None:
        tokenizer.chat_template = _text(value, key)
        return
    vocab = tokenizer.get_vocab()
    missing = [t for t in builtin.tokens if t not in vocab]
    if missing:
        raise UserError(
            f"{key}: {value} writes the special tokens {', '.join(missing)}, which the tokenizer of "
            f"{source or 'this model'} does not have; use zephyr (any tokenizer) or a Jinja file"
        )
    if builtin.end_of_turn is None and tokenizer.eos_token is None:
        raise UserError(
            f"{key}: {value} closes every turn with the tokenizer's eos, but the tokenizer of "
            f"{source or 'this model'} has none"
        )
    tokenizer.chat_template = builtin.jinja
    if builtin.end_of_turn:
        tokenizer.eos_token = builtin.end_of_turn
