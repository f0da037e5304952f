"""The checks of the ``code_ast`` reward (:func:`trainer_lib.rewards.functions.code_ast`): a
completion's code judged by its syntax tree, without running it.

The code is taken from the completion as the other code rewards take it (the first fenced block,
else the whole text) and parsed with :func:`ast.parse`. Four checks, each worth a quarter:

    parses      the code is valid Python (length bounded before parsing; see below)
    defines     the task's entry point is a top-level ``def`` (or ``class``)
    arity       every call to it in the row's ``tests`` fits its parameters
    clean       no forbidden names (imports of os, sys, subprocess, socket; ``eval``, ``exec``,
                ``open``, ``__import__``) and within the size and nesting limits

Code that does not parse scores 0. The entry point is the row's ``entry_point`` column, else the
first non-builtin function the ``tests`` column's asserts call (the columns ``code_execution``
reads); a row with neither is scored on ``parses`` and ``clean`` alone (each worth a half).

Hostile completions neither crash nor hang it: code over ``max_chars`` (or a completion over four
times that) scores 0 without being parsed, the tree is walked without recursion, and what the
parser itself refuses (too many nested parentheses, an integer literal over Python's digit limit,
a tree too deep to build) is caught as a syntax failure (``SyntaxError``, ``ValueError``,
``RecursionError``, ``MemoryError``, ...).
"""

from __future__ import annotations

import ast
import builtins
import functools
from dataclasses import dataclass

FORBIDDEN_MODULES = frozenset({"os", "sys", "subprocess", "socket"})
FORBIDDEN_NAMES = frozenset({"eval", "exec", "open", "__import__"})
_BUILTIN_NAMES = frozenset(dir(builtins))
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError, TypeError)


@dataclass(frozen=True)
class Signature:
    """What a function accepts: positional counts, keyword names, and whether it takes more."""

    required: int
    positional: int
    names: frozenset
    required_keywords: frozenset
    varargs: bool
    varkw: bool

    @classmethod
    def of(cls, node: ast.FunctionDef | ast.AsyncFunctionDef) -> Signature:
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        return cls(
            required=len(positional) - len(args.defaults),
            positional=len(positional),
            names=frozenset(a.arg for a in [*args.args, *args.kwonlyargs]),
            required_keywords=frozenset(a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None),
            varargs=args.vararg is not None,
            varkw=args.kwarg is not None,
        )

    def accepts(self, call: tuple[int, frozenset]) -> bool:
        """Whether a call with ``n`` positional arguments and these keyword names binds."""
        n, keywords = call
        if n > self.positional and not self.varargs:
            return False
        filled = n + sum(1 for k in keywords if k in self.names)  # (keywords may fill positionals)
        unknown = keywords - self.names
        return filled >= self.required and self.required_keywords <= keywords and (not unknown or self.varkw)


@functools.lru_cache(maxsize=4096)
def expected_calls(tests: tuple[str, ...], entry_point: str | None) -> tuple[str | None, tuple]:
    """``(entry point, calls)`` from a row's tests: the entry point given, else the first non-builtin
    name they call; each call to it as ``(positional count, keyword names)``. Cached: a prompt's
    completions share their row."""
    calls, first = [], entry_point
    for test in tests:
        try:
            tree = ast.parse(test)
        except _PARSE_ERRORS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if first is None and name not in _BUILTIN_NAMES:
                    first = name
                if name == first:
                    calls.append((len(node.args), frozenset(k.arg for k in node.keywords if k.arg)))
    return first, tuple(calls)


_TRIGGERS = ("import", *FORBIDDEN_NAMES)  # text without any of these has no forbidden name: no search


def _over_limits(tree: ast.AST, max_nodes: int, max_depth: int) -> bool:
    """Whether the tree has more than ``max_nodes`` nodes or nests deeper than ``max_depth``, walked
    level by level without recursion (deep trees cannot exhaust the stack) and stopping early."""
    level, depth, count = [tree], 0, 0
    while level:
        count += len(level)
        if count > max_nodes or depth > max_depth:
            return True
        children = []
        for node in level:  # ast.iter_child_nodes, inlined: this loop is most of the reward's time
            for field in node._fields:
                value = getattr(node, field, None)
                if isinstance(value, list):
                    children.extend(v for v in value if isinstance(v, ast.AST))
                elif isinstance(value, ast.AST):
                    children.append(value)
        level, depth = children, depth + 1
    return False


def _forbidden(code: str, tree: ast.AST) -> bool:
    """Whether the code imports a forbidden module or names a forbidden builtin."""
    if not any(word in code for word in _TRIGGERS):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return True
        if isinstance(node, ast.Import) and any(a.name.partition(".")[0] in FORBIDDEN_MODULES for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if (node.module or "").partition(".")[0] in FORBIDDEN_MODULES:
                return True
    return False


def score(code: str | None, entry_point: str | None, calls: tuple, limits: tuple[int, int, int]) -> float:
    """One completion's code (None: too long to read): the share of the checks it passes (see the
    module docstring)."""
    max_chars, max_nodes, max_depth = limits
    if code is None or len(code) > max_chars:
        return 0.0
    try:
        tree = ast.parse(code)
        clean = not (_over_limits(tree, max_nodes, max_depth) or _forbidden(code, tree))
    except _PARSE_ERRORS:
        return 0.0
    if entry_point is None:
        return 0.5 + 0.5 * clean
    found = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == entry_point
    ]
    defined = bool(found)
    node = found[-1] if found else None  # a redefinition wins, as it would at run time
    fits = defined and (isinstance(node, ast.ClassDef) or all(Signature.of(node).accepts(call) for call in calls))
    return 0.25 * (1 + defined + fits + clean)
