"""Arithmetic word problems with a checkable answer: the RL task of the real-model recipe (examples/real/).

A small model can learn these, unlike GSM8K: SmolLM2-135M-Instruct answers about a quarter of them right
greedily, and a few more each time it samples. Every problem is one short story of one or two steps
(add, take away, multiply, share out) with whole numbers, asked with the same answer instruction the
evaluation uses, so a gain is not only a learned answer format.

    python -m trainer_lib.demo.arithmetic OUT_DIR --train 4000 --held-out 300 --seed 0

writes ``train.jsonl`` and ``held_out.jsonl`` (no question in both), rows
``{"prompt": [user turn], "solution": "42", "family": "add", "question": "..."}``: the conversational
``prompt_only`` format with the ``solution`` column that ``accuracy_reward`` and ``posttrain evaluate``'s
``math.path`` read.
"""

from __future__ import annotations

import argparse
import json
import os
import random

from trainer_lib import storage

#: the answer instruction after every question; ``posttrain evaluate math.template`` can add it to others.
INSTRUCTION = "Give the final answer as a number on the last line."
NAMES = ("Tom", "Anna", "Lee", "Maria", "Sam", "Omar", "Priya", "Ken", "Lucy", "Ravi")
THINGS = ("apples", "books", "coins", "pencils", "stickers", "cards", "marbles", "shells", "stamps", "eggs")


def _add(rng: random.Random, who: str, what: str) -> tuple[str, int]:
    a, b = rng.randint(5, 60), rng.randint(2, 40)
    return f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?", a + b


def _take(rng: random.Random, who: str, what: str) -> tuple[str, int]:
    a = rng.randint(12, 90)
    b = rng.randint(2, a - 1)
    return f"{who} has {a} {what} and gives {b} of them to a friend. How many {what} are left?", a - b


def _times(rng: random.Random, who: str, what: str) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return f"{who} buys {a} bags with {b} {what} in each bag. How many {what} does {who} buy?", a * b


def _share(rng: random.Random, who: str, what: str) -> tuple[str, int]:
    groups, each = rng.randint(2, 9), rng.randint(2, 12)
    question = f"{who} shares {groups * each} {what} equally among {groups} friends."
    question += f" How many {what} does each friend get?"
    return question, each


def _two_steps(rng: random.Random, who: str, what: str) -> tuple[str, int]:
    a, b = rng.randint(10, 50), rng.randint(2, 30)
    c = rng.randint(2, a + b - 1)
    return f"{who} has {a} {what}, finds {b} more, then loses {c}. How many {what} does {who} have now?", a + b - c


#: the problem families by name: each draws (question, answer) for a person and a thing.
FAMILIES = {"add": _add, "take": _take, "times": _times, "share": _share, "two_steps": _two_steps}


def problem(rng: random.Random, family: str) -> dict:
    """One row of ``family``: the question in a user turn with :data:`INSTRUCTION`, and its answer."""
    question, answer = FAMILIES[family](rng, rng.choice(NAMES), rng.choice(THINGS))
    turn = {"role": "user", "content": f"{question}\n{INSTRUCTION}"}
    return {"prompt": [turn], "solution": str(answer), "family": family, "question": question}


def problems(seed: int, train: int, held_out: int) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows), families in turn; the held-out questions are drawn first and no
    training row repeats one of them."""
    rng = random.Random(f"arithmetic:{seed}")
    families = list(FAMILIES)
    held, seen = [], set()
    while len(held) < held_out:
        row = problem(rng, families[len(held) % len(families)])
        if row["question"] not in seen:
            seen.add(row["question"])
            held.append(row)
    rows = []
    while len(rows) < train:
        row = problem(rng, families[len(rows) % len(families)])
        if row["question"] not in seen:
            rows.append(row)
    return rows, held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=4000, help="training problems")
    parser.add_argument("--held-out", type=int, default=300, help="held-out problems, none asked in training")
    parser.add_argument("--seed", type=int, default=0, help="which problems (the data's seed, not the run's)")
    args = parser.parse_args(argv)
    if args.train < 1 or args.held_out < 1:
        parser.error("--train and --held-out must be >= 1")
    train, held = problems(args.seed, args.train, args.held_out)
    for name, rows in (("train.jsonl", train), ("held_out.jsonl", held)):  # each whole or not at all
        storage.write_text(os.path.join(args.out_dir, name), "".join(json.dumps(row) + "\n" for row in rows))
    print(f"{args.out_dir}: {len(train)} training and {len(held)} held-out problems")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
