"""Run untrusted Python programs (and their tests) in isolated child processes, many at once.

Each worker is a warm fork server (``_zygote.py``) with its own sandbox uid; a worker thread here sends
it one program at a time, streams the output under a size cap, enforces the wall-clock timeout by
killing the process group, and turns the child's nonce-signed verdict into an :class:`ExecResult`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import json
import logging
import os
import pwd
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence

log = logging.getLogger(__name__)

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
STATUSES = ("passed", "failed", "error", "timeout", "memory", "output_limit", "sandbox_error")
# Imported once per worker, before any program runs: covers HumanEval and typical test code, and the
# sandbox uid may not be able to read the interpreter's own stdlib (e.g. a Python under /root).
DEFAULT_PRELOAD = (
    "typing",
    "math",
    "cmath",
    "random",
    "copy",
    "string",
    "collections",
    "collections.abc",
    "re",
    "hashlib",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "fractions",
    "decimal",
    "statistics",
    "datetime",
    "operator",
    "json",
    "dataclasses",
    "enum",
    "array",
    "numbers",
    "textwrap",
    "unicodedata",
    "time",
    "struct",
    "base64",
    "binascii",
    "calendar",
    "contextlib",
    "types",
    "abc",
    "pprint",
    "queue",
    "io",
    "difflib",
    "encodings.ascii",
    "encodings.latin_1",
    "encodings.idna",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.utf_8_sig",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
    "encodings.cp1252",
)
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
DETAIL_BYTES = 1000  # ExecResult.detail (what the program raised) is cut to this many bytes of UTF-8
REDACT_MARGIN = 1024  # raw output kept beyond keep_output_bytes, so a secret at the cut is still redacted whole
CUT = " [cut]"
# Beyond what logs redact: bearer tokens such as a Kubernetes service-account token, and private keys.
TOKEN_SHAPES = re.compile(
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
    re.DOTALL,
)


_warned = False  # log the environment warnings once per process


class SandboxError(RuntimeError):
    """The sandbox itself could not start (not a verdict about a program)."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits and settings of every program run; one per :class:`Sandbox`."""

    timeout: float = 3.0  # wall-clock seconds per program, from fork to exit; the process group is killed
    memory_mb: int = 512  # RLIMIT_AS (address space; the interpreter itself needs ~40 MiB)
    max_output_bytes: int = 1 << 20  # stdout+stderr beyond this kills the program: status output_limit
    keep_output_bytes: int = 4096  # how much of the output is kept in ExecResult.output (after redaction)
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    disk_mb: int = 64  # size of the private tmpfs that is the program's working directory
    max_files: int = 1024  # inodes of that tmpfs
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_processes: int = 1  # RLIMIT_NPROC of the worker's uid: 1 forbids fork and threads
    audit_hook: bool = True  # in-interpreter guard protecting the verdict; off only to test the OS layers
    namespaces: bool = True  # use network/mount/PID namespaces where the kernel allows (False: tests, old kernels)
    require_isolation: bool = False  # refuse to run (SandboxError) without network and filesystem namespaces
    uid_base: int = 61000  # sandbox uids (root only): one per worker from [uid_base, uid_base + uid_count)
    uid_count: int = 1000
    python: str | None = None  # interpreter for the workers (stdlib only); default: this one
    preload: tuple[str, ...] = DEFAULT_PRELOAD

    def limits(self, timeout: float | None = None) -> dict:
        return {
            "timeout": float(self.timeout if timeout is None else timeout),
            "memory_mb": self.memory_mb,
            "file_mb": self.file_mb,
            "disk_mb": self.disk_mb,
            "max_files": self.max_files,
            "max_open_files": self.max_open_files,
            "max_processes": self.max_processes,
        }


