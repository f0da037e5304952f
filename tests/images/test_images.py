"""images/ and requirements.lock without a Docker engine: what the build would copy, install and run as.

The lock is the one list of versions that ``make setup`` and both image builds install with
(``-c requirements.lock``); the slow test resolves it with pip as the builds would.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "images", "Dockerfile")
LOCK = os.path.join(ROOT, "requirements.lock")


def stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined, comments dropped), one list per stage."""
    with open(DOCKERFILE, encoding="utf-8") as fh:
        text = re.sub(r"\\\n", " ", "".join(line for line in fh if not line.lstrip().startswith("#")))
    out: list[list[str]] = []
    for line in filter(None, (line.strip() for line in text.splitlines())):
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def named_stages() -> dict[str, list[str]]:
    """:func:`stages` by their ``AS`` name; the last one (the image) is ``runtime``."""
    found = stages()
    named = {}
    for stage in found[:-1]:
        words = stage[0].split()
        assert len(words) == 4 and words[2].upper() == "AS", f"every stage but the last is named: {stage[0]}"
        named[words[3]] = stage
    assert len(found[-1][0].split()) == 2, "the last stage (the image) has no name"
    return {**named, "runtime": found[-1]}


def global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    with open(DOCKERFILE, encoding="utf-8") as fh:
        head = fh.read().split("\nFROM ", 1)[0]
    return dict(re.findall(r'^ARG (\w+)="?([^"\n]*)"?$', head, re.MULTILINE))


def locked() -> dict[str, str]:
    with open(LOCK, encoding="utf-8") as fh:
        pins = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][^\s;+]*", pin) for pin in pins), "name==version lines only"
    return {canonicalize_name(pin.split("==")[0]): pin.split("==")[1] for pin in pins}


def declared() -> list[Requirement]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in project["dependencies"] + extras["tracking"] + extras["test"]]


def test_every_file_the_build_copies_from_the_context_exists():
    copies = [line.split()[1:] for stage in stages() for line in stage if line.upper().startswith("COPY ")]
    sources = [src for args in copies if not any(a.startswith("--from") for a in args) for src in args[:-1]]
    assert {"requirements.lock", "pyproject.toml", "trainer_lib", "components", "pipelines"} <= set(sources)
    for source in sources:
        assert os.path.exists(os.path.join(ROOT, source)), f"images/Dockerfile copies {source}, which is not there"


def test_the_runtime_stage_has_no_compiler_and_runs_as_a_user():
    named = named_stages()
    runtime = named["runtime"]
    assert any("g++" in line for line in named["toolchain-cpu"])  # DeepSpeed's ops are compiled after this...
    assert not any(
        re.search(r"apt-get install|apk add|\bg\+\+|gcc|build-essential", line)
        for line in runtime
        if not line.startswith("RUN python3 -c")
    )  # ...and nothing installs one here
    assert "COPY --from=build /opt/posttrain /opt/posttrain" in runtime
    users = [line.split()[1] for line in runtime if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("0", "root"), "the image must end as a non-root user"


def test_make_and_both_builds_install_with_the_lock():
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        makefile = fh.read()
    installs = [line for line in makefile.splitlines() if "pip install" in line and "-e '." in line]
    assert installs and all("-c $(LOCK)" in line for line in installs)
    ds_build = re.search(r"^DS_BUILD\s*:=((?:.*\\\n)*.*)", makefile, re.MULTILINE).group(1)
    assert "pip install" in ds_build and "-c $(LOCK)" in ds_build  # deepspeed, with its ops: the lock too
    assert "LOCK := requirements.lock" in makefile
    pip_lines = [line for stage in stages() for line in stage if "pip install" in line]
    assert pip_lines and all(
        line.count("pip install") == line.count("pip install -c requirements.lock")
        or "--no-build-isolation -c requirements.lock" in line
        for line in pip_lines
    )
    assert "$(call image_build,cuda,$(CUDA_TORCH_INDEX)," in makefile  # the CUDA build (cu128 by default)
    assert "--build-arg TORCH_INDEX_URL=$(2)" in makefile


def test_the_lock_pins_every_declared_dependency_within_its_range():
    pins = locked()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is declared in pyproject.toml but not pinned in requirements.lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )
    assert pins["torch"] == "2.13.0"  # without +cpu: the CUDA build's 2.13.0+cu128 matches it too


