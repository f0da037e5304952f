"""The house's dependency rules (docs/architecture.md): imports point down the layers and never form a circle.

The layers, lowest first: the package root's errors and values, pure math (losses/), the core folders (one
concern each, ranked among themselves), the stages (training recipes and lifecycle stages), what runs a
stage (runner/ and the CLI), then components/ and pipelines/ above the library.
"""

import ast
import os

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer_lib", "components", "pipelines")


def _modules() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT_DIR, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT_DIR)[:-3].replace(os.sep, ".")
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


#: The core folders, ranked lowest first: a core folder imports only folders of a lower rank (and itself),
#: at module top and inside functions alike; folders of one rank import nothing of each other.
#: Why this order: docs/architecture.md#the-order-of-the-core.
CORE_RANKS = (
    ("storage",),  # local paths and URLs: nothing of ours below it
    ("data",),  # rows, formats, chat templates, tokenization: plain arguments in, never a config object
    ("config",),  # typed settings, checked against data's formats and templates
    ("models",),  # loading, LoRA, heads, saving: from a config section
    ("engine", "sandbox"),  # DeepSpeed and processes; isolated code execution
    ("loop", "rewards", "agents"),  # the cadence of a training loop; reward sources; multi-turn episodes with tools
    ("rl", "export"),  # rollouts and experience; ONNX and quantization
    ("eval",),  # scoring models: generation, sandboxed tasks, the gate, the report
    ("serving", "release", "demo"),  # Triton; lineage, cards, retraining, notices; the embedded default
    ("dashboard",),  # the web UI over what stages wrote: reads runs, never runs or imports a stage
)
CORE = tuple(folder for rank in CORE_RANKS for folder in rank)
RUNNERS = ("runner", "cli")  # build a stage's config and run it: here, in N processes or on N nodes
ROOT = ("errors", "values")  # below everything


def core_rank(folder: str) -> int:
    return next(i for i, rank in enumerate(CORE_RANKS) if folder in rank)


def layer(module: str) -> int:
    """0 the package root's errors and values, 1 losses, 2 core, 3 stages, 4 runners, 5 components, 6 pipelines."""
    parts = module.split(".")
    if parts[0] != "trainer_lib":
        return {"components": 5, "pipelines": 6}[parts[0]]
    if len(parts) == 1 or parts[1] in ROOT:
        return 0
    if parts[1] == "losses":
        return 1
    if parts[1] in CORE:
        return 2
    if parts[1] == "stages":
        return 3
    assert parts[1] in RUNNERS, f"{module}: a folder or root module in no layer (add it to CORE_RANKS or RUNNERS)"
    return 4


def test_every_module_imports_only_its_own_layer_or_those_below():
    upward = sorted(
        f"{m} ({layer(m)}) -> {d} ({layer(d)})" for m, deps in _graph().items() for d in deps if layer(d) > layer(m)
    )
    assert not upward, "\n".join(upward)


def test_core_folders_import_only_folders_ranked_below_them():
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in _graph().items()
        if layer(m) == 2
        for d in deps
        if layer(d) == 2
        and m.split(".")[1] != d.split(".")[1]
        and core_rank(d.split(".")[1]) >= core_rank(m.split(".")[1])
    )
    assert not upward, "\n".join(upward)


def test_every_core_folder_has_a_rank_and_no_other_folder_is_unplaced():
    folders = {
        name
        for name in os.listdir(os.path.join(ROOT_DIR, "trainer_lib"))
        if os.path.isdir(os.path.join(ROOT_DIR, "trainer_lib", name)) and name != "__pycache__"
    }
    assert folders == {*CORE, "losses", "stages", *(r for r in RUNNERS if not r.endswith("cli"))}


def test_losses_import_nothing_of_ours_but_losses():
    assert not {(m, d) for m, deps in _graph().items() if layer(m) == 1 for d in deps if layer(d) != 1}


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
