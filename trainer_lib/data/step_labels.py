"""Step-labelled solutions for process reward models: rows, where steps end, their tokens, and a set built
from GSM8K's worked solutions.

A row is TRL's stepwise-supervision form (Math-Shepherd and PRM800K come to it)::

    {"prompt": "question" or [messages], "completions": ["step 1", "step 2", ...], "labels": [true, false, ...]}

``labels`` holds one label per step, true for a correct step (or a number in [0, 1], Math-Shepherd's soft
estimate). The steps of a generated text are found with a separator pattern (:data:`STEP_SEPARATOR`:
blank lines, or a new line starting ``Step k:``); a PRM reads each step's score at the step's last token.

:func:`gsm8k_step_rows` makes such rows from GSM8K's answers: each line of a worked solution is a step
(the ``#### N`` line too); a second copy of the solution has one ``<<a*b=c>>`` calculation corrupted, so
that step and every later one are labelled wrong. Problems go whole to train or eval (by a hash of the
question), so no held-out problem was seen in training.
"""

from __future__ import annotations

import hashlib
import json
import random
import re

from trainer_lib.errors import DataError

#: Where one step of a generated text ends and the next begins: a blank line, or a line break before
#: ``Step k:``.
STEP_SEPARATOR = r"\n[ \t]*\n\s*|\n(?=[ \t]*Step \d+:)"
#: What the training text puts between a prompt's text and the first step, and between steps; it matches
#: STEP_SEPARATOR, so a PRM trained on given steps finds them again in generated text.
STEP_JOIN = "\n\n"

#: The file beside a trained PRM that records its step settings (``step_separator``, ``step_join``).
PRM_FILE = "prm.json"

#: GSM8K's calculator annotation ``<<expression=result>>`` and the result written right after it.
CALCULATION = re.compile(r"<<([^<>=]+)=(-?[0-9]+(?:\.[0-9]+)?)>>(-?[0-9]+(?:\.[0-9]+)?)?")


def split_steps(text: str, separator: str = STEP_SEPARATOR) -> list[str]:
    """The non-empty steps of ``text``, split at ``separator`` (a regular expression)."""
    return [step.strip() for step in re.split(separator, text) if step.strip()]


def held_out(problem: str, eval_fraction: float) -> bool:
    """Whether a problem (its prompt as text) goes to eval: a hash of it below ``eval_fraction``, so every
    row of a problem lands on the same side, in every run."""
    return int(hashlib.sha256(problem.encode()).hexdigest()[:8], 16) / 16**8 < eval_fraction


def check_row(location: str, row: dict) -> dict:
    """A step-labelled row as ``{"prompt", "completions", "labels"}`` (labels as floats), or a DataError."""
    prompt, steps, labels = row.get("prompt"), row.get("completions"), row.get("labels")
    if not (isinstance(prompt, str) and prompt.strip()) and not isinstance(prompt, list):
        raise DataError(location, "prompt", "a non-empty string or a list of messages", prompt)
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise DataError(location, "completions", "a non-empty list of step strings", steps)
    if not isinstance(labels, list) or len(labels) != len(steps):
        raise DataError(location, "labels", f"a list of {len(steps)} labels, one per step", labels)
    values = []
    for label in labels:
        if isinstance(label, bool) or (isinstance(label, (int, float)) and 0 <= label <= 1):
            values.append(float(label))
        else:
            raise DataError(location, "labels", "true/false or numbers in [0, 1]", labels)
    return {"prompt": prompt, "completions": steps, "labels": values}


def encode_steps(tokenizer, prompt, steps: list[str], max_length: int, join: str = STEP_JOIN):
    """``(input_ids, step_ends)``: the prompt, then each step followed by ``join``, tokenized a piece at a
    time (so a step's tokens are the same wherever it stands), and the index of each step's last token.
    Steps that do not fit in ``max_length`` tokens are left out; so is a prompt that leaves no room."""
    from trainer_lib.data.preference_batches import encode_prompt

    if isinstance(prompt, list):  # a conversation: its chat template, up to the assistant's turn
        ids = list(encode_prompt(tokenizer, prompt))
    else:
        ids = list(tokenizer(prompt + join)["input_ids"])
    joiner = tokenizer(join, add_special_tokens=False)["input_ids"]
    ends = []
    for step in steps:
        step_ids = tokenizer(step, add_special_tokens=False)["input_ids"]
        if not step_ids or len(ids) + len(step_ids) > max_length:
            break
        ids += step_ids
        ends.append(len(ids) - 1)
        ids += joiner
    return ids[:max_length], ends