def test_this_environment_was_installed_from_the_lock():
    """``make setup`` installs with ``-c requirements.lock``: every locked package here is at its pin
    (so on CI the lock resolved, from the registries, on every run)."""
    from importlib.metadata import distributions

    pins = locked()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    declared_names = {canonicalize_name(r.name) for r in declared()}
    assert declared_names <= set(installed), "run make setup"
    drift = {
        name: (installed[name], pins[name]) for name in declared_names if installed[name].split("+")[0] != pins[name]
    }
    assert not drift, f"installed != locked (run make setup, or make lock after changing pyproject.toml): {drift}"


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("POSTTRAIN_CHECK_LOCK"),
    reason="resolves against the package index (~1 min, network): make lock-check",
)
def test_the_lock_resolves_and_leaves_nothing_unpinned(tmp_path):
    """pip resolves the project with the lock as constraints (a dry run, as ``make setup`` would install)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "-c",
            LOCK,
            f"{ROOT}[test,tracking]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    pins = locked()
    chosen = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    chosen.pop("posttrain")
    unpinned = sorted(set(chosen) - set(pins))
    assert not unpinned, f"resolved but not in requirements.lock (run 'make lock'): {unpinned}"
    assert all(version.split("+")[0] == pins[name] for name, version in chosen.items())


# --------------------------------------------------------------------------------- DeepSpeed's ops

#: DeepSpeed's optimizer classes and the op (DS_BUILD_<OP>) each one loads when constructed.
OP_OF_OPTIMIZER = {
    "DeepSpeedCPUAdam": "CPU_ADAM",
    "DeepSpeedCPUAdagrad": "CPU_ADAGRAD",
    "DeepSpeedCPULion": "CPU_LION",
    "FusedAdam": "FUSED_ADAM",
    "FusedLamb": "FUSED_LAMB",
    "FusedLion": "FUSED_LION",
}


def build_vars(accelerator: str) -> set[str]:
    """The <OP> of every DS_BUILD_<OP> the installed deepspeed knows for ``accelerator`` (its builders'
    BUILD_VAR; the CUDA accelerator takes the host-side optimizers' builders from the CPU ones)."""
    import importlib.util
    from pathlib import Path

    root = Path(importlib.util.find_spec("deepspeed").origin).parent / "ops" / "op_builder"
    host_side = [root / "cpu" / f"{name}.py" for name in ("cpu_adam", "cpu_adagrad", "cpu_lion")]
    files = list((root / "cpu").glob("*.py")) if accelerator == "cpu" else [*root.glob("*.py"), *host_side]
    pattern = r"BUILD_VAR = [\"']DS_BUILD_(\w+)[\"']"
    return {name for path in files for name in re.findall(pattern, path.read_text(encoding="utf-8"))}


def ds_ops() -> dict[str, list[str]]:
    """Each build's DS_OPS (the ENV of its toolchain stage)."""
    named = named_stages()
    found = {}
    for accelerator in ("cpu", "cuda"):
        values = [re.search(r'DS_OPS="([^"]*)"', line) for line in named[f"toolchain-{accelerator}"]]
        found[accelerator] = [match.group(1).split() for match in values if match][-1]
    return found


def test_both_builds_prebuild_every_op_posttrain_can_load():
    ops = ds_ops()
    for accelerator, names in ops.items():
        unknown = set(names) - build_vars(accelerator)
        assert not unknown, f"the installed deepspeed has no DS_BUILD_{unknown} for {accelerator}"
    # the engine's optimizers: DeepSpeedCPUAdam (engine.offload_optimizer) runs on the host in both builds
    used = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "trainer_lib")):
        for name in (f for f in files if f.endswith(".py")):
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                used |= {cls for cls in OP_OF_OPTIMIZER if re.search(rf"\b{cls}\b", fh.read())}
    assert "DeepSpeedCPUAdam" in used
    for cls in used:
        op = OP_OF_OPTIMIZER[cls]
        assert op in ops["cuda"] and (op in ops["cpu"] or not op.startswith("CPU_")), f"{cls} needs {op}"
    assert "SHM_COMM" in ops["cpu"]  # DeepSpeed loads it in every CPU run (deepspeed.comm.torch)
    assert "FUSED_ADAM" in ops["cuda"]
    # make setup builds the CPU image's set into .venv: the tests run what the image ships
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        assert re.search(r"^DS_OPS\s*:=(.*)$", fh.read(), re.MULTILINE).group(1).split() == ops["cpu"]