@dataclasses.dataclass(frozen=True)
class Program:
    """Untrusted ``source`` plus trusted ``tests``: each test is a snippet run after the program, in a copy
    of its namespace (HumanEval: one test, ``<test code>\\ncheck(entry_point)``; RL: one assert each)."""

    source: str
    tests: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What happened to one program. ``passed`` is true only for a nonce-signed verdict that every test
    passed, followed by a clean exit; anything else is a failure with a ``status`` and a ``detail``."""

    passed: bool
    status: str  # one of STATUSES
    detail: str  # redacted, at most DETAIL_BYTES (it may quote what the program raised)
    duration: float  # seconds, fork to exit
    network_isolated: bool  # ran in its own network namespace (no interfaces up)
    filesystem_isolated: bool  # own root: the stdlib and its libraries read-only, a private /tmp, nothing else
    user_isolated: bool  # ran as a separate unprivileged uid (cannot signal the evaluator or other samples)
    tests: tuple[bool, ...] = ()  # per test, in order; empty if the program never got to its tests
    output: str = ""  # start of stdout+stderr: redacted, at most SandboxConfig.keep_output_bytes
    exit_code: int | None = None  # negative: killed by that signal

    @property
    def tests_passed(self) -> int:
        return sum(self.tests)

    @property
    def pass_fraction(self) -> float:
        """Fraction of tests passed (the ``code_execution`` reward); without tests, 1.0 if it ran cleanly."""
        return self.tests_passed / len(self.tests) if self.tests else float(self.passed)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _claim_uid(config: SandboxConfig) -> tuple[int, int | None]:
    """A sandbox uid nobody else uses: unknown to passwd and locked (flock) for this worker's lifetime."""
    if os.geteuid() != 0:
        return os.getuid(), None
    lock_dir = os.path.join(tempfile.gettempdir(), "posttrain-sandbox-uids")
    try:
        os.mkdir(lock_dir, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(lock_dir)
    if info.st_uid != 0 or not os.path.isdir(lock_dir) or os.path.islink(lock_dir):
        raise SandboxError(f"{lock_dir} is not a root-owned directory")
    for uid in range(config.uid_base, config.uid_base + config.uid_count):
        try:
            pwd.getpwuid(uid)
            continue  # a real account
        except KeyError:
            pass
        fd = os.open(
            os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except OSError:
            os.close(fd)
    raise SandboxError(f"no free sandbox uid in [{config.uid_base}, {config.uid_base + config.uid_count})")


class _Worker:
    """One fork-server process and its socket; runs one program at a time."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.broken = False
        self.uid, self._lock_fd = _claim_uid(config)
        # Working directories for when there is no private tmpfs; removed here even if the zygote dies.
        self.scratch = tempfile.mkdtemp(prefix="posttrain-sandbox-")
        os.chmod(self.scratch, 0o711)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        settings = {
            "uid": self.uid,
            "limits": config.limits(),
            "preload": list(config.preload),
            "audit_hook": config.audit_hook,
            "namespaces": config.namespaces,
            "scratch": self.scratch,
        }
        self.proc = None
        try:
            self.proc = subprocess.Popen(
                [config.python or sys.executable, "-I", "-S", "-B", ZYGOTE, str(theirs.fileno()), json.dumps(settings)],
                pass_fds=[theirs.fileno()],
                env=dict(SANDBOX_ENV),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
            theirs.close()
            ready = self._recv(60.0)
            if ready is None:
                raise SandboxError("the sandbox worker did not start (see its stderr)")
            self.caps = json.loads(ready)
        except BaseException:
            theirs.close()
            self.close()
            raise

    def _recv(self, timeout: float) -> bytes | None:
        """Next message from the zygote, or None on EOF or timeout."""
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0.0))
        if not ready:
            return None
        try:
            return self.sock.recv(1 << 16) or None
        except OSError:
            return None

    @property
    def alive(self) -> bool:
        return not self.broken and self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        self.sock.close()  # the zygote sees EOF, kills a running program and exits
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def run(self, program: Program, timeout: float) -> ExecResult:
        cfg = self.config
        nonce = secrets.token_hex(16)
        payload = json.dumps({"nonce": nonce, "source": program.source, "tests": list(program.tests)}).encode()
        header = json.dumps({"limits": cfg.limits(timeout), "env": SANDBOX_ENV}).encode()
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        try:
            socket.send_fds(self.sock, [header], [in_r, out_w, verdict_w])
        finally:
            for fd in (in_r, out_w, verdict_w):
                os.close(fd)
        open_fds = [in_w, out_r, verdict_r]  # _communicate closes in_w early; never close an fd twice
        try:
            reply = self._recv(30.0)
            if not reply or not reply.startswith(b"pid "):
                raise SandboxError("the sandbox worker did not fork")
            pid = int(reply.split()[1])
            start = time.monotonic()
            output, verdict, reason = self._communicate(open_fds, payload, start + timeout)
        finally:
            for fd in open_fds:
                os.close(fd)
        if reason is None:
            reply = self._recv(start + timeout - time.monotonic())
            if reply is None:
                reason = "timeout"
        if reason is not None:
            _kill_group(pid)
            reply = self._recv(30.0)
        duration = time.monotonic() - start
        if not reply or not reply.startswith(b"exit "):
            raise SandboxError("the sandbox worker died")
        result = _classify(
            int(reply.split()[1]), verdict, nonce, reason, len(program.tests), output, duration, self.caps, timeout
        )
        output, detail = published(result.output, cfg.keep_output_bytes), published(result.detail, DETAIL_BYTES)
        return dataclasses.replace(result, output=output, detail=detail)

    def _communicate(self, open_fds, payload, deadline):
        """Feed stdin, drain output (capped) and verdict until both close, the deadline or the cap."""
        cfg = self.config
        in_w, out_r, verdict_r = open_fds
        os.set_blocking(in_w, False)
        poller = select.poll()
        poller.register(in_w, select.POLLOUT)
        poller.register(out_r, select.POLLIN)
        poller.register(verdict_r, select.POLLIN)
        open_reads, sent, total = {out_r, verdict_r}, 0, 0
        kept, verdict = bytearray(), bytearray()
        while open_reads:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(kept), bytes(verdict), "timeout"
            for fd, _ in poller.poll(remaining * 1000):
                if fd == in_w:
                    try:
                        sent += os.write(in_w, payload[sent : sent + (1 << 16)])
                    except OSError:  # the child is gone already
                        sent = len(payload)
                    if sent >= len(payload):
                        poller.unregister(in_w)
                        open_fds.remove(in_w)
                        os.close(in_w)  # EOF: the child stops reading
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    poller.unregister(fd)
                    open_reads.discard(fd)
                elif fd == out_r:
                    total += len(data)
                    if len(kept) < cfg.keep_output_bytes + REDACT_MARGIN:
                        kept += data[: cfg.keep_output_bytes + REDACT_MARGIN - len(kept)]
                    if total > cfg.max_output_bytes:
                        return bytes(kept), bytes(verdict), "output_limit"
                elif len(verdict) < (1 << 16):
                    verdict += data
        return bytes(kept), bytes(verdict), None


def published(text: str, limit: int) -> str:
    """What of a program's output or exception may reach our results, samples and logs: redacted as logs
    are (:func:`trainer_lib.storage.redact`: this process's credentials, key- and token-shaped strings),
    bearer tokens and private keys blanked too, then cut to ``limit`` bytes of UTF-8."""
    if not text:
        return text
    from trainer_lib.storage import redact

    text = TOKEN_SHAPES.sub("***", redact(text))
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text
    if limit < 4 * len(CUT):  # too short to spend on the marker
        return raw[:limit].decode("utf-8", "ignore")
    return raw[: limit - len(CUT)].decode("utf-8", "ignore") + CUT


def _kill_group(pid: int) -> None:
    """SIGKILL the program's process group (it is its session leader), or the process itself if it has
    not called setsid yet (pids are handed out in sequence, so a just-freed one is not reused yet)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _classify(
    status: int,
    verdict: bytes,
    nonce: str,
    reason: str | None,
    n_tests: int,
    output: bytes,
    duration: float,
    caps: dict,
    timeout: float,
) -> ExecResult:
    """Turn the exit status and the verdict channel into an ExecResult; anything irregular fails."""
    common = dict(
        duration=duration,
        network_isolated=caps["network"],
        filesystem_isolated=caps["filesystem"],
        user_isolated=caps["user"],
        output=output.decode("utf-8", "replace"),
        exit_code=os.waitstatus_to_exitcode(status),
    )

    def result(status_name: str, detail: str, tests: tuple[bool, ...] = ()) -> ExecResult:
        return ExecResult(passed=status_name == "passed", status=status_name, detail=detail, tests=tests, **common)

    if reason == "timeout":
        return result("timeout", f"exceeded the {timeout:g} s wall-clock limit")
    if reason == "output_limit":
        return result("output_limit", "printed more than the output limit")
    lines = verdict.split(b"\n")
    mark = nonce.encode() + b"\t"
    index = next((i for i, line in enumerate(lines) if line.startswith(mark)), None)
    if index is None:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU:
                return result("timeout", "exceeded the CPU time limit")
            return result("error", f"killed by {signal.Signals(sig).name} before the tests finished")
        code = os.WEXITSTATUS(status)
        return result("error", f"exited with code {code} before the tests finished (sys.exit or os._exit?)")
    fields = lines[index][len(mark) :].decode("ascii", "replace").split("\t")
    detail = ""
    if index + 1 < len(lines) and lines[index + 1].startswith(b"detail\t"):
        detail = lines[index + 1][7:].decode("utf-8", "replace")
    kind = fields[0]
    if kind == "setup_error":
        return result("sandbox_error", f"sandbox setup failed: {detail}")
    if kind == "load_error":
        return result(fields[1] if len(fields) > 1 and fields[1] in STATUSES else "error", detail)
    bits = fields[1] if kind == "done" and len(fields) > 1 else ""
    if kind != "done" or len(bits) != n_tests or set(bits) - {"0", "1"}:
        return result("error", "malformed verdict")
    tests = tuple(b == "1" for b in bits)
    if status != 0:
        return result("error", f"exited abnormally ({common['exit_code']}) after the tests", tests)
    if all(tests):
        return result("passed", "", tests)
    failed = fields[2] if len(fields) > 2 and fields[2] in STATUSES else "error"
    return result(failed, detail, tests)


class Sandbox:
    """A pool of warm sandbox workers; reuse one for many batches (workers start in ~0.1 s each).

    >>> with Sandbox(max_workers=4) as box:
    ...     results = box.run_many([Program("def f(x): return x + 1", ("assert f(1) == 2",))])
    """

    def __init__(self, config: SandboxConfig | None = None, max_workers: int | None = None):
        self.config = config or SandboxConfig()
        self.max_workers = max(1, max_workers or os.cpu_count() or 1)
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()

    def _acquire(self) -> _Worker:
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                if self._closed:
                    raise SandboxError("the sandbox is closed")
                grow = len(self._workers) < self.max_workers
                if grow:
                    self._workers.append(None)  # reserve the slot while the worker starts
            if grow:
                return self._start_worker()
            try:  # poll: a worker that dies frees its slot without putting anything in the queue
                return self._idle.get(timeout=0.05)
            except queue.Empty:
                pass

    def _start_worker(self) -> _Worker:
        worker = None
        try:
            worker = _Worker(self.config)
            caps = worker.caps
            if self.config.require_isolation and not (caps["network"] and caps["filesystem"]):
                raise SandboxError(f"isolation required but unavailable here: {caps}")
        except BaseException:
            with self._lock:
                self._workers.remove(None)
            if worker is not None:
                worker.close()
            raise
        with self._lock:
            self._workers[self._workers.index(None)] = worker
        global _warned
        if not _warned:
            _warned = True
            if not caps.get("stdlib_readable", True):
                log.warning(
                    "sandbox: the sandbox uid cannot read this interpreter's stdlib (%s), so programs "
                    "can import only the preloaded modules; %s",
                    os.path.dirname(os.__file__),
                    "without namespaces root chroots each program into its own directory"
                    if caps.get("chroot")
                    else "set SandboxConfig.python to a world-readable interpreter to lift that",
                )
            if not (caps["network"] and caps["filesystem"]):
                log.warning(
                    "sandbox: running without %s namespaces here (%s); the audit hook stands in, best effort",
                    "network and mount" if not caps["network"] else "mount",
                    caps,
                )
        return worker

    def _release(self, worker: _Worker) -> None:
        if worker.alive:
            self._idle.put(worker)
            return
        with self._lock:  # a dead worker is replaced on demand
            if worker in self._workers:
                self._workers.remove(worker)
        worker.close()

    @property
    def isolation(self) -> dict:
        """The layers the workers use: network, filesystem, user (own uid), pid (PID namespace), root, chroot
        (root without namespaces: each program chrooted into its own directory), and the host paths that
        a program's root shows (``view``; without a mount namespace, what the audit hook lets Python read)."""
        worker = self._acquire()
        try:
            return dict(worker.caps)
        finally:
            self._release(worker)

    def run(self, program: Program | str, timeout: float | None = None) -> ExecResult:
        """Run one program (a ``Program`` or bare source without tests) and return its result."""
        program = Program(program) if isinstance(program, str) else program
        worker = self._acquire()
        try:
            return worker.run(program, self.config.timeout if timeout is None else timeout)
        except (SandboxError, OSError) as exc:
            worker.broken = True
            worker.proc.kill()
            log.warning("sandbox worker failed: %s", exc)
            return ExecResult(False, "sandbox_error", published(str(exc), DETAIL_BYTES), 0.0, False, False, False)
        finally:
            self._release(worker)

    def run_many(
        self, programs: Iterable[Program | str], timeout: float | None = None, max_workers: int | None = None
    ) -> list[ExecResult]:
        """Run programs in parallel on up to ``max_workers`` workers; results in input order."""
        programs = list(programs)
        threads = max(1, min(len(programs), max_workers or self.max_workers, self.max_workers))
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sandbox") as pool:
            return list(pool.map(lambda p: self.run(p, timeout), programs))


def run_program(
    source: str, tests: Sequence[str] = (), timeout: float = 3.0, config: SandboxConfig | None = None
) -> ExecResult:
    """Run one program in a throwaway sandbox (for many programs, keep a :class:`Sandbox`)."""
    config = dataclasses.replace(config or SandboxConfig(), timeout=timeout)
    with Sandbox(config, max_workers=1) as box:
        return box.run(Program(source, tuple(tests)))


def run_many(
    programs: Iterable[Program | str],
    timeout: float = 3.0,
    max_workers: int | None = None,
    config: SandboxConfig | None = None,
) -> list[ExecResult]:
    """Run a batch of programs in parallel in a throwaway sandbox; results in input order."""
    config = dataclasses.replace(config or SandboxConfig(), timeout=timeout)
    with Sandbox(config, max_workers=max_workers) as box:
        return box.run_many(programs)
