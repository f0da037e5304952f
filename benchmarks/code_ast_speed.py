"""Throughput of the ``code_ast`` reward: 10,000 distinct completions scored in one call.

    python -m benchmarks.code_ast_speed [--count 10000] [--rounds 3] [--json OUT]

The completions look like a code-RL batch: a fenced or bare function of a few lines, with the
row's ``entry_point`` and ``tests`` columns; one in eight has a syntax error, one in sixteen a
forbidden import, one in sixteen the wrong arity. Every completion is distinct; groups of 8 share
a row (``entry_point``, ``tests``), as a GRPO group shares its prompt, so the parsed tests are
cached as they would be in training; the cache is cleared before each round. Prints the best of
``--rounds`` wall-clock times and completions per second.
"""

from __future__ import annotations

import argparse
import json
import random
import time


def completions(count: int, seed: int = 0) -> tuple[list[str], list[list[str]], list[str]]:
    """``(completions, tests, entry points)``; groups of 8 completions share a row."""
    rng = random.Random(seed)
    texts, tests, entries = [], [], []
    for i in range(count):
        name = f"task_{i // 8}"
        a, b = 1 + (i // 8) % 97, 1 + (i // 8) % 89  # the group's task
        body = [
            f"def {name}(x{', y' if i % 16 == 5 else ''}):",
            f"    total = x * {a} + {b}",
            "    for k in range(3):",
            f"        if total > {rng.randint(1, 10_000)}:",  # each completion differs
            "            total -= k",
            "    return total",
        ]
        if i % 16 == 3:
            body.insert(0, "import subprocess")
        if i % 8 == 7:
            body[1] = body[1].replace("+", "+ (")  # unbalanced: a syntax error
        code = "\n".join(body)
        texts.append(f"Here is the function:\n```python\n{code}\n```\n" if i % 2 else code)
        tests.append([f"assert {name}({a}) == {a * a + b}", f"assert {name}(0) == {b}"])
        entries.append(name)
    return texts, tests, entries


def main(argv: list[str] | None = None) -> dict:
    from trainer_lib.rewards.functions import code_ast
    from trainer_lib.rewards.syntax_tree import expected_calls

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    texts, tests, entries = completions(args.count)
    prompts = ["q"] * len(texts)
    times = []
    for _ in range(args.rounds):
        expected_calls.cache_clear()  # each round parses the rows' tests again
        start = time.perf_counter()
        rewards = code_ast(prompts, texts, tests=tests, entry_point=entries)
        times.append(time.perf_counter() - start)
    best = min(times)
    result = {
        "completions": len(texts),
        "seconds": round(best, 3),
        "completions_per_s": round(len(texts) / best),
        "mean_reward": round(sum(rewards) / len(rewards), 4),
        "rounds": [round(t, 3) for t in times],
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
