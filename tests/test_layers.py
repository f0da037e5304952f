"""The house's dependency rules (DESIGN.md): imports point down the layers and never form a circle."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer_lib", "components", "pipelines")


def _modules() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(path: str, module: str, known: dict) -> set[str]:
    """Modules of ours that ``module`` imports anywhere in its body (top level or in functions)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {module: _imports(path, module, known) for module, path in known.items()}


def test_the_library_never_imports_the_layers_above_it():
    upward = {
        (m, d)
        for m, deps in _graph().items()
        if m.startswith("trainer_lib")
        for d in deps
        if d.split(".")[0] in ("components", "pipelines")
    }
    assert not upward


def test_components_never_import_pipelines():
    assert not {
        (m, d) for m, deps in _graph().items() if m.startswith("components") for d in deps if d.startswith("pipelines")
    }


def test_no_import_circle():
    graph, state, cycles = _graph(), {}, []

    def visit(node, trail):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if dep == node.rpartition(".")[0] or node.startswith(dep + ".") and dep in PACKAGES:
                continue  # a module importing its own package's __init__ is not a circle of logic
            if state.get(dep) == "open":
                cycles.append(trail[trail.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, trail + [dep])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_is_imported_from_another_module():
    private = []
    for module, path in _modules().items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
                private += [
                    f"{module}: from {node.module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not private
