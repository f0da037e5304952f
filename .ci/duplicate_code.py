"""Repeated code in the product (trainer_lib/, components/, pipelines/), counting copies that renamed things.

    python .ci/duplicate_code.py [--max N]      (make lint runs it)

pylint's duplicate-code engine (``Symilar``: blocks of 6 or more lines, import lines, comments and
docstrings left out, function signatures counted) run on the source with two changes, so that it counts
what a reader counts as written twice:

* names alike but for their spelling: within each function or class, every name that is not a keyword,
  a builtin or an attribute (``x.name``) is replaced by its order of first use (``v0``, ``v1``...), so a
  copy that only renamed its variables matches; strings and numbers stay (two dataclasses of other
  fields are not a copy);
* within one file too: pylint compares files with each other only, so each top-level definition is
  handed over as a text of its own.

Prints every block found (``path:first-last`` of each copy) and exits 1 when there are more than
``--max``. Tests are not counted: their fixtures repeat on purpose.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import io
import keyword
import os
import re
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer_lib", "components", "pipelines")
KEPT = set(dir(builtins)) | {"self", "cls"}


def sources() -> dict[str, str]:
    """``{path relative to the repo: text}`` of every Python file of the product."""
    found = {}
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "compiled")]
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as fh:
                        found[os.path.relpath(path, ROOT)] = fh.read()
    return found


def unify_names(text: str) -> str:
    """``text`` with each local name replaced by its order of first use in its function or class."""
    lines = text.splitlines(keepends=True)
    names: dict[str, str] = {}
    edits, previous = [], ""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME:
            if token.string in ("def", "class"):
                names = {}
            elif not keyword.iskeyword(token.string) and token.string not in KEPT and previous != ".":
                edits.append((token.start, token.end, names.setdefault(token.string, f"v{len(names)}")))
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token.string
    for (row, start), (_, end), name in reversed(edits):  # (tokens never span lines but strings, kept)
        lines[row - 1] = lines[row - 1][:start] + name + lines[row - 1][end:]
    return "".join(lines)


def pieces(path: str, text: str) -> list[tuple[str, int, str]]:
    """``(path, first line, text)`` of each top-level definition of a file, and of the rest as one piece."""
    lines = text.splitlines(keepends=True)
    spans = [
        (min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno)
        for node in ast.parse(text).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    inside = {line for first, last in spans for line in range(first, last + 1)}
    rest = "".join(line if number not in inside else "\n" for number, line in enumerate(lines, 1))
    return [(path, 1, rest)] + [(path, first, "".join(lines[first - 1 : last])) for first, last in spans]


def repeated_blocks() -> list[str]:
    """One line per repeated block: its copies as ``path:first-last``."""
    from pylint.checkers.symilar import Symilar

    similar = Symilar(  # signatures counted: a parameter list written twice is a copy too
        min_lines=6, ignore_comments=True, ignore_docstrings=True, ignore_imports=True, ignore_signatures=False
    )
    for path, text in sources().items():
        for where, first, piece in pieces(path, text):
            similar.append_stream(f"{where}@{first}", io.StringIO(unify_names(piece)))
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        similar.run()
    blocks = []
    for block in report.getvalue().split(" similar lines in ")[1:]:
        copies = []
        for where, first, start, end in re.findall(r"^==(.+)@(\d+):\[(\d+):(\d+)\]$", block, flags=re.M):
            copies.append(f"{where}:{int(first) + int(start)}-{int(first) + int(end) - 1}")
        blocks.append(" ~ ".join(copies))
    return blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=12, help="most repeated blocks allowed")
    args = parser.parse_args()
    found = repeated_blocks()
    for block in found:
        print(f"  {block}")
    print(f"duplicate code: {len(found)} repeated block(s) in {', '.join(PACKAGES)} (at most {args.max})")
    return 1 if len(found) > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
