"""Nothing read from a user-supplied path is unpickled.

An AST audit of ``trainer_lib/`` and ``components/`` finds every call that can run code while it
reads a file (``torch.load`` without ``weights_only=True``, ``pickle``/``dill``/``cloudpickle``/
``marshal`` loads, ``joblib.load``, ``numpy.load(allow_pickle=True)``, ``pandas.read_pickle``,
``shelve.open``, ``yaml.load`` without a safe loader, ``yaml.unsafe_load``): none is allowed
beyond :data:`ALLOWED`. A behaviour test then plants a pickle that would run code as the newest
checkpoint: resuming refuses it, with one error line, and the code never runs.
"""

from __future__ import annotations

import ast
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUDITED = ("trainer_lib", "components")

#: "path:function" -> why it is safe. Empty: weights are read through safetensors, checkpoints
#: through trainer_lib.engine.checkpoint.weights_only_loads, tables through torch.load(weights_only=True).
ALLOWED: dict[str, str] = {}

#: (module, function) pairs that unpickle whatever they read.
UNPICKLERS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("pickle", "Unpickler"),
    ("_pickle", "load"),
    ("_pickle", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("cloudpickle", "load"),
    ("cloudpickle", "loads"),
    ("marshal", "load"),
    ("marshal", "loads"),
    ("joblib", "load"),
    ("pandas", "read_pickle"),
    ("shelve", "open"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
    ("yaml", "unsafe_load_all"),
    ("yaml", "full_load_all"),
}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def _resolve(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """Dotted name of a called function with import aliases undone: ``np.load`` -> ``numpy.load``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def findings(source: str, filename: str) -> list[str]:
    """Unsafe deserialisation calls in one module, as ``file:line: call``."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module:
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _resolve(node.func, aliases)
        if name is None:
            continue
        module, _, function = name.rpartition(".")
        bad = (
            (name == "torch.load" and not _is_true(_keyword(node, "weights_only")))
            or (module, function) in UNPICKLERS
            or (name == "numpy.load" and not _is_false_or_absent(_keyword(node, "allow_pickle")))
            or (
                name == "yaml.load"
                and _resolve(_keyword(node, "Loader") or ast.Constant(None), aliases)
                not in {f"yaml.{loader}" for loader in SAFE_YAML_LOADERS}
            )
        )
        if bad:
            found.append(f"{filename}:{node.lineno}: {name}")
    return found


def _is_false_or_absent(node) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is False)


def test_the_audit_finds_what_it_looks_for():
    source = "\n".join(
        [
            "import torch, pickle, joblib, yaml",
            "import numpy as np",
            "from pickle import loads as from_bytes",
            "torch.load('a')",  # 4
            "torch.load('a', weights_only=False)",  # 5
            "torch.load('a', weights_only=True)",  # fine
            "pickle.load(open('a', 'rb'))",  # 7
            "from_bytes(b'')",  # 8
            "joblib.load('a')",  # 9
            "np.load('a', allow_pickle=True)",  # 10
            "np.load('a')",  # fine
            "yaml.load(text, Loader=yaml.Loader)",  # 12
            "yaml.load(text, Loader=yaml.SafeLoader)",  # fine
            "yaml.safe_load(text)",  # fine
        ]
    )
    assert sorted(int(f.split(":")[1]) for f in findings(source, "x.py")) == [4, 5, 7, 8, 9, 10, 12]


def test_no_unpickling_in_the_library_and_components():
    found = []
    for top in AUDITED:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as fh:
                        found += findings(fh.read(), os.path.relpath(path, ROOT))
    unexpected = [f for f in found if f.split(":")[0] + ":" + f.rsplit(": ", 1)[1] not in ALLOWED]
    assert not unexpected, "\n".join(unexpected)


class _Payload:
    """Unpickling this creates a file: what a hostile checkpoint would do with os.system."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("planted", ["mp_rank_00_model_states.pt", "rng_state_rank0.pt"])
def test_a_planted_pickle_in_a_checkpoint_is_refused_and_never_runs(
    planted, tiny_model_dir, chat_jsonl, tmp_path, capsys
):
    import torch

    from tests.stages.training.rl_helpers import one_thread
    from trainer_lib.cli import main

    out, marker = tmp_path / "run", tmp_path / "payload-ran"
    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        "batch_size=2",
        "data.max_length=64",
        "save_steps=2",
        f"output_dir={out}",
    ]
    with one_thread():
        assert main([*args, "max_steps=2"]) == 0
        target = out / "checkpoints" / "step-00000002" / planted
        original = torch.load(target, weights_only=True)  # what we write loads under the same rules
        torch.save({**original, "extra": _Payload(str(marker))} if isinstance(original, dict) else original, target)
        # whoever can write the checkpoint can rewrite its marker's checksums: weights-only loading is what stops it
        from trainer_lib.engine.checkpoint import MARKER, file_digests

        complete = target.parent / MARKER
        listed = {**json.loads(complete.read_text()), "files": file_digests(str(target.parent))}
        complete.write_text(json.dumps(listed))
        capsys.readouterr()
        code = main([*args, "max_steps=4"])
    err = capsys.readouterr().err
    assert code == 2 and not marker.exists()
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "step-00000002" in last and "refusing to load" in last, err
    assert last.endswith("(io.open)")  # what it would have called
