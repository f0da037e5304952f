"""engine.offload_optimizer=true trains with no compiler reachable: DeepSpeed's ops come prebuilt.

``make setup``, like both builds of images/Dockerfile, installs DeepSpeed with its CPU Adam
(``DeepSpeedCPUAdam``, what ``engine.offload_optimizer`` constructs) and its shared-memory comm op
(loaded by every CPU run) compiled in, and checks them with images/check_ds_ops.py. Without them
DeepSpeed compiles the ops at first use, which fails in the image (no compiler there) and, where a
compiler exists, rebuilds whenever another environment shares ``~/.cache/torch_extensions`` and hangs
every later run on the ``lock`` file a killed build leaves behind.

The test runs a real ``posttrain sft`` process (ZeRO-2, optimizer offloaded, a few steps) with every
compiler shadowed: a directory first on PATH holds ``gcc``, ``g++``, ``cc``, ``c++``, ``nvcc`` and
``ninja`` stubs that record their call and exit 1, CC and CXX name them, and TORCH_EXTENSIONS_DIR is
a fresh empty directory. The run must train and leave that directory empty, and no stub may have
been called to build anything. The one call a CPU run makes is not a build: DeepSpeed's op
compatibility probe (``deepspeed.ops.__compatible_ops__``, asked for by its comm backend at every
start) compiles a one-line ``test.c`` to see whether libaio exists for its async_io op; without a
compiler, as in the image, the answer is "not compatible" and nothing else happens.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env

STUBS = ("gcc", "g++", "cc", "c++", "nvcc", "ninja")


def prebuilt_ops() -> dict:
    """DeepSpeed's table of ops compiled at install time, read without importing deepspeed."""
    spec = importlib.util.find_spec("deepspeed")
    path = Path(spec.origin).with_name("git_version_info_installed.py")
    if not path.exists():  # a source checkout: nothing prebuilt
        return {}
    for line in path.read_text(encoding="utf-8").splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "installed_ops":
            return ast.literal_eval(value.strip())
    return {}


MISSING = [op for op in ("cpu_adam", "deepspeed_shm_comm") if not prebuilt_ops().get(op)]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"this venv's deepspeed was installed without the prebuilt ops {MISSING} (an older make setup): "
    "rerun make setup, which reinstalls it with them",
)


def is_library_probe(call: str) -> bool:
    """DeepSpeed's ``OpBuilder.has_function``: the C compiler on a one-line ``test.c`` in a temporary
    directory (async_io's libaio probe), then a link of it; it builds no op."""
    words = call.split()
    return words[0] in ("cc", "gcc") and any(word.endswith(("/test.c", "/test.o")) for word in words)


@pytest.fixture
def no_compilers(tmp_path: Path) -> tuple[dict, Path]:
    """(environment changes, the file each stub call is appended to)."""
    bin_dir = tmp_path / "no-compilers"
    bin_dir.mkdir()
    calls = tmp_path / "compiler-calls.txt"
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\nexit 1\n', encoding="utf-8")
        stub.chmod(0o755)
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "CC": str(bin_dir / "cc"),
        "CXX": str(bin_dir / "c++"),
        "TORCH_EXTENSIONS_DIR": str(extensions),
    }
    return env, calls


def child_env(shadow: dict) -> dict:
    env = {**clean_env(), **shadow, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


def builds(calls: Path) -> list[str]:
    """The stub calls that were not :func:`is_library_probe`."""
    lines = calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []
    return [line for line in lines if not is_library_probe(line)]


def test_offload_trains_with_no_compiler(tiny_model_dir, chat_jsonl, tmp_path, no_compilers):
    shadow, calls = no_compilers
    out = tmp_path / "out"
    env = child_env(shadow)
    script = Path(sys.executable).with_name("posttrain")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "trainer_lib.cli"]
    proc = subprocess.run(
        [
            *command,
            "sft",
            f"model.path={tiny_model_dir}",
            f"data.path={chat_jsonl}",
            f"output_dir={out}",
            "engine.zero_stage=2",
            "engine.offload_optimizer=true",
            "max_steps=3",
            "logging_steps=1",
            "save_steps=0",
            "batch_size=2",
            "data.max_length=64",
            "data.packing=false",
            "data.eval_fraction=0",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}; compilers called: {builds(calls)}\n{log[-4000:]}"
    assert not builds(calls), "a compiler was called: DeepSpeed tried to build an op"
    assert not os.listdir(shadow["TORCH_EXTENSIONS_DIR"]), "something was JIT-compiled"

    config = json.loads(log.split("deepspeed config: ", 1)[1].splitlines()[0])
    assert config["zero_optimization"]["stage"] == 2
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"  # DeepSpeedCPUAdam
    with open(out / "metrics.jsonl", encoding="utf-8") as fh:
        losses = [row["loss"] for row in map(json.loads, fh) if row.get("split") == "train" and "loss" in row]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses), losses


def test_the_ops_gate_passes_with_no_compiler(no_compilers):
    """images/check_ds_ops.py, which make setup and both image stages run, loads the ops as the image's
    runtime stage does: with nothing to compile them."""
    shadow, calls = no_compilers
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "images", "check_ds_ops.py"), "CPU_ADAM", "SHM_COMM"],
        capture_output=True,
        text=True,
        env=child_env(shadow),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prebuilt and loaded: cpu_adam, deepspeed_shm_comm" in proc.stdout
    assert not calls.exists(), calls.read_text(encoding="utf-8")  # loading probes nothing
