"""images/Dockerfile.triton without a Docker engine: what the serving image is built from, copies and installs.

The build is not run here (no Docker on these machines). What is checked instead: the base is a pinned
release of NVIDIA's Triton image whose TensorRT is the one the pinned onnxruntime-gpu was built for, every
file the build copies is in its context, every package comes pinned from images/triton-requirements.txt,
and model.py and its generation loop import nothing else. The slow tests (``make lock-check``) resolve the
requirements against the package index for the image's Python and platform, and run the generate model
with the pinned onnxruntime, numpy and tokenizers.
"""

import ast
import os
import re
import subprocess
import sys
from importlib.metadata import packages_distributions

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from trainer_lib.serving import repository, triton_image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "images", "Dockerfile.triton")
REQUIREMENTS = os.path.join(ROOT, "images", "triton-requirements.txt")
#: The base image's Python (Triton 25.03 runs Ubuntu 24.04's 3.12); the build asserts it.
IMAGE_PYTHON = (3, 12)
#: The TensorRT in each Triton release used as the base (NVIDIA's release notes: 25.03 has 10.9, CUDA 12.8.1)
#: and the TensorRT each onnxruntime-gpu release is built for (onnxruntime's TensorRT provider page).
TENSORRT_OF_TRITON = {"25.03": "10.9"}
TENSORRT_OF_ONNXRUNTIME = {"1.21": "10.8", "1.22": "10.9"}
#: What model.py imports besides the standard library and the files deploy copies next to it.
BACKEND_MODULES = {"triton_python_backend_utils"}
#: Distributions whose modules come from another distribution installed here (the GPU build's CPU twin).
SAME_MODULES_AS = {"onnxruntime-gpu": "onnxruntime"}


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped."""
    with open(DOCKERFILE, encoding="utf-8") as fh:
        text = re.sub(r"\\\n", " ", "".join(line for line in fh if not line.lstrip().startswith("#")))
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def pins() -> dict[str, str]:
    with open(REQUIREMENTS, encoding="utf-8") as fh:
        lines = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    found = {}
    for line in lines:
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        assert spec.operator == "==" and "*" not in spec.version and not requirement.marker, f"not a pin: {line}"
        assert canonicalize_name(requirement.name) not in found, f"pinned twice: {line}"
        found[canonicalize_name(requirement.name)] = spec.version
    return found


def makefile() -> str:
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        return fh.read()


def build_context() -> str:
    """The context ``make image-triton`` builds with (the last word of its docker build)."""
    (line,) = [line for line in makefile().splitlines() if line.startswith("image-triton:")]
    assert "$(ENGINE) build -f images/Dockerfile.triton " in line
    return os.path.join(ROOT, line.split()[-1])


def ignore_patterns(context: str) -> list[str]:
    """The .dockerignore that applies: ``<Dockerfile>.dockerignore`` first (BuildKit), else the context's."""
    for path in (DOCKERFILE + ".dockerignore", os.path.join(context, ".dockerignore")):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                return [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    return []


def ignored(relative: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories decides."""
    parts = relative.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for pattern in patterns:
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!").strip("/")
        regex = "".join(
            ".*" if token == "**" else "[^/]*" if token == "*" else "[^/]" if token == "?" else re.escape(token)
            for token in re.findall(r"\*\*|\*|\?|[^*?]+", pattern)
        )
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            verdict = not negated
    return verdict


def test_the_base_is_a_pinned_release_of_nvidias_triton_with_the_python_assumed_here():
    (base,) = [line for line in instructions() if line.upper().startswith("FROM ")]
    match = re.fullmatch(r"FROM nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-py3", base)
    assert match, f"expected a pinned nvcr.io/nvidia/tritonserver:<yy.mm>-py3, got {base!r}"
    assert f"assert sys.version_info[:2] == {IMAGE_PYTHON}" in " ".join(instructions())


def test_onnxruntime_gpu_is_the_release_built_for_the_tensorrt_of_the_base():
    (base,) = [line for line in instructions() if line.upper().startswith("FROM ")]
    release = base.split(":")[1].removesuffix("-py3")
    onnxruntime = Version(pins()["onnxruntime-gpu"])
    assert release in TENSORRT_OF_TRITON, f"add Triton {release}'s TensorRT version to TENSORRT_OF_TRITON"
    built_for = TENSORRT_OF_ONNXRUNTIME.get(f"{onnxruntime.major}.{onnxruntime.minor}")
    assert built_for == TENSORRT_OF_TRITON[release], (
        f"onnxruntime-gpu {onnxruntime} is built for TensorRT {built_for}, Triton {release} has "
        f"{TENSORRT_OF_TRITON[release]}: its TensorRT provider would not load there"
    )


def test_every_file_the_build_copies_is_in_its_context():
    context = build_context()
    assert os.path.isdir(context)
    patterns = ignore_patterns(context)
    copies = [line.split()[1:] for line in instructions() if line.upper().startswith(("COPY ", "ADD "))]
    assert copies, "the build copies its requirements file"
    for args in copies:
        assert not any(a.startswith("--from") for a in args) and not any("://" in a for a in args)
        for source in args[:-1]:
            assert os.path.exists(os.path.join(context, source)), f"{source} is not in the context {context}"
            assert not ignored(source, patterns), f"{source} is excluded by the .dockerignore"
    assert ignored("a/b/__pycache__/x.pyc", ["**/__pycache__"]) and not ignored("x.txt", ["*.txt", "!x.txt"])


def test_every_package_comes_pinned_from_the_requirements_file():
    found = pins()
    assert {"onnxruntime-gpu", "tokenizers", "numpy"} <= set(found)
    copied = {
        os.path.basename(args[0]): args[-1]
        for args in (line.split()[1:] for line in instructions() if line.upper().startswith("COPY "))
    }
    assert copied.get("triton-requirements.txt"), "the build copies images/triton-requirements.txt"
    installs = [line for line in instructions() if "pip" in line and " install " in line]
    assert installs
    for line in installs:
        for command in (c for c in line.split("&&") if " install " in c):
            words = command.split()
            what = [w for w in words[words.index("install") + 1 :] if not w.startswith("--")]
            assert what == ["-r", copied["triton-requirements.txt"]], f"installs something unpinned: {command}"


def test_numpy_stays_below_2_as_in_the_serving_tests():
    """The serving tests' environment (make triton-env) runs model.py under numpy < 2; so does the image."""
    assert Version(pins()["numpy"]).major == 1
    (recipe,) = [line for line in makefile().splitlines() if "$(TRITON_VENV)/bin/pip install" in line]
    assert "'numpy<2'" in recipe


def _imports(path: str) -> set[str]:
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import cannot work in a Triton version directory"
            names.add(node.module.split(".")[0])
    return names


def test_the_model_code_imports_only_the_standard_library_the_backend_and_the_pinned_packages():
    provided = set(BACKEND_MODULES) | {os.path.splitext(name)[0] for name in repository.VERSION_CODE}
    modules_of: dict[str, set[str]] = {}
    for module, distributions in packages_distributions().items():
        for distribution in distributions:
            modules_of.setdefault(canonicalize_name(distribution), set()).add(module)
    for distribution in pins():
        provided |= modules_of.get(SAME_MODULES_AS.get(distribution, distribution), set())
    third_party = set()
    for path in repository.VERSION_CODE.values():  # exactly the files deploy copies into a version
        imported = _imports(path) - set(sys.stdlib_module_names) - {"__future__"}
        assert imported <= provided, f"{os.path.relpath(path, ROOT)} imports {imported - provided}, not in the image"
        third_party |= imported
    assert {"numpy", "onnxruntime", "tokenizers", "triton_python_backend_utils", "ort_generate"} <= third_party


def test_the_image_runs_model_py_in_its_own_venv_and_gates_on_the_gpu_providers():
    lines = instructions()
    text = " ".join(lines)
    assert "python3 -m venv --without-pip /opt/posttrain-serving" in text
    assert "ENV PATH=/opt/posttrain-serving/bin:$PATH" in text  # the stub's python3
    assert "sys.prefix == '/opt/posttrain-serving'" in text
    (gate,) = [line for line in lines if "get_available_providers" in line]
    assert (
        "'TensorrtExecutionProvider', 'CUDAExecutionProvider'" in gate
        and "import numpy, onnxruntime, tokenizers" in gate
    )
    assert "for ep in cuda tensorrt" in gate and 'ldd "$capi/libonnxruntime_providers_$ep.so"' in gate
    assert '! grep "not found"' in gate and "|| exit 1" in gate  # any missing library fails the build
    users = [line.split()[1] for line in lines if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("0", "root"), "the image must end as a non-root user"


def test_the_tag_follows_the_package_version():
    from components import common

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        version = tomllib.load(fh)["project"]["version"]
    assert triton_image.VERSION == version == common.VERSION
    assert triton_image.REGISTRY == common.REGISTRY + "-triton"
    text = makefile()
    name = re.search(r"^IMAGE_NAME\s*\?=\s*(\S+)$", text, re.MULTILINE).group(1)
    tag = re.search(r"^IMAGE_TAG\s*\?=\s*(\S+)$", text, re.MULTILINE).group(1)
    (line,) = [line for line in text.splitlines() if line.startswith("image-triton:")]
    rendered = re.search(r"-t (\S+)", line).group(1).replace("$(IMAGE_NAME)", name).replace("$(IMAGE_TAG)", tag)
    assert rendered == triton_image.IMAGE


needs_index = pytest.mark.skipif(
    not os.environ.get("POSTTRAIN_CHECK_LOCK"),
    reason="resolves against the package index (network): make lock-check",
)


def _platforms() -> list[str]:
    """pip's --platform for the image (Ubuntu 24.04, glibc 2.39): every manylinux tag it accepts."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)]
    return [
        arg
        for tag in [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
        for arg in ("--platform", tag)
    ]


@pytest.mark.slow
@needs_index
def test_the_requirements_resolve_for_the_images_python_and_leave_nothing_unpinned(tmp_path):
    """pip resolves images/triton-requirements.txt as the build would, for Python 3.12 wheels on x86_64
    (a dry run into an empty target): every package resolves at its pin, and nothing else is pulled in."""
    import json

    report = tmp_path / "report.json"
    python = ".".join(str(part) for part in IMAGE_PYTHON)
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--target", str(tmp_path / "target"), "--python-version", python, "--only-binary=:all:"]
    command += [*_platforms(), "--report", str(report), "-r", REQUIREMENTS]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert chosen == pins()


@pytest.mark.slow
@needs_index
def test_the_pinned_onnxruntime_numpy_and_tokenizers_run_the_generate_model(tiny_model_dir, tmp_path):
    """model.py in a venv of the image's versions (onnxruntime's CPU build of the same release), on the fp16
    and fp32 exports: both generate, and fp32 answers as in this environment."""
    from tests.serving.helpers import make_export_dir

    found = pins()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wanted = [
        f"onnxruntime=={found['onnxruntime-gpu']}",
        f"numpy=={found['numpy']}",
        f"tokenizers=={found['tokenizers']}",
    ]
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", *wanted], capture_output=True, text=True, timeout=600
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    export = make_export_dir(tiny_model_dir, str(tmp_path / "export"))
    script = (
        "import sys; sys.path.insert(0, '.'); import model, onnxruntime; "
        "print(onnxruntime.__version__); "
        "print(model.Generator('.').generate(['What is two plus two?', 'Say hello.'], [6, 6], [0.0, 0.0]))"
    )
    answers = {}
    for variant in ("fp16", "fp32"):
        version_dir = tmp_path / "repo" / variant / "1"
        repository.write_generate_version(export, str(version_dir), variant)
        run = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script], cwd=version_dir, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr[-2000:]
        version, answers[variant] = run.stdout.splitlines()[-2:]
        assert version == found["onnxruntime-gpu"]
    sys.path.insert(0, str(tmp_path / "repo" / "fp32" / "1"))
    try:
        from trainer_lib.serving.triton_generate_model import Generator

        here = Generator(str(tmp_path / "repo" / "fp32" / "1")).generate(
            ["What is two plus two?", "Say hello."], [6, 6], [0.0, 0.0]
        )
    finally:
        sys.path.pop(0)
        sys.modules.pop("ort_generate", None)
    assert answers["fp32"] == str(here)


def test_the_cpu_triton_image_copies_what_its_context_has_and_pins_every_package():
    """images/Dockerfile.triton-cpu (make image-triton-cpu, context images/): every COPY source exists and
    every package it installs is pinned once."""
    with open(os.path.join(ROOT, "images", "Dockerfile.triton-cpu"), encoding="utf-8") as fh:
        text = fh.read()
    sources = [line.split()[1] for line in text.splitlines() if line.startswith("COPY ")]
    assert "triton-cpu-requirements.txt" in sources and "triton-cpu-start" in sources
    for source in sources:
        assert os.path.exists(os.path.join(ROOT, "images", source)), source
    assert "make image-triton-cpu" in text and "image-triton-cpu:" in makefile()
    with open(os.path.join(ROOT, "images", "triton-cpu-requirements.txt"), encoding="utf-8") as fh:
        pins = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    names = [canonicalize_name(pin.split("==")[0]) for pin in pins]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][^\s;]*", pin) for pin in pins) and len(set(names)) == len(names)
    assert {"nvidia-pytriton", "onnxruntime", "tokenizers", "numpy"} <= set(names)
    assert next(pin for pin in pins if pin.startswith("numpy==")).split("==")[1] < "2"
