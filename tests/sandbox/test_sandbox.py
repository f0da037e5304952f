"""The sandbox against honest programs, the hostile corpus (tests/sandbox/corpus) and its own limits."""

from __future__ import annotations

import ast
import os
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO
from trainer_lib.eval.humaneval import build_program
from trainer_lib.sandbox import Program, Sandbox, SandboxConfig, run_many, run_program

REPO = Path(REPO)
CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.py"))
IS_ROOT = os.geteuid() == 0
ADD_PROBLEM = {
    "prompt": "",
    "entry_point": "add",
    "test": (
        "import math\n\n"
        "def check(candidate):\n"
        "    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n"
        "    assert candidate(2, 3) == 5\n"
        "    assert math.isclose(candidate(1.5, 1.5), 3.0)\n"
    ),
}
HONEST_ADD = "def add(a, b):\n    return a + b\n"
CONFIG = SandboxConfig(timeout=1.5, memory_mb=256)


@pytest.fixture(scope="module")
def box():
    with Sandbox(CONFIG, max_workers=2) as sandbox:
        yield sandbox


@pytest.fixture
def outside(tmp_path):
    """What hostile programs aim at: a sentinel file, a world-writable directory outside /tmp (so only
    the read-only mounts stop writes there), and a TCP listener of this process."""
    base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else str(tmp_path)
    world = Path(tempfile.mkdtemp(prefix="sandbox-test-", dir=base))
    world.chmod(0o777)
    (world / "keep.txt").write_text("keep")
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("precious")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    marker = f"sandbox_pwned_{uuid.uuid4().hex[:8]}"
    subs = {
        "@@SENTINEL@@": str(sentinel),
        "@@OUTSIDE@@": str(world),
        "@@REPO@@": str(REPO),
        "@@MARKER@@": marker,
        "@@PORT@@": str(listener.getsockname()[1]),
    }
    yield subs, sentinel, world, listener, marker
    listener.close()
    for path in world.iterdir():
        path.unlink()
    world.rmdir()


def _fill(text: str, subs: dict) -> str:
    for key, value in subs.items():
        text = text.replace(key, value)
    return text


def _expected(path: Path) -> set[str]:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return set(first[len("# expect: ") :].split(","))


def _assert_nothing_changed(sentinel, world, listener, marker):
    assert sentinel.read_text() == "precious"
    assert sorted(p.name for p in world.iterdir()) == ["keep.txt"]
    assert (world / "keep.txt").read_text() == "keep"
    assert world.stat().st_mode & 0o777 == 0o777
    for folder in ("/tmp", "/var/tmp", "/dev/shm", str(REPO), "/", "/etc", os.path.expanduser("~")):
        assert not os.path.exists(os.path.join(folder, marker)), folder
    with pytest.raises(BlockingIOError):
        listener.accept()


# ------------------------------------------------------------------------------------------ honest code


def test_passing_failing_and_partial_programs(box):
    source = "def double(x):\n    return 2 * x if x < 3 else 0\nprint('hello')\n"
    tests = ("assert double(1) == 2", "assert double(2) == 4", "assert double(5) == 10")
    result = box.run(Program(source, tests))
    assert (result.passed, result.status, result.tests) == (False, "failed", (True, True, False))
    assert result.pass_fraction == pytest.approx(2 / 3)
    assert result.output == "hello\n" and "test 2: AssertionError" in result.detail
    ok = box.run(Program(source, tests[:2]))
    assert ok.passed and ok.status == "passed" and ok.pass_fraction == 1.0 and ok.exit_code == 0
    error = box.run(Program(source, ("assert double('x') == 0", "assert undefined_name")))
    assert error.status == "error" and error.tests == (False, False) and "TypeError" in error.detail


def test_isolation_is_reported(box):
    result = box.run("pass")
    assert result.passed
    for flag in (result.network_isolated, result.filesystem_isolated, result.user_isolated):
        assert isinstance(flag, bool)
    if IS_ROOT:  # as root on Linux every layer must be active (CI runs as root)
        assert result.network_isolated and result.filesystem_isolated and result.user_isolated


