"""Code tasks from the families: a prompt, a reference solution, executed unit tests and a verified
buggy variant each; the seeded split into training, held-out and RL tasks; and the SFT teacher's mistakes.

Split rule: a code task's key is ``task_id = family:params``. Held-out tasks are whole keys drawn (by
seed) from families with >= 20 keys, at most 15% per family, so every held-out task is an unseen
combination of a family and constants that both occur in training. RL tasks are drawn the same way from
what is left: new to SFT, from the held-out tasks' distribution, never held-out tasks themselves.

The SFT teacher: with ``teacher_mistakes``, the demonstrations of the TEACHER_MISTAKES families (and the
chosen answers of their preference pairs) carry a consistent mistake that only the unit tests catch,
which is what RL with an execution reward has to add.

Reference solutions are only ever produced by this module and are exec'd here to compute test
expectations; never exec untrusted model output this way.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import NamedTuple

from trainer_lib.demo.code_families import FAMILIES, SIGNATURES, WORDS, Family, number_word


class CodeTasks(NamedTuple):
    """The code tasks of one dataset, disjoint by ``task_id``: dicts of :func:`make_task` (``task_id``, ``family``,
    ``entry_point``, ``prompt``, ``solution``, ``tests``, ``rejected``)."""

    train: list[dict]  # SFT's tasks, each with the teacher's demonstration ("demo")
    held_out: list[dict]  # evaluation only
    own_rl: list[dict]  # RL's tasks of their own (none: RL trains on the SFT tasks)

    @property
    def rl(self) -> list[dict]:
        return self.own_rl or self.train


def build_code_tasks(seed: int, n_train: int, n_eval: int, n_rl: int = 0, teacher_mistakes: float = 0.0) -> CodeTasks:
    """The tasks of :func:`split_code_keys`, built and verified; ``teacher_mistakes`` of the demonstrations of
    the TEACHER_MISTAKES families carry the teacher's mistake."""
    train_keys, eval_keys, rl_keys = split_code_keys(seed, n_train, n_eval, n_rl)
    train, held_out, own_rl = ([make_task(f, p, seed) for f, p in keys] for keys in (train_keys, eval_keys, rl_keys))
    for task in train:
        _add_teacher_demo(task, teacher_mistakes, seed)
    return CodeTasks(train, held_out, own_rl)


_TEMPLATES = (
    "Write a Python function `{sig}` that {spec}.",
    "Implement a Python function `{sig}` that {spec}.",
    "Define a Python function `{sig}` that {spec}.",
)


def _fill(tpl, params: tuple) -> str:
    """A family's template filled in with one parameter tuple."""
    if callable(tpl):
        return tpl(*params)
    return tpl.format(*params, w=[number_word(p) if isinstance(p, int) else p for p in params])


def _inputs(rng: random.Random, arg: str, params: tuple) -> list[tuple]:
    """Four distinct argument tuples. An int parameter is one of the x inputs and a letter parameter occurs in
    two of the strings, so the tests reach both branches of a comparison with it."""
    if arg == "x":
        xs = rng.sample(range(-5, 21), 4)
        k = next((p for p in params if isinstance(p, int)), None)
        if k is not None and k not in xs:
            xs[0] = k
        return [(x,) for x in xs]
    if arg == "n":
        return [(n,) for n in [0, 1] + rng.sample(range(2, 13), 2)]
    if arg == "s":
        words = rng.sample(WORDS + ["apple", "banana", "hello", "level", "pizza"], 4)
        c = next((p for p in params if isinstance(p, str) and len(p) == 1), None)
        if c is not None:
            words[:2] = [c + words[0], words[1] + c + c]
        return [(x,) for x in words]
    if arg == "xs":
        return [([rng.randint(0, 12) for _ in range(rng.randint(1 + i, 3 + i))],) for i in range(4)]
    return [tuple(rng.sample(range(-3, 13), 2)) for _ in range(4)]


def _passes(code: str, tests: list[str]) -> bool:
    """Run trusted generated code against its asserts in a fresh namespace."""
    ns: dict = {}
    try:
        exec(code, ns)
        for t in tests:
            exec(t, ns)
    except Exception:
        return False
    return True


def make_task(fam: Family, params: tuple, seed: int) -> dict:
    """Build one verified task; its content depends only on (seed, family, params)."""
    task_id = f"{fam.name}:" + ",".join(str(p) for p in params)
    rng = random.Random(f"{seed}:{task_id}")
    entry = _fill(fam.entry, params)
    solution = f"def {entry}({SIGNATURES[fam.arg]}):\n    {_fill(fam.body, params)}"
    ns: dict = {}
    exec(solution, ns)
    tests = [
        f"assert {entry}({', '.join(map(repr, args))}) == {ns[entry](*args)!r}"
        for args in _inputs(rng, fam.arg, params)
    ]
    if not _passes(solution, tests):
        raise RuntimeError(f"reference fails its tests: {task_id}")
    prompt = rng.choice(_TEMPLATES).format(sig=f"{entry}({SIGNATURES[fam.arg]})", spec=_fill(fam.spec, params))
    return {
        "task_id": task_id,
        "family": fam.name,
        "entry_point": entry,
        "prompt": prompt,
        "solution": solution,
        "tests": tests,
        "rejected": _buggy(rng, solution, tests),
    }


