"""The code-task families: one row per kind of small Python function the demo asks for.

A :class:`Family` holds a parameter grid and the templates of a function's name, its specification
(the prompt's words) and its body; :mod:`trainer_lib.demo.code_tasks` turns a family and one of its
parameter tuples into a task with a reference solution and unit tests.
"""

from __future__ import annotations

from collections import namedtuple

_NUM = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()
WORDS = "cat dog sun tree code blue red moon star fish bird book lamp rain snow wind fire rock leaf ship".split()
LETTERS = "abcdefghijklmnopqrstuvwxyz"

#: One kind of task. ``arg``: the argument kind, x (int), n (small non-negative int), s (str), xs (list[int])
#: or ab (two ints); ``params``: the grid of parameter tuples; ``entry`` (the function's name), ``spec`` (what it
#: returns, in the prompt's words) and ``body``: format templates, or functions of the parameters.
Family = namedtuple("Family", "name arg params entry spec body")


def number_word(n: int) -> str:
    """Number word used in function names: 7 -> 'seven', 23 -> 'twenty_three'."""
    if n <= 20:
        return _NUM[n]
    tens = {2: "twenty", 3: "thirty"}[n // 10]
    return tens if n % 10 == 0 else f"{tens}_{_NUM[n % 10]}"


def _grid(*axes) -> list[tuple]:
    """Every combination of the axes' values, as parameter tuples."""
    out = [()]
    for axis in axes:
        out = [p + (v,) for p in out for v in axis]
    return out


# Building blocks of the families below: each variant's (name, what it returns, expression).
_STR_METHODS = {
    "upper": ("upper_case", "returns s in upper case", "s.upper()"),
    "lower": ("lower_case", "returns s in lower case", "s.lower()"),
    "reverse": ("reverse", "returns s reversed", "s[::-1]"),
    "length": ("length", "returns the number of characters in s", "len(s)"),
    "first": ("first_char", "returns the first character of s", "s[0]"),
    "last": ("last_char", "returns the last character of s", "s[-1]"),
    "double": ("double", "returns s followed by s", "s + s"),
}
_LIST_STATS = {
    "sum": ("total", "returns the sum of the numbers in xs", "sum(xs)"),
    "max": ("largest", "returns the largest number in xs", "max(xs)"),
    "min": ("smallest", "returns the smallest number in xs", "min(xs)"),
    "len": ("count_items", "returns how many numbers are in xs", "len(xs)"),
    "evens": ("keep_evens", "returns a list of the even numbers in xs", "[v for v in xs if v % 2 == 0]"),
    "odds": ("keep_odds", "returns a list of the odd numbers in xs", "[v for v in xs if v % 2 == 1]"),
}
_AGG = {
    "sum": ("sum", "returns the sum of the numbers in xs that are {} {}", "sum(v for v in xs if v {} {})"),
    "count": ("count", "returns how many numbers in xs are {} {}", "len([v for v in xs if v {} {}])"),
    "keep": ("keep", "returns a list of the numbers in xs that are {} {}", "[v for v in xs if v {} {}]"),
}
_CMP = {">": ("above", "greater than"), "<": ("below", "less than")}
_MAP = {"+": ("add", "plus"), "-": ("subtract", "minus"), "*": ("times", "times")}

FAMILIES = [  # templates: "{0}" = parameter, "{w[0]}" = its number word (str params pass through)
    Family("add", "x", _grid(range(1, 31)), "add_{w[0]}", "returns x plus {0}", "return x + {0}"),
    Family("sub", "x", _grid(range(1, 31)), "subtract_{w[0]}", "returns x minus {0}", "return x - {0}"),
    Family("mul", "x", _grid(range(2, 13)), "times_{w[0]}", "returns x times {0}", "return x * {0}"),
    Family(
        "mul_add",
        "x",
        _grid(range(2, 10), range(1, 21)),
        "times_{w[0]}_plus_{w[1]}",
        "returns x times {0} plus {1}",
        "return x * {0} + {1}",
    ),
    Family(
        "mul_sub",
        "x",
        _grid(range(2, 10), range(1, 21)),
        "times_{w[0]}_minus_{w[1]}",
        "returns x times {0} minus {1}",
        "return x * {0} - {1}",
    ),
    Family(
        "add_mul",
        "x",
        _grid(range(1, 21), range(2, 10)),
        "plus_{w[0]}_times_{w[1]}",
        "returns x plus {0}, all times {1}",
        "return (x + {0}) * {1}",
    ),
    Family(
        "sub_mul",
        "x",
        _grid(range(1, 21), range(2, 10)),
        "minus_{w[0]}_times_{w[1]}",
        "returns x minus {0}, all times {1}",
        "return (x - {0}) * {1}",
    ),
    Family(
        "mod", "x", _grid(range(2, 13)), "mod_{w[0]}", "returns the remainder of x divided by {0}", "return x % {0}"
    ),
    Family(
        "divisible",
        "x",
        _grid(range(2, 13)),
        "divisible_by_{w[0]}",
        "returns True if x is divisible by {0}, otherwise False",
        "return x % {0} == 0",
    ),
    Family(
        "pick",
        "x",
        [p for p in _grid(range(0, 10), _CMP, range(0, 10), range(0, 10)) if p[2] != p[3]],
        lambda k, op, a, b: f"pick_{_CMP[op][0]}_{number_word(k)}",
        lambda k, op, a, b: f"returns {a} if x is {_CMP[op][1]} {k}, otherwise {b}",
        "return {2} if x {1} {0} else {3}",
    ),
    Family(
        "shift",
        "x",
        _grid(range(0, 10), range(1, 10), range(1, 10)),
        "shift_around_{w[0]}",
        "returns x plus {1} if x is greater than {0}, otherwise x minus {2}",
        "return x + {1} if x > {0} else x - {2}",
    ),
    Family("cap", "x", _grid(range(0, 21)), "cap_at_{w[0]}", "returns the smaller of x and {0}", "return min(x, {0})"),
    Family(
        "floor", "x", _grid(range(0, 21)), "floor_at_{w[0]}", "returns the larger of x and {0}", "return max(x, {0})"
    ),
    Family(
        "distance",
        "x",
        _grid(range(1, 21)),
        "distance_to_{w[0]}",
        "returns the distance between x and {0}",
        "return abs(x - {0})",
    ),
    Family(
        "loop_sum",
        "n",
        _grid(range(1, 10), range(0, 10)),
        "sum_times_{w[0]}_from_{w[1]}",
        "starts a total at {1}, adds i times {0} for each i in range(n), and returns the total",
        "total = {1}\n    for i in range(n):\n        total += i * {0}\n    return total",
    ),
    Family(
        "loop_prod",
        "n",
        _grid(range(2, 6), range(1, 10)),
        "grow_{w[1]}_by_{w[0]}",
        "starts a result at {1}, multiplies it by {0} n times, and returns the result",
        "result = {1}\n    for i in range(n):\n        result *= {0}\n    return result",
    ),
    Family(
        "loop_count",
        "n",
        [(k, r) for k in range(2, 10) for r in range(k)],
        "count_mod_{w[0]}_is_{w[1]}",
        "returns how many i in range(n) have remainder {1} when divided by {0}",
        "count = 0\n    for i in range(n):\n        if i % {0} == {1}:\n            count += 1\n    return count",
    ),
    Family(
        "str_method",
        "s",
        _grid(_STR_METHODS),
        lambda m: _STR_METHODS[m][0],
        lambda m: _STR_METHODS[m][1],
        lambda m: f"return {_STR_METHODS[m][2]}",
    ),
    Family("repeat", "s", _grid(range(2, 10)), "repeat_{w[0]}", "returns s repeated {0} times", "return s * {0}"),
    Family(
        "count_char",
        "s",
        _grid(LETTERS),
        "count_{0}",
        "returns how many times the letter '{0}' appears in s",
        "return s.count('{0}')",
    ),
    Family(
        "starts_with",
        "s",
        _grid(LETTERS),
        "starts_with_{0}",
        "returns True if s starts with the letter '{0}', otherwise False",
        "return s.startswith('{0}')",
    ),
    Family(
        "replace",
        "s",
        [(a, b) for a in "aeiou" for b in LETTERS if a != b],
        "replace_{0}_with_{1}",
        "returns s with every '{0}' replaced by '{1}'",
        "return s.replace('{0}', '{1}')",
    ),
    Family("prefix", "s", _grid(WORDS), "add_{0}_prefix", "returns '{0}' followed by s", "return '{0}' + s"),
    Family("suffix", "s", _grid(WORDS), "add_{0}_suffix", "returns s followed by '{0}'", "return s + '{0}'"),
    Family(
        "method_affix",
        "s",
        _grid(("upper", "lower", "reverse"), WORDS),
        lambda m, x: f"{_STR_METHODS[m][0]}_then_{x}",
        lambda m, x: f"{_STR_METHODS[m][1]} followed by '{x}'",
        lambda m, x: f"return {_STR_METHODS[m][2]} + '{x}'",
    ),
    Family(
        "list_stat",
        "xs",
        _grid(_LIST_STATS),
        lambda m: _LIST_STATS[m][0],
        lambda m: _LIST_STATS[m][1],
        lambda m: f"return {_LIST_STATS[m][2]}",
    ),
    Family(
        "list_cond",
        "xs",
        _grid(_AGG, _CMP, range(0, 10)),
        lambda g, op, k: f"{g}_{_CMP[op][0]}_{number_word(k)}",
        lambda g, op, k: _AGG[g][1].format(_CMP[op][1], k),
        lambda g, op, k: "return " + _AGG[g][2].format(op, k),
    ),
    Family(
        "list_map",
        "xs",
        [(op, k) for op in _MAP for k in range(1, 10) if not (op == "*" and k == 1)],
        lambda op, k: f"{_MAP[op][0]}_{number_word(k)}_each",
        lambda op, k: f"returns a list of each number in xs {_MAP[op][1]} {k}",
        "return [v {0} {1} for v in xs]",
    ),
    Family(
        "filter_map",
        "xs",
        _grid(range(2, 10), range(0, 10)),
        "times_{w[0]}_above_{w[1]}",
        "returns a list of each number in xs greater than {1}, times {0}",
        "return [v * {0} for v in xs if v > {1}]",
    ),
    Family(
        "sum_affine",
        "xs",
        _grid(range(2, 10), range(1, 10)),
        "sum_times_{w[0]}_plus_{w[1]}",
        "returns the sum of xs times {0} plus {1}",
        "return sum(xs) * {0} + {1}",
    ),
    Family(
        "mix",
        "ab",
        _grid(range(1, 10), range(1, 10)),
        "mix_{w[0]}_{w[1]}",
        "returns a times {0} plus b times {1}",
        "return a * {0} + b * {1}",
    ),
    Family(
        "pair_ext",
        "ab",
        _grid(("larger", "smaller"), range(1, 21)),
        "{0}_plus_{w[1]}",
        "returns the {0} of a and b plus {1}",
        lambda m, k: f"return {'max' if m == 'larger' else 'min'}(a, b) + {k}",
    ),
]

#: The parameter list of a function, for each argument kind.
SIGNATURES = {"x": "x", "n": "n", "s": "s", "xs": "xs", "ab": "a, b"}
