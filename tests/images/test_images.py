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
    build, runtime = stages()
    assert any("g++" in line for line in build)  # DeepSpeed's op is compiled here...
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
    assert "LOCK := requirements.lock" in makefile
    pip_lines = [line for stage in stages() for line in stage if "pip install" in line]
    assert pip_lines and all(
        line.count("pip install") == line.count("pip install -c requirements.lock")
        or "--no-build-isolation -c requirements.lock" in line
        for line in pip_lines
    )
    assert "--build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128" in makefile  # the CUDA build


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