# The one-site edits a buggy variant is drawn from: (pattern, replacement) in a solution's body.
_MUTATIONS = [
    (r"(?<![\w.])\d+(?![\w.])", lambda m: str(int(m.group()) + 1)),
    (r"(?<![\w.])[1-9]\d*(?![\w.])", lambda m: str(int(m.group()) - 1)),
    (r" \+ ", " - "),
    (r" - ", " + "),
    (r" \* ", " + "),
    (r" > ", " < "),
    (r" < ", " > "),
    (r" > ", " >= "),
    (r" < ", " <= "),
    (r" == ", " != "),
    (r"\+=", "-="),
    (r"\*=", "+="),
    (r"\bmax\(", "min("),
    (r"\bmin\(", "max("),
    (r"\.upper\(\)", ".lower()"),
    (r"\.lower\(\)", ".upper()"),
    (r"\[::-1\]", "[1:]"),
    (r"startswith", "endswith"),
    (r"\[0\]", "[-1]"),
    (r"\[-1\]", "[0]"),
    (r"s \+ s", "s"),
    (r"\bsum\(xs\)", "len(xs)"),
    (r"'([a-z])'", lambda m: f"'{chr((ord(m.group(1)) - 96) % 26 + 97)}'"),  # next letter
    (r"('\w+') \+ s", r"s + \1"),
    (r"s \+ ('\w+')", r"\1 + s"),
    (r"\blen\((\w+)\)", r"len(\1) - 1"),
]


def _buggy(rng: random.Random, solution: str, tests: list[str]) -> str:
    """A single plausible mutation (off-by-one constant, wrong operator, ...) that fails a test."""
    head, body = solution.split("\n", 1)
    cands = [
        body[: m.start()] + (rep(m) if callable(rep) else m.expand(rep)) + body[m.end() :]
        for pat, rep in _MUTATIONS
        for m in re.finditer(pat, body)
    ]
    rng.shuffle(cands)
    for cand in cands + ["    return None"]:
        code = f"{head}\n{cand}"
        if cand != body and not _passes(code, tests):
            return code
    raise RuntimeError(f"no failing mutation for {solution!r}")


# Held-out and RL keys come only from families with at least this many keys, at most this share of each.
_EVAL_MIN_KEYS, _EVAL_MAX_FRACTION = 20, 0.15


def split_code_keys(seed: int, n_train: int, n_eval: int, n_rl: int = 0) -> tuple[list, list, list]:
    """``(train, eval, rl)`` keys, disjoint. Round-robin over seeded-shuffled families; eval keys, then
    RL keys, only from large families (<= 15% of each family's keys per split), so the RL prompts come
    from the distribution the held-out tasks come from."""
    rng = random.Random(f"{seed}:code-split")
    pools = {}
    for fam in FAMILIES:
        keys = list(fam.params)
        rng.shuffle(keys)
        pools[fam.name] = (fam, keys)
    caps = {n: int(len(k) * _EVAL_MAX_FRACTION) if len(k) >= _EVAL_MIN_KEYS else 0 for n, (_, k) in pools.items()}

    def take(n, cap):
        order = sorted(pools)
        rng.shuffle(order)
        got, used = [], Counter()
        while len(got) < n:
            live = [f for f in order if used[f] < min(cap(f), len(pools[f][1]))]
            if not live:
                raise ValueError(f"asked for {n} code tasks but only {len(got)} are available")
            for f in live[: n - len(got)]:
                got.append((pools[f][0], pools[f][1][used[f]]))
                used[f] += 1
        for f, k in used.items():
            del pools[f][1][:k]
        return got

    held = take(n_eval, lambda f: caps[f])
    rl = take(n_rl, lambda f: caps[f]) if n_rl else []
    return take(n_train, lambda f: len(pools[f][1])), held, rl


#: The demo's SFT "teacher" and its blind spots: on these families it writes a plausible, consistent mistake
#: (family -> (pattern, replacement, what it gets wrong)), the way distilled or crowd-written demonstrations
#: inherit their author's habits. With ``teacher_mistakes`` > 0.5 of such demonstrations wrong, SFT imitates the
#: mistake; only the unit tests (RL's code_execution reward) tell it apart from the right answer.
TEACHER_MISTAKES = {
    "add_mul": (r"\((x \+ \d+)\) \* (\d+)", r"\1 * \2", "drops the parentheses of (x + a) * b"),
    "sub_mul": (r"\((x - \d+)\) \* (\d+)", r"\1 * \2", "drops the parentheses of (x - a) * b"),
    "shift": (r" > ", " >= ", "writes >= for 'greater than'"),
    "pick": (r" ([<>]) ", r" \1= ", "writes >= / <= for 'greater / less than'"),
    "list_cond": (r" ([<>]) ", r" \1= ", "writes >= / <= for 'greater / less than'"),
    "distance": (r"abs\((x - \d+)\)", r"\1", "forgets abs() in the distance"),
}


def teacher_answer(task: dict, rate: float, seed: int) -> str:
    """The demonstration the SFT data holds for ``task``: on a TEACHER_MISTAKES family, with probability
    ``rate`` (a pure function of seed and task), the teacher's mistake (a habit: written whether or not this
    task's tests would catch it); otherwise the reference solution."""
    rule = TEACHER_MISTAKES.get(task["family"])
    if rule is None or rate <= 0 or random.Random(f"{seed}:teacher:{task['task_id']}").random() >= rate:
        return task["solution"]
    return re.sub(rule[0], rule[1], task["solution"], count=1)


def _add_teacher_demo(task: dict, rate: float, seed: int) -> None:
    """Give a training ``task`` the demonstration the teacher wrote for it (``task["demo"]``, see
    :func:`teacher_answer`). When that demonstration is wrong, the task's rejected answer becomes a failing
    mutation of it: the mutation of the reference drawn before could be the very same mistake."""
    task["demo"] = teacher_answer(task, rate, seed)
    if task["demo"] != task["solution"]:
        rng = random.Random(f"{seed}:teacher-pair:{task['task_id']}")
        task["rejected"] = _buggy(rng, task["demo"], task["tests"])
