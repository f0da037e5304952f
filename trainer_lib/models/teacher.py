"""A distillation teacher: any causal LM with the student's tokenizer, loaded frozen.

The teacher scores the student's tokens by id, so the two tokenizers must be the same: the same
vocabulary (token -> id) and the same special tokens. :func:`tokenizer_fingerprint` hashes both;
:func:`check_same_tokenizer` refuses a teacher whose hash differs, saying what differs (the vocabulary's
size, the first token whose id differs, or the special tokens). The teacher may be larger than the
student, in another precision, or partitioned by ZeRO-3 as a reference model is (the caller's
``strategy.prepare_frozen``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from trainer_lib.config import ModelConfig
from trainer_lib.errors import UserError


def special_tokens(tokenizer) -> dict[str, int | None]:
    """Every special token's text -> id, and the ids of bos/eos/pad/unk by role."""
    tokens = {str(token): tokenizer.convert_tokens_to_ids(token) for token in tokenizer.all_special_tokens}
    for role in ("bos", "eos", "pad", "unk"):
        tokens[f"<{role}_token_id>"] = getattr(tokenizer, f"{role}_token_id", None)
    return tokens


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the vocabulary (token -> id, added tokens included) and the special tokens."""
    payload = {"vocab": sorted(tokenizer.get_vocab().items()), "special": sorted(special_tokens(tokenizer).items())}
    return hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()


def tokenizer_difference(student, teacher) -> str | None:
    """What differs between two tokenizers, in a few words; None if their fingerprints agree."""
    if tokenizer_fingerprint(student) == tokenizer_fingerprint(teacher):
        return None
    vocab, other = student.get_vocab(), teacher.get_vocab()
    if len(vocab) != len(other):
        return f"vocabulary of {len(other)} tokens, the student's has {len(vocab)}"
    by_id, other_by_id = {i: t for t, i in vocab.items()}, {i: t for t, i in other.items()}
    for index in sorted(set(by_id) | set(other_by_id)):
        if by_id.get(index) != other_by_id.get(index):
            return f"token id {index} is {other_by_id.get(index)!r}, the student's is {by_id.get(index)!r}"
    ours, theirs = special_tokens(student), special_tokens(teacher)
    differing = sorted(key for key in set(ours) | set(theirs) if ours.get(key) != theirs.get(key))
    return f"special tokens differ: {', '.join(differing)}"


def check_same_tokenizer(student, teacher, key: str = "teacher.path") -> None:
    """Raise a one-line :class:`UserError` naming ``key`` unless the two tokenizers are the same."""
    difference = tokenizer_difference(student, teacher)
    if difference is not None:
        raise UserError(
            f"{key}: the teacher's tokenizer differs from the student's ({difference}); distillation compares "
            "the models token by token and needs the same tokenizer"
        )


def load_teacher(student_cfg: ModelConfig, student_tokenizer, path: str, revision: str, precision: str, placement):
    """The teacher at ``path`` as an eval-mode causal LM in ``precision``, after its tokenizer was checked
    against ``student_tokenizer`` (before any weights load). It is loaded as the student is (attention,
    remote code, ``chunked_lm_head``), with its own tokenizer files."""
    from trainer_lib.models.load import load_causal_lm, load_tokenizer

    teacher_cfg = dataclasses.replace(student_cfg, path=path, revision=revision, tokenizer_path=None)
    check_same_tokenizer(student_tokenizer, load_tokenizer(teacher_cfg))
    model = load_causal_lm(teacher_cfg, precision, placement=placement, key="teacher.path")
    model.eval()
    return model
