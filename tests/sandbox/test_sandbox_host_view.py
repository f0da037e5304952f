"""What of the host a sandboxed program can reach, and what of its output leaves the sandbox.

With namespaces the program's root is a fresh tmpfs holding read-only binds of the interpreter's stdlib
and shared-library directories, four device nodes and its private /tmp: listing the host's /, /var,
/run, /home, /root or the evaluator's working directory shows nothing else, unix sockets on the host
cannot be reached by path, and a world-readable canary file cannot be read. Without namespaces (the
fallback) the audit hook refuses those reads, listings and sockets from Python. Either way, what the
program prints or raises reaches results and samples only redacted and cut to a bound.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from pathlib import Path

import pytest

from trainer_lib.eval.humaneval import evaluate
from trainer_lib.sandbox import Program, Sandbox, SandboxConfig
from trainer_lib.sandbox.pool import DETAIL_BYTES

CONFIG = SandboxConfig(timeout=3.0, memory_mb=256, keep_output_bytes=1 << 16)
HOST_PLACES = ["/", "/var", "/run", "/home", "/root", "/etc", "/proc", "/sys", "/work", "/dev", "/tmp"]


@pytest.fixture(scope="module")
def box():
    with Sandbox(CONFIG, max_workers=1) as sandbox:
        if not sandbox.isolation["filesystem"]:
            pytest.skip("no mount namespace here (the fallback is tested below)")
        yield sandbox


@pytest.fixture(scope="module")
def fallback():
    with Sandbox(dataclasses.replace(CONFIG, namespaces=False), max_workers=1) as sandbox:
        yield sandbox


@pytest.fixture
def planted(tmp_path):
    """A canary file (0644) and a world-writable unix-socket listener in each of tmp_path, a world-readable
    directory under /tmp and one under /var/tmp (outside /tmp, so no private /tmp hides it), and an
    abstract unix socket: what an agent's socket or a mounted service-account token looks like."""
    canary = f"canary-{uuid.uuid4().hex}"
    places = [tmp_path, Path(tempfile.mkdtemp(prefix="host-view-"))]
    if os.access("/var/tmp", os.W_OK):
        places.append(Path(tempfile.mkdtemp(prefix="host-view-", dir="/var/tmp")))
    files, listeners = [], []
    for place in places:
        place.chmod(0o755)
        token = place / "token"
        token.write_text(canary)
        token.chmod(0o644)
        files.append(str(token))
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(place / "agent.sock"))
        os.chmod(place / "agent.sock", 0o777)
        listeners.append(listener)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0posttrain-host-view-{uuid.uuid4().hex}")
    listeners.append(abstract)
    for listener in listeners:
        listener.listen(4)
        listener.setblocking(False)
    addresses = [listener.getsockname() for listener in listeners]
    addresses[-1] = addresses[-1].decode("latin-1") if isinstance(addresses[-1], bytes) else addresses[-1]
    yield canary, files, addresses, listeners
    for listener in listeners:
        listener.close()
    for place in places[1:]:
        shutil.rmtree(place, ignore_errors=True)


def _allowed_roots() -> list[str]:
    """What the sandbox may show, found independently of it: the stdlib, the directories of what ``ldd``
    lists for the interpreter and the stdlib's extension modules, and locale data; plus the program's own
    /tmp and /dev."""
    if not shutil.which("ldd"):
        pytest.skip("ldd is not installed")
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    roots = {stdlib, "/usr/lib/locale", "/tmp", "/dev"}
    binaries = [os.path.realpath(sys.executable), *map(str, Path(stdlib, "lib-dynload").glob("*.so"))]
    ldd = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    for line in ldd.splitlines():
        if line.endswith(":"):  # the name of the next binary ldd reports on
            continue
        path = next((word for word in line.split() if word.startswith("/")), None)
        if path:
            roots.add(os.path.dirname(os.path.realpath(path)))
    return sorted(roots)


def _covered(path: str, roots: list[str]) -> bool:
    """Under an allowed root, or a directory on the way to one."""
    return any(path == r or path.startswith(r.rstrip("/") + "/") or r.startswith(path.rstrip("/") + "/") for r in roots)


def _listing_program(places: list[str], roots: list[str]) -> str:
    return f"""
import json, os
places, roots, seen = {places!r}, {roots!r}, {{}}
for place in places:
    try:
        seen[place] = sorted(os.listdir(place))
    except OSError as exc:
        seen[place] = type(exc).__name__
walked = []
for folder, dirs, files in os.walk("/"):
    inside = [d for d in dirs if any(os.path.join(folder, d).startswith(r.rstrip("/") + "/") or
                                     os.path.join(folder, d) == r for r in roots)]
    dirs[:] = [d for d in dirs if d not in inside]
    walked += [os.path.join(folder, name) for name in dirs + files]
print(json.dumps({{"seen": seen, "walked": walked}}))
"""


def test_the_sandbox_shows_only_the_interpreter_stdlib_and_its_own_tmp(box, planted, tmp_path):
    canary, files, _, _ = planted
    roots = _allowed_roots()
    places = HOST_PLACES + [os.getcwd(), str(tmp_path), os.path.dirname(files[-1]), os.path.expanduser("~")]
    result = box.run(Program(_listing_program(places, roots), ("assert True",)))
    assert result.passed, (result.status, result.detail, result.output[-500:])
    assert result.filesystem_isolated and canary not in result.output
    report = json.loads(result.output)
    for place, entries in report["seen"].items():
        if isinstance(entries, str):  # the place does not exist in the sandbox
            assert entries == "FileNotFoundError", (place, entries)
            continue
        stray = [e for e in entries if not _covered(os.path.join(place, e), roots)]
        assert not stray, f"{place} shows host files: {stray}"
    for place in ("/var", "/run", "/home", "/etc", "/proc", os.getcwd(), str(tmp_path)):
        if not _covered(place, roots):
            assert report["seen"][place] == "FileNotFoundError", place
    assert set(report["seen"]["/dev"]) <= {"null", "zero", "random", "urandom"}
    assert report["seen"]["/tmp"] == []  # its own tmpfs, not the host's /tmp
    stray = [path for path in report["walked"] if not _covered(path, roots)]
    assert not stray, f"the sandbox root holds host paths: {stray[:20]}"
    # and the program can still import an extension module that links a system library
    assert box.run(Program("import zlib, _hashlib\nx = zlib.crc32(b'a')", ("assert x == 3904355907",))).passed