def test_humaneval_style_program_and_common_stdlib(box):
    completion = (
        "    from collections import namedtuple\n    import typing, enum, re, fractions\n"
        "    P = namedtuple('P', 'x')\n    T = typing.TypeVar('T')\n"
        "    E = enum.Enum('E', 'a b')\n    return P(a).x + b\n"
    )
    problem = dict(ADD_PROBLEM, prompt='def add(a, b):\n    """Add."""\n')
    assert box.run(build_program(problem, completion)).passed
    assert box.run(build_program(ADD_PROBLEM, HONEST_ADD)).passed


def test_environment_holds_nothing_inherited(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sandbox-test-secret")
    monkeypatch.setenv("HF_TOKEN", "sandbox-test-token")
    result = run_program("import os\nprint(sorted(os.environ))\nprint(dict(os.environ))", timeout=5)
    assert result.passed
    assert "sandbox-test" not in result.output
    names = ast.literal_eval(result.output.splitlines()[0])
    assert set(names) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR"}


@pytest.mark.skipif(not IS_ROOT, reason="network namespaces need root here")
def test_no_network_in_the_sandbox():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    with listener:
        result = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert result.network_isolated
        assert result.status == "error" and "OSError" in result.detail  # network unreachable
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_run_many_keeps_order_and_runs_in_parallel():
    programs = [
        Program(f"import time\ntime.sleep(0.3)\nx = {i}", (f"assert x == {i}", "assert x % 2 == 0")) for i in range(6)
    ]
    started = time.monotonic()
    results = run_many(programs, timeout=5, max_workers=3)
    elapsed = time.monotonic() - started
    assert [r.tests for r in results] == [(True, i % 2 == 0) for i in range(6)]
    assert [r.pass_fraction for r in results] == [1.0, 0.5] * 3
    assert elapsed < 6 * 0.3  # three at a time, not one after another


def test_throughput(box, capsys):
    programs = [Program("def f(x):\n    return x + 1\n", ("assert f(1) == 2",))] * 200
    box.run_many(programs[:4])  # warm both workers
    started = time.monotonic()
    results = box.run_many(programs)
    rate = len(programs) / (time.monotonic() - started)
    assert all(r.passed for r in results)
    with capsys.disabled():
        print(f"\nsandbox throughput: {rate:.0f} programs/s with 2 workers")
    assert rate > 20


# ------------------------------------------------------------------------------------- hostile corpus


def test_corpus_is_complete():
    names = {p.stem for p in CORPUS}
    assert {
        "infinite_loop",
        "fork_bomb",
        "memory_bomb",
        "write_outside",
        "delete_outside",
        "socket_connect",
        "read_secrets",
        "print_flood",
        "kill_parent",
        "sys_exit_zero",
        "os_exit_zero",
        "patch_builtins",
        "redefine_check",
        "exit_in_finally",
        "ctypes_memory",
        "frame_walk",
        "fake_verdict",
    } <= names


def test_hostile_corpus_fails_and_is_contained(box, outside, monkeypatch):
    subs, sentinel, world, listener, marker = outside
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corpus-secret")
    programs = [build_program(ADD_PROBLEM, _fill(path.read_text(), subs)) for path in CORPUS]
    results = box.run_many(programs)
    report = {p.stem: (r.status, r.detail[:100]) for p, r in zip(CORPUS, results)}
    for path, result in zip(CORPUS, results):
        assert not result.passed, (path.stem, report[path.stem])
        assert result.status in _expected(path), (path.stem, report[path.stem])
        assert "corpus-secret" not in result.output, path.stem
        assert "CONNECTED" not in result.output, path.stem
    _assert_nothing_changed(sentinel, world, listener, marker)
    # the evaluator (this process) is alive, and so is the sandbox
    assert box.run(build_program(ADD_PROBLEM, HONEST_ADD)).passed


@pytest.mark.skipif(not IS_ROOT, reason="the OS layers need root here")
def test_os_layers_contain_the_corpus_without_the_audit_hook(outside, monkeypatch):
    """The audit hook only guards the verdict; containment must hold without it. Verdicts may then be
    forged (frame_walk, signal_frame) - that is what the hook is for - but nothing else may change."""
    subs, sentinel, world, listener, marker = outside
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corpus-secret")
    config = SandboxConfig(timeout=1.5, memory_mb=256, audit_hook=False)
    programs = [build_program(ADD_PROBLEM, _fill(path.read_text(), subs)) for path in CORPUS]
    with Sandbox(config, max_workers=2) as unguarded:
        results = unguarded.run_many(programs)
        forged = {p.stem for p, r in zip(CORPUS, results) if r.passed}
        assert forged <= {"frame_walk", "signal_frame", "gc_walk"}, forged
        assert "frame_walk" in forged  # documents why the hook exists
        by_name = {p.stem: r for p, r in zip(CORPUS, results)}
        assert by_name["fork_bomb"].status == "error" and "BlockingIOError" in by_name["fork_bomb"].detail
        for result in results:
            assert "corpus-secret" not in result.output and "CONNECTED" not in result.output
        _assert_nothing_changed(sentinel, world, listener, marker)
        assert unguarded.run(build_program(ADD_PROBLEM, HONEST_ADD)).passed


def test_known_gap_objects_that_lie_about_equality(box):
    """Not covered (see the threat model): a result whose __eq__ always says True passes ``==`` checks."""
    liar = "class Yes:\n    def __eq__(self, other):\n        return True\n\ndef add(a, b):\n    return Yes()\n"
    result = box.run(Program(liar, ("assert add(2, 3) == 5",)))
    assert result.passed


def test_a_dead_worker_is_replaced(box):
    # kill every worker process from outside; the next runs must still work
    for worker in list(box._workers):
        worker.proc.kill()
        worker.proc.wait()
    results = box.run_many([Program("x = 1", ("assert x == 1",))] * 4)
    assert sum(r.status == "sandbox_error" for r in results) <= 2
    assert box.run(Program("x = 1", ("assert x == 1",))).passed


def test_without_namespaces_the_audit_hook_stands_in(outside, monkeypatch):
    """Where the kernel refuses namespaces (e.g. a default container), the corpus must still fail and
    change nothing: the separate uid (root) and the audit hook's path/socket/signal checks take over."""
    subs, sentinel, world, listener, marker = outside
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corpus-secret")
    config = SandboxConfig(timeout=1.5, memory_mb=256, namespaces=False)
    programs = [build_program(ADD_PROBLEM, _fill(path.read_text(), subs)) for path in CORPUS]
    with Sandbox(config, max_workers=2) as degraded:
        assert degraded.isolation["network"] is False and degraded.isolation["filesystem"] is False
        results = degraded.run_many(programs)
        report = {p.stem: (r.status, r.detail[:100]) for p, r in zip(CORPUS, results)}
        for path, result in zip(CORPUS, results):
            assert not result.passed, (path.stem, report[path.stem])
            assert not result.network_isolated and not result.filesystem_isolated
            assert "corpus-secret" not in result.output and "CONNECTED" not in result.output, path.stem
        _assert_nothing_changed(sentinel, world, listener, marker)
        assert degraded.run(build_program(ADD_PROBLEM, HONEST_ADD)).passed
        # ordinary file work inside its own directory still works
        files = Program(
            "import os\nos.mkdir('d')\nopen('d/x.txt', 'w').write('hi')\nos.rename('d/x.txt', 'y.txt')",
            ("assert open('y.txt').read() == 'hi'",),
        )
        assert degraded.run(files).passed


def test_four_times_as_many_concurrent_submitters_as_workers_all_get_their_verdict(box):
    """8 threads share 2 workers: every program gets its own verdict, none lost, none swapped."""
    from concurrent.futures import ThreadPoolExecutor

    kinds = {  # program -> (expected passed, expected status word)
        "pass": (lambda i: Program(f"def f(x):\n    return x + {i}\n", (f"assert f(1) == {i + 1}",)), True),
        "fail": (lambda i: Program(f"def f(x):\n    return x - {i} - 1\n", (f"assert f(1) == {i + 1}",)), False),
        "loop": (lambda i: Program("while True:\n    pass\n", ("assert True",)), False),
        "crash": (lambda i: Program(f"raise SystemExit({i})\n", ("assert True",)), False),
    }
    jobs = [(name, i) for i in range(10) for name in kinds]

    def submit(job):
        name, i = job
        return box.run(kinds[name][0](i), timeout=0.5 if name == "loop" else 3.0)

    with ThreadPoolExecutor(max_workers=8) as submitters:
        results = list(submitters.map(submit, jobs))
    assert len(results) == len(jobs)
    for (name, i), result in zip(jobs, results):
        assert result.passed is kinds[name][1], (name, i, result)
    assert all(r.status == "timeout" for (name, _), r in zip(jobs, results) if name == "loop")