def test_the_build_compiles_the_ops_and_fails_unless_each_one_loads():
    named = named_stages()
    build, runtime = named["build"], named["runtime"]
    assert global_args()["DS_ACCELERATOR"] == "cpu"
    assert build[0] == "FROM toolchain-${DS_ACCELERATOR} AS build"
    (install,) = [line for line in build if "DS_BUILD_${op}=1" in line]
    assert "for op in ${DS_OPS}" in install and "--no-build-isolation" in install  # setup.py sees our torch
    assert "DS_ACCELERATOR=${DS_ACCELERATOR}" in install and "PATH=/opt/portable-cc:$PATH" in install
    assert "CC=/opt/portable-cc/gcc CXX=/opt/portable-cc/g++" in install  # torch's and distutils' compilers
    (gate,) = [line for line in build if "check_ds_ops.py ${DS_OPS}" in line]
    assert build.index(gate) > build.index(install) and "ds_report" in gate
    assert "DS_ACCELERATOR=${DS_ACCELERATOR}" in gate
    assert "COPY images/check_ds_ops.py /opt/posttrain/bin/check_ds_ops.py" in build  # ships in the venv
    # the runtime stage, which has no compiler, loads every prebuilt op again
    (smoke,) = [line for line in runtime if line.startswith("RUN python3 -c")]
    assert "check_ds_ops.py --installed" in smoke and "DS_ACCELERATOR=${DS_ACCELERATOR}" in smoke
    assert all(f"! command -v {cc}" in smoke for cc in ("gcc", "g++", "cc", "c++", "nvcc"))
    assert "ARG DS_ACCELERATOR" in runtime


def test_the_cuda_build_compiles_with_nvcc_into_the_runtime_python():
    named, args = named_stages(), global_args()
    cuda = named["toolchain-cuda"]
    # the venv's Python and the ops' libstdc++ are BASE_IMAGE's, the one the runtime stage runs
    assert named["toolchain-cpu"][0] == "FROM ${BASE_IMAGE} AS toolchain-cpu"
    assert named["runtime"][0] == "FROM ${BASE_IMAGE}"
    assert cuda[0] == "FROM toolchain-cpu AS toolchain-cuda"
    # nvcc, headers and libcudart from a CUDA devel image of torch's CUDA version (cu128 <-> 12.8)
    assert named["cuda-devel"][0] == "FROM ${CUDA_DEVEL_IMAGE} AS cuda-devel"
    version = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-devel-ubuntu[\d.]+", args["CUDA_DEVEL_IMAGE"]).groups()
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        makefile = fh.read()
    assert f"CUDA_TORCH_INDEX ?= https://download.pytorch.org/whl/cu{''.join(version)}\n" in makefile
    assert f"CUDA_TAG ?= cu{''.join(version)}\n" in makefile
    copied = [line.split()[2] for line in cuda if line.startswith("COPY --from=cuda-devel")]
    assert "/usr/local/cuda/bin" in copied and any("libcudart.so" in path for path in copied)
    assert any("nvcc --version" in line for line in cuda) and any("CUDA_HOME=/usr/local/cuda" in line for line in cuda)
    # every GPU arch >= 8.0: an op built for any 7.x loses bf16 (DeepSpeed's builder)
    archs = args["CUDA_ARCHS"].split(";")
    assert "9.0" in archs and all(float(arch.removesuffix("+PTX")) >= 8.0 for arch in archs)
    assert any("TORCH_CUDA_ARCH_LIST=${CUDA_ARCHS}" in line for line in cuda)
    # the runtime stage takes the venv, nothing of the toolchains
    assert [line for line in named["runtime"] if line.startswith("COPY")] == [
        "COPY --from=build /opt/posttrain /opt/posttrain"
    ]