def collate_steps(examples: list[dict], pad_id: int) -> dict:
    """Examples ``{"input_ids", "step_ends"[, "step_labels"]}`` as right-padded ``input_ids`` and
    ``attention_mask``, and ``step_mask`` / ``step_labels`` in token layout (1 and the label at each step's
    last token, 0 elsewhere), all ``(B, T)``."""
    import torch

    width = max(len(e["input_ids"]) for e in examples)
    shape = (len(examples), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    step_mask, step_labels = torch.zeros(shape), torch.zeros(shape)
    for i, example in enumerate(examples):
        n = len(example["input_ids"])
        input_ids[i, :n] = torch.tensor(example["input_ids"], dtype=torch.long)
        attention[i, :n] = 1
        if example["step_ends"]:
            ends = torch.tensor(example["step_ends"], dtype=torch.long)
            step_mask[i, ends] = 1.0
            if "step_labels" in example:
                step_labels[i, ends] = torch.tensor(example["step_labels"], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention, "step_mask": step_mask, "step_labels": step_labels}


# --------------------------------------------------------------------------- GSM8K -> step labels


def corrupt_calculation(line: str, rng: random.Random) -> str | None:
    """``line`` with one ``<<expr=c>>`` result (and the copy written after it) changed to a wrong value,
    or None when the line has no calculation."""
    found = list(CALCULATION.finditer(line))
    if not found:
        return None
    match = rng.choice(found)
    value = match.group(2)
    wrong = _wrong_value(value, rng)
    shown = wrong if match.group(3) is not None else ""
    return line[: match.start()] + f"<<{match.group(1)}={wrong}>>{shown}" + line[match.end() :]


def _wrong_value(value: str, rng: random.Random) -> str:
    """A plausible wrong result: off by a small amount or by a factor, written like ``value``."""
    number = float(value)
    candidates = [number + d for d in (-10, -2, -1, 1, 2, 10)] + [number * 2, number / 2 if number else 3.0]
    rng.shuffle(candidates)
    for candidate in candidates:
        if candidate != number and candidate >= 0:
            break
    if "." not in value and candidate == int(candidate):
        return str(int(candidate))
    return f"{candidate:.2f}".rstrip("0").rstrip(".")


def gsm8k_step_rows(rows, eval_fraction: float = 0.1, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``(train rows, eval rows)`` from GSM8K rows (``question``, ``answer``): for each problem whose solution
    has a calculation, its solution with every step correct and a copy with one calculation corrupted (that
    step and every later one labelled false). ``problem`` numbers the source row. A problem is held out
    when a hash of its question falls below ``eval_fraction``."""
    rng = random.Random(seed)
    train, evals = [], []
    for index, row in enumerate(rows):
        steps = [line.strip() for line in str(row["answer"]).split("\n") if line.strip()]
        corruptible = [i for i, step in enumerate(steps) if CALCULATION.search(step)]
        if not corruptible:
            continue
        at = rng.choice(corruptible)
        corrupted = [*steps[:at], corrupt_calculation(steps[at], rng), *steps[at + 1 :]]
        labels = [True] * at + [False] * (len(steps) - at)
        question = str(row["question"])
        target = evals if held_out(question, eval_fraction) else train
        base = {"prompt": question, "problem": index}
        target.append({**base, "completions": steps, "labels": [True] * len(steps)})
        target.append({**base, "completions": corrupted, "labels": labels, "corrupted_step": at})
    return train, evals


def write_gsm8k_step_set(source: str, out_dir: str, limit: int = 0, eval_fraction: float = 0.1, seed: int = 0):
    """Write ``train.jsonl`` and ``eval.jsonl`` of :func:`gsm8k_step_rows` from the GSM8K file ``source`` (the
    first ``limit`` problems; 0: all) into ``out_dir``; returns the two paths."""
    import os

    from trainer_lib.data.sources import iter_source

    rows = []
    for _, row in iter_source(source, key="source"):
        rows.append(row)
        if limit and len(rows) >= limit:
            break
    train, evals = gsm8k_step_rows(rows, eval_fraction, seed)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, part in (("train", train), ("eval", evals)):
        path = os.path.join(out_dir, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in part)
        paths.append(path)
    return tuple(paths)
