"""The house's shape (docs/architecture.md): folders are the layers, names are unique, functions stay short."""

import ast
import os

import pytest

from tests.conftest import REPO

LIBRARY = os.path.join(REPO, "trainer_lib")
MAX_ROOT_MODULES = 4
#: The longest function, from its ``def`` to its last line, per package: components are thin (artifacts and
#: parameters in, one call into trainer_lib, metadata out), so theirs are shorter.
MAX_FUNCTION_LINES = {"trainer_lib": 90, "pipelines": 90, "components": 60}
#: Functions allowed to be longer: the sandbox's isolation closures keep their locals out of the program's
#: reach, so their steps cannot be split into functions the program could find (see the comment at each).
LONG_BY_DESIGN = {("trainer_lib/sandbox/_zygote.py", "_make_hook")}


def _python_files(top: str):
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        yield from (os.path.join(folder, name) for name in files if name.endswith(".py"))


def test_few_modules_at_the_package_root():
    root = sorted(n for n in os.listdir(LIBRARY) if n.endswith(".py") and n != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_module_name_twice_in_the_library():
    seen: dict[str, list[str]] = {}
    for path in _python_files(LIBRARY):
        name = os.path.basename(path)
        if name != "__init__.py":
            seen.setdefault(name, []).append(os.path.relpath(path, REPO))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_every_folder_of_the_library_says_what_it_holds():
    for folder, dirs, files in os.walk(LIBRARY):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if folder == LIBRARY or not any(f.endswith(".py") for f in files):
            continue
        init = os.path.join(folder, "__init__.py")
        assert os.path.exists(init), f"{folder}: no __init__.py"
        with open(init, encoding="utf-8") as fh:
            assert ast.get_docstring(ast.parse(fh.read())), f"{init}: no docstring saying what the folder holds"


@pytest.mark.parametrize("package", sorted(MAX_FUNCTION_LINES))
def test_functions_are_short(package):
    long = []
    for path in _python_files(os.path.join(REPO, package)):
        rel = os.path.relpath(path, REPO)
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES[package] and (rel, node.name) not in LONG_BY_DESIGN:
                    long.append(f"{rel}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)