def test_the_cpu_ops_are_compiled_for_a_fixed_cpu_not_the_build_machine(tmp_path):
    """images/portable-cc swaps DeepSpeed's -march=native and SIMD width for DS_CPU_MARCH/DS_CPU_SIMD."""
    wrapper_src = os.path.join(ROOT, "images", "portable-cc")
    assert os.access(wrapper_src, os.X_OK)
    real = tmp_path / "real"
    real.mkdir()
    (real / "g++").write_text('#!/bin/sh\nfor arg in "$@"; do echo "$arg"; done\n', encoding="utf-8")
    (real / "g++").chmod(0o755)
    wrapper = tmp_path / "g++"
    wrapper.write_bytes(open(wrapper_src, "rb").read())
    wrapper.chmod(0o755)
    args = ["-O3", "-march=native", "-fopenmp", "-D__AVX512__", "-DBF16_AVAILABLE", "my file.cpp"]
    env = {"PATH": os.environ["PATH"], "PORTABLE_CC_REAL_DIR": str(real)}

    def run(**extra) -> list[str]:
        out = subprocess.run([str(wrapper), *args], env={**env, **extra}, capture_output=True, text=True, check=True)
        return out.stdout.splitlines()

    swapped = ["-O3", "-march=x86-64-v3", "-fopenmp", "-D__AVX256__", "-DBF16_AVAILABLE", "my file.cpp"]
    assert run(DS_CPU_MARCH="x86-64-v3", DS_CPU_SIMD="__AVX256__") == swapped
    assert run() == args  # unset: the compiler gets what DeepSpeed asked for
    build = named_stages()["build"]
    assert "ARG DS_CPU_MARCH=x86-64-v3" in build and "ARG DS_CPU_SIMD=__AVX256__" in build
    toolchain = named_stages()["toolchain-cpu"]
    assert "COPY images/portable-cc /opt/portable-cc/gcc" in toolchain
    assert any(
        'for name in g++ cc c++; do cp /opt/portable-cc/gcc "/opt/portable-cc/$name"' in line for line in toolchain
    )


def make_images() -> set[str]:
    """The tags the Makefile's image targets build (make -n: the variables as make expands them)."""
    tags = set()
    for target in ("image-cpu", "image-cuda", "image-triton"):
        out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        tags |= set(re.findall(r" -t (\S+) ", out))
    return tags


def test_the_pypi_cuda_devel_image_lays_out_what_the_cuda_toolchain_copies():
    """images/Dockerfile.cuda-pypi stands in for NVIDIA's devel image: each path toolchain-cuda copies from
    CUDA_DEVEL_IMAGE is one it fills from PyPI's CUDA wheels, at the toolkit version make asks for."""
    copied = [line.split()[2] for line in named_stages()["toolchain-cuda"] if line.startswith("COPY --from=cuda-devel")]
    assert copied == [
        "/usr/local/cuda/bin",
        "/usr/local/cuda/nvvm",
        "/usr/local/cuda/targets/x86_64-linux/include",
        "/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so*",
    ]
    with open(os.path.join(ROOT, "images", "Dockerfile.cuda-pypi"), encoding="utf-8") as fh:
        text = re.sub(r"\\\n", " ", "".join(line for line in fh if not line.lstrip().startswith("#")))
    assert 'cp -a "$wheels/bin" "$wheels/nvvm" /usr/local/cuda/' in text
    assert "target=/usr/local/cuda/targets/x86_64-linux" in text
    assert 'cp -a "$wheels/include" "$target/"' in text and 'cp -a "$wheels"/lib/libcudart* "$target/lib/"' in text
    # torch's ATen/cuda headers include these libraries' headers (cusparse.h, cublas_v2.h, ...)
    assert "cuda-toolkit[nvcc,cccl,crt,cudart,cublas,cusparse,cusolver,curand]==${CUDA_TOOLKIT}" in text
    assert 'ln -s "libcudart.so.${CUDA_TOOLKIT%%.*}" "$target/lib/libcudart.so"' in text
    assert "/usr/local/cuda/bin/nvcc --version" in text
    (default,) = re.findall(r"^ARG CUDA_TOOLKIT=(\S+)$", text, re.MULTILINE)
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as fh:
        assert f"CUDA_TOOLKIT ?= {default}\n" in fh.read()


