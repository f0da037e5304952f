"""How a plain-string prompt of an eval set reaches a model: as a user turn, or as raw text.

Every eval set has a ``chat`` setting (``safety.chat``, ``tasks.chat``, ``math.chat``,
``humaneval.chat``): ``true`` asks each plain prompt as one user turn, rendered by the model's chat
template with the generation prompt (the assistant's turn opened); ``false`` gives the model the text
itself; ``auto`` decides per model: a user turn when its tokenizer has a chat template, raw text
when it has none. Prompts that are already a list of messages go through the template as they are.
"""

from __future__ import annotations

from typing import Literal

from trainer_lib.errors import UserError

#: The type of a set's ``chat`` setting: true, false (any spelling the config reads as one) or auto.
ChatMode = bool | Literal["auto"]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def asks_in_turn(chat: ChatMode, tokenizer, key: str) -> bool:
    """Whether this model gets plain prompts as a user turn: ``chat`` as set, or (``auto``) whether its
    tokenizer has a chat template. ``true`` without a template is a UserError naming ``key``."""
    if chat == "auto":
        return has_chat_template(tokenizer)
    if chat and not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or "this model"
        raise UserError(
            f"{key}=true: {name} has no chat template to render a user turn with; "
            f"set {key}=auto (raw text for such a model) or false"
        )
    return bool(chat)


def user_turns(prompts: list) -> list:
    """Each plain-string prompt as one user turn; message lists as they are."""
    return [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]


def as_asked(prompts: list, chat: ChatMode, tokenizer, key: str) -> tuple[list, bool]:
    """(the prompts as this model is asked them, whether plain prompts became user turns)."""
    in_turn = asks_in_turn(chat, tokenizer, key)
    return (user_turns(prompts) if in_turn else list(prompts)), in_turn