def _connect_program(addresses: list[str]) -> str:
    return f"""
import socket
for address in {addresses!r}:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(1)
        s.connect(address)
        s.sendall(b"hello")
        print("CONNECTED", repr(address))
    except OSError as exc:
        print("refused", repr(address), type(exc).__name__)
"""


@pytest.mark.parametrize("path", ["namespaces", "fallback"])
def test_unix_sockets_of_the_host_are_out_of_reach(path, request, planted):
    sandbox = request.getfixturevalue("box" if path == "namespaces" else "fallback")
    _, _, addresses, listeners = planted
    result = sandbox.run(Program(_connect_program(addresses), ("assert True",)))
    assert "CONNECTED" not in result.output, result.output
    # it tried every address: without namespaces the audit hook refuses socket() itself (PermissionError)
    assert result.passed and result.output.count("refused") == len(addresses), result.output
    if path == "fallback":
        assert result.output.count("PermissionError") == len(addresses)
    for listener in listeners:
        with pytest.raises(BlockingIOError):
            listener.accept()


def _reader_program(files: list[str]) -> str:
    """A HumanEval answer that tries to exfiltrate the files through its output and its exception."""
    return f"""
import os
found = []
for path in {files!r}:
    for attempt in (lambda: open(path).read(), lambda: os.listdir(os.path.dirname(path))):
        try:
            found.append(repr(attempt()))
        except OSError as exc:
            found.append(type(exc).__name__)
print("FOUND", found)

def add(a, b):
    raise ValueError("leak: " + " ".join(found))
"""


@pytest.mark.parametrize("path", ["namespaces", "fallback"])
def test_a_planted_world_readable_file_never_reaches_the_samples(path, request, planted):
    sandbox = request.getfixturevalue("box" if path == "namespaces" else "fallback")
    canary, files, _, _ = planted
    problems = {"t/0": {"task_id": "t/0", "prompt": "", "entry_point": "add", "test": TEST}}
    samples = [{"task_id": "t/0", "completion": _reader_program(files)}]
    _, _, rows = evaluate(samples, problems, ks=(1,), sandbox=sandbox)
    (row,) = rows
    assert row["status"] == "error" and "leak:" in row["detail"]  # the program ran and raised
    assert canary not in json.dumps(rows)
    result = sandbox.run(Program(_reader_program(files), ("add(1, 2)",)))
    assert "FOUND" in result.output and canary not in result.output + result.detail
    # not there (its own root, or as root without namespaces a chroot into its directory), or refused by the hook
    expected = "FileNotFoundError" if path == "namespaces" or sandbox.isolation["chroot"] else "PermissionError"
    assert result.output.count(expected) == 2 * len(files), result.output


TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"


def test_output_and_exceptions_are_redacted_and_bounded(box, monkeypatch):
    secret = f"sandbox-redaction-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
    keep = CONFIG.keep_output_bytes
    source = (
        f"print({secret!r}, {jwt!r}, 'AKIAABCDEFGHIJKLMNOP')\n"
        f"print('x' * ({keep} - 20) + {secret!r})\n"  # the secret straddles the cut
        f"print('y' * 300000)\n"
        f"raise ValueError({secret!r} + ' token=abc123 ' + 'z' * 100000)\n"
    )
    result = box.run(Program(source, ("assert True",)))
    assert result.status == "error" and "ValueError" in result.detail
    text = result.output + result.detail
    assert secret[:10] not in text and jwt[:20] not in text and "AKIAABCDEFGHIJKLMNOP" not in text
    assert "abc123" not in result.detail and "***" in result.output and "***" in result.detail
    assert len(result.output.encode()) <= keep and result.output.endswith("[cut]")
    assert len(result.detail.encode()) <= DETAIL_BYTES


def test_the_fallback_hides_host_paths_as_root_and_not_otherwise(fallback, planted):
    """Without a mount namespace, root chroots the program into its own directory: no host path exists
    for it, even for native code. Without root that is the known gap of the threat model: os.stat raises no
    audit event, so the program learns which host paths exist (it cannot read or list them from Python)."""
    _, files, _, _ = planted
    result = fallback.run(Program(f"import os\nprint(os.path.exists({files[-1]!r}))", ("assert True",)))
    assert result.passed and result.output.strip() == ("False" if fallback.isolation["chroot"] else "True")
    assert fallback.isolation["chroot"] == (os.geteuid() == 0)


def test_native_code_the_program_writes_cannot_be_loaded(box):
    """Its /tmp is noexec: an extension module it copies or writes there fails to map."""
    source = (
        "import os, sys, zlib\n"
        "name = os.path.basename(zlib.__file__)\n"
        "open(name, 'wb').write(open(zlib.__file__, 'rb').read())\n"
        "del sys.modules['zlib']\n"
        "sys.path.insert(0, os.getcwd())\n"
        "import zlib\n"
    )
    result = box.run(Program(source, ("assert True",)))
    assert result.status == "error" and "ImportError" in result.detail and "failed to map" in result.detail