def test_the_cuda_build_takes_no_cpu_torch_wheel_and_passes_its_toolchain_args():
    """A CPU torch wheel among the build's local wheels (pip's find-links, the default TORCH_WHEELS) would sort
    above the CUDA build of its version."""
    out = subprocess.run(
        ["make", "-n", "image-cuda", "CUDA_DEVEL_IMAGE=localhost/cuda-devel-pypi:13.0.3"]
        + ["CUDA_TORCH_INDEX=https://pypi.org/simple", "CUDA_TAG=cu130", "CUDA_ARCHS=9.0"],
        env={**os.environ, "PIP_FIND_LINKS": "/opt/wheels"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "/opt/wheels" not in out and "torch-" not in out
    assert "--build-arg CUDA_DEVEL_IMAGE=localhost/cuda-devel-pypi:13.0.3" in out
    assert '--build-arg "CUDA_ARCHS=9.0"' in out and "TORCH_INDEX_URL=https://pypi.org/simple" in out
    assert "-t ghcr.io/posttrain/posttrain:0.1.0-cu130 ." in out


def test_every_image_the_compiled_pipelines_and_manifests_name_is_one_make_builds():
    built = make_images()
    assert {f"ghcr.io/posttrain/posttrain{suffix}" for suffix in (":0.1.0", ":0.1.0-cu128", "-triton:0.1.0")} <= built
    named = {}
    for folder in ("pipelines/compiled", "manifests"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in (f for f in files if f.endswith((".yaml", ".yml", ".json"))):
                with open(os.path.join(base, name), encoding="utf-8") as fh:
                    for image in re.findall(r'"?image"?:\s*"?([\w.\-/]+:[\w.\-]+)', fh.read()):
                        named.setdefault(image, os.path.relpath(os.path.join(base, name), ROOT))
    assert len(named) >= 3, named  # the CPU, CUDA and Triton images at least
    unbuilt = {image: where for image, where in named.items() if image not in built}
    assert not unbuilt, f"images no make target builds: {unbuilt}"


def test_caches_go_to_the_volume_a_cluster_mounts_its_cache_at():
    """A read-only root still has a writable cache, at the path pipelines/settings.py mounts a shared PVC at."""
    from pipelines.settings import MODEL_CACHE_PATH

    runtime = " ".join(named_stages()["runtime"])
    assert f"VOLUME {MODEL_CACHE_PATH}" in runtime
    for variable, value in (("POSTTRAIN_CACHE", "/posttrain"), ("HF_HOME", "/huggingface"), ("XDG_CACHE_HOME", "")):
        assert f"{variable}={MODEL_CACHE_PATH}{value} " in runtime + " ", variable
    assert f"chown posttrain:posttrain /gcs /minio /s3 {MODEL_CACHE_PATH}" in runtime


def test_the_dependencies_and_ops_are_built_before_the_sources_are_copied():
    """A change to trainer_lib/, components/ or pipelines/ rebuilds the layers after it: never DeepSpeed's ops."""
    build = named_stages()["build"]
    (compile_ops,) = [i for i, line in enumerate(build) if "DS_BUILD_${op}=1" in line]
    sources = [i for i, line in enumerate(build) if line.startswith("COPY ") and line.split()[1] != "pyproject.toml"]
    copied = [build[i].split()[1] for i in sources if i > compile_ops]
    assert copied[:3] == ["trainer_lib", "components", "pipelines"]
    assert "-r /tmp/requirements.txt" in build[compile_ops] and "['tracking']" in build[compile_ops]
    (package,) = [line for line in build if "pip install --no-deps" in line]
    assert build.index(package) > build.index("COPY pipelines ./pipelines")
