"""Fork server behind :mod:`trainer_lib.sandbox`; run as ``python -I -S _zygote.py SOCK_FD SETTINGS_JSON``.

Stdlib only, and never imported by the package: it runs outside the virtualenv, as a script. One zygote
serves one worker of the evaluator. It imports the common stdlib modules once, then forks one child per
program; the child isolates itself (namespaces, mounts, rlimits, another uid) and runs the program and
its tests, so a sample costs a fork (~1 ms) plus the isolation (~3 ms) instead of an interpreter start
(~30 ms with ``typing`` imported). The threat model is in ``trainer_lib/sandbox/__init__.py``.

Protocol (SOCK_SEQPACKET, one message each): the parent sends a JSON job header with three fds
(stdin, output, verdict); the zygote answers ``pid N`` after forking and ``exit STATUS`` once the child
is reaped. The child reads the payload (nonce, source, tests) from stdin, and writes its verdict to fd 3:

    \\n<nonce>\\t<kind>\\t<bits>\\n      kind: done | load_error | setup_error; bits: one 1/0 per test
    detail\\t<text>\\n                 informational only, written after the verdict

Everything the child runs after the untrusted code starts uses only values captured in local variables
beforehand, never module globals or builtins (which the program can replace).
"""

import builtins
import json
import os
import resource
import select
import socket
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
MS_MOVE, MNT_DETACH = 8192, 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # syscall numbers
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")  # the only device nodes a program sees
VERDICT_FD = 3

# Removed from sys.modules before the program runs and refused on import by the audit hook: they hand
# out frames (signal handlers get the current frame) or raw memory (ctypes), which would expose the nonce.
BANNED_MODULES = (
    "ctypes",
    "_ctypes",
    "signal",
    "_signal",
    "gc",
    "faulthandler",
    "_posixsubprocess",
    "subprocess",
    "multiprocessing",
    "_multiprocessing",
    "pty",
    "tracemalloc",
    "_tracemalloc",
)


def _banned(name):
    return name.split(".")[0] in BANNED_MODULES


# ---------------------------------------------------------------------------------------------------
# Isolation (runs in the child, as root or in a fresh user namespace, before the program)
# ---------------------------------------------------------------------------------------------------


def _check(libc, result, what):
    if result != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(libc, source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc, libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _mount_points():
    """(mount point, per-mount flags to keep) from /proc/self/mountinfo, parents first."""
    keep = {"nodev": MS_NODEV, "noexec": MS_NOEXEC}
    points = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # octal escapes such as \040
            points[point] = sum(keep.get(option, 0) for option in fields[5].split(","))
    return list(points.items())


def _host_view(mounts, staging):
    """What the program's root shows, found once per zygote: (host path, flags its mount must keep).

    The stdlib (sys.path, which ``-I -S`` limits to the interpreter's own library) and the directories of
    every shared object this interpreter has mapped (libpython, libc, the dynamic loader, what the preloaded
    extension modules link, locale data): what ``ldd`` would list, without running it. Nested entries are
    dropped; the executable itself is not needed after fork. Plus a few device nodes."""
    paths = {os.path.realpath(p) for p in sys.path if os.path.isdir(p)}
    executable = os.path.realpath(sys.executable)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            mapped = fields[5].strip() if len(fields) > 5 else ""
            if mapped.startswith("/") and mapped != executable and os.path.isfile(mapped):
                if not mapped.startswith(("/dev/", "/proc/", "/sys/", "/run/")):  # shared memory, not libraries
                    paths.add(os.path.dirname(mapped))
    paths = sorted(p for p in paths if p != "/" and not p.startswith(staging))
    view = [p for p in paths if not any(p.startswith(other + "/") for other in paths)]
    view += [d for d in DEVICES if os.path.exists(d)]

    def kept(path):  # flags of the mount that holds `path` (the longest mount point above it)
        return max(
            ((point, flags) for point, flags in mounts if (path + "/").startswith(point.rstrip("/") + "/")),
            key=lambda m: len(m[0]),
            default=("/", 0),
        )[1]

    return [(path, kept(path)) for path in view]


def _root_plan(view, staging):
    """The mkdir and bind calls that build the root at `staging`, worked out once per zygote: each child
    only replays them (os.makedirs in every child would cost a third of a millisecond)."""
    dirs, files = [], []
    for path, _ in view:
        parent = path if os.path.isdir(path) else os.path.dirname(path)
        parts = parent.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            folder = staging + "/" + "/".join(parts[:i])
            if folder not in dirs:
                dirs.append(folder)
        if parent != path:
            files.append(staging + path)
    dirs += [staging + "/tmp"] if staging + "/tmp" not in dirs else []  # the mount point of the program's tmpfs
    binds = [(path, staging + path, flags | (0 if path in DEVICES else MS_NODEV)) for path, flags in view]
    return {"staging": staging, "dirs": dirs, "files": files, "binds": binds}


def _private_root(libc, plan, uid, limits):
    """Make a fresh tmpfs holding only the host view (read-only binds) and a private /tmp our root.

    Built at ``plan["staging"]`` (the worker's scratch directory, an empty mount point), then pivot_root
    into it and detach the old root, so no host mount is left in this namespace: no sockets, secrets,
    home directories or /var, whatever the program does (native code included)."""
    staging = plan["staging"]
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # our mounts must not propagate to the host
    _mount(libc, "tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=256,mode=0755")
    umask = os.umask(0o022)  # the sandbox uid must traverse these whatever the evaluator's umask
    for folder in plan["dirs"]:
        os.mkdir(folder, 0o755)
    for file in plan["files"]:  # mount points for device nodes
        os.close(os.open(file, os.O_CREAT | os.O_WRONLY, 0o644))
    os.umask(umask)
    for source, target, flags in plan["binds"]:
        try:
            _mount(libc, source, target, None, MS_BIND)
        except OSError:  # a user namespace refuses a bind that would reveal what its locked submounts cover
            _mount(libc, source, target, None, MS_BIND | MS_REC)
        _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags)
    size = f"size={limits['disk_mb']}m,nr_inodes={limits['max_files']},mode=0700,uid={uid},gid={uid}"
    # noexec: the program cannot map native code it wrote (an extension module) from its own files
    _mount(libc, "tmpfs", staging + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, size)
    os.chdir(staging)
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        # the old root now sits on top of the new one: detach it, and every host mount with it
        _check(libc, libc.umount2(b".", MNT_DETACH), "umount old root")
    else:  # no pivot_root (an initramfs root, an unknown architecture): move and chroot
        _mount(libc, staging, "/", None, MS_MOVE)
        os.chroot(".")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/tmp")


def _drop_capabilities(libc):
    """Clear this process's capabilities (user-namespace mode keeps them otherwise, and could unmount)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    _check(libc, libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")


def _isolate(libc, caps, plan, uid, limits, workdir):
    """Apply the isolation the probe found to work; any failure here is fatal for the sample."""
    root = caps["root"]
    flags = (CLONE_NEWNET if caps["network"] else 0) | (CLONE_NEWNS | CLONE_NEWIPC if caps["filesystem"] else 0)
    me, group = os.getuid(), os.getgid()  # before unshare: until the map is written they read as 65534
    if flags and not root:
        # Without root there is no spare uid, so the program could signal our processes: a PID namespace
        # stops that (kill(-1) reaches only the namespace) and its init's exit kills all it started.
        flags |= CLONE_NEWUSER | CLONE_NEWPID
    if flags:
        _check(libc, libc.unshare(flags), "unshare")
    if flags and not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{me} {me} 1"), ("gid_map", f"{group} {group} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    if caps["filesystem"]:
        _private_root(libc, plan, uid if root else me, limits)
    else:
        os.chdir(workdir)
        if caps.get("chroot"):  # no mount namespace, but root can still make its directory its whole filesystem
            os.chroot(".")
            os.chdir("/")
    cpu = int(limits["timeout"]) + 2
    for limit, value in (
        (resource.RLIMIT_AS, limits["memory_mb"] << 20),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, limits["file_mb"] << 20),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, limits["max_open_files"]),
        (resource.RLIMIT_MEMLOCK, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    if root:
        # NPROC counts every process of a uid; each worker has its own uid, so 1 means "no fork, no thread".
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # drops every capability
    elif flags:
        _drop_capabilities(libc)
    _check(libc, libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc, libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "pdeathsig")  # set after setuid, which clears it
    if flags & CLONE_NEWPID:
        _enter_pid_namespace(libc)


def _enter_pid_namespace(libc):
    """unshare(CLONE_NEWPID) moves only our children: fork one (pid 1 there) to run the program, and
    mirror its exit status here."""
    pid = os.fork()
    if pid == 0:
        _check(libc, libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "pdeathsig")
        return
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(128 + os.WTERMSIG(status))  # a signal Python ignores (SIGPIPE, SIGXFSZ)
    os._exit(os.WEXITSTATUS(status))


def _probe(libc, plan, uid, limits, namespaces=True):
    """Find, once per zygote, which isolation layers this kernel lets us use (a forked trial each)."""
    root = os.geteuid() == 0
    trials = ((True, True), (True, False), (False, True), (False, False)) if namespaces else ((False, False),)
    for network, filesystem in trials:
        caps = {
            "root": root,
            "network": network,
            "filesystem": filesystem,
            "user": root,
            "pid": not root and (network or filesystem),
            "chroot": root and not filesystem,
        }
        workdir = None if filesystem else "/"
        pid = os.fork()
        if pid == 0:
            try:
                os.closerange(3, 1 << 16)
                _isolate(libc, caps, plan, uid, dict(limits, max_processes=1), workdir)
                os._exit(0)
            except BaseException:
                os._exit(1)
        if os.waitpid(pid, 0)[1] == 0:
            return caps
    return {"root": root, "network": False, "filesystem": False, "user": False, "pid": False, "chroot": False}


# ---------------------------------------------------------------------------------------------------
# The audit hook (PEP 578): keeps the nonce out of reach of code in the same interpreter
# ---------------------------------------------------------------------------------------------------


# One long function by design (tests/test_house.py exempts it): the hook's state lives in this closure, where the
# program cannot reach it; helpers at module level would be globals the program can read and patch.
def _make_hook(caps, workdir, violations):
    """Build the hook from closure variables only: the program can reach module globals, not these.

    Where an OS layer is missing (no namespaces here) it also stands in for it, best effort: no sockets
    without both a network and a mount namespace (unix sockets are reached by path); without a mount
    namespace no /proc, no writes outside the working directory, and no reading or listing outside it,
    the stdlib and the host view (``caps["view"]``); no signals to other processes without a separate uid
    or PID namespace. Native code is not stopped by any of this (see the threat model)."""
    refuse = frozenset(
        {
            "sys._current_frames",
            "sys._current_exceptions",
            "sys.settrace",
            "sys.setprofile",
            "gc.get_objects",
            "gc.get_referrers",
            "gc.get_referents",
            "code.__new__",
            "marshal.loads",
            "marshal.load",
            "os.fork",
            "os.forkpty",
            "os.exec",
            "os.posix_spawn",
            "os.spawn",
            "os.system",
            "subprocess.Popen",
            "pty.spawn",
            "os.symlink",
            "os.link",
            "_xxsubinterpreters.create",
            "cpython.PyInterpreterState_New",
            "function.__new__",
            "sys.set_asyncgen_hooks_firstiter",
            "sys.set_asyncgen_hooks_finalizer",
            "sys.unraisablehook",
            "sys.excepthook",
        }
    )
    path_events = frozenset(
        {
            "os.remove",
            "os.rename",
            "os.rmdir",
            "os.mkdir",
            "os.chmod",
            "os.chown",
            "os.truncate",
            "os.utime",
            "os.chflags",
            "os.lchown",
            "shutil.rmtree",
            "shutil.move",
            "shutil.copyfile",
            "shutil.copytree",
            "os.chdir",
        }
    )
    two_paths = frozenset({"os.rename", "shutil.move", "shutil.copyfile", "shutil.copytree"})
    frame_attrs = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
    banned = frozenset(BANNED_MODULES)
    block_fs = not caps["filesystem"]
    block_sockets = block_fs or not caps["network"]
    list_events = frozenset({"os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr"})
    block_signals = not (caps["user"] or caps.get("pid"))
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    own_pid, root_slash = os.getpid(), workdir.rstrip("/") + "/"
    read_roots = tuple({p.rstrip("/") + "/" for p in [*caps.get("view", ()), *sys.path] if p} | {root_slash})
    isinstance_, str_, bytes_, int_, len_ = isinstance, str, bytes, int, len
    # Unbound methods: the program may pass str subclasses whose split/__eq__/__contains__ lie.
    split, str_eq, str_find, startswith = str.split, str.__eq__, str.find, str.startswith
    decode, append = bytes.decode, violations.append

    def note(text):
        if len_(violations) < 8:
            append(text)

    def outside(path, writing):
        """Would this path leave the working directory (writing) or reach /proc (any access)?"""
        if isinstance_(path, int_):
            return False  # an fd the program already holds
        if isinstance_(path, bytes_):
            path = decode(path, "utf-8", "surrogateescape")
        elif not isinstance_(path, str_):
            return True  # a PathLike: checking it would run its own __fspath__
        if str_find(path, "proc") >= 0:
            return True
        if not writing:
            return False
        return str_find(path, "..") >= 0 or (startswith(path, "/") and not startswith(path + "/", root_slash))

    def unreadable(path):
        """Would reading or listing this path leave the working directory, the stdlib and the host view?"""
        if path is None or isinstance_(path, int_):
            return False  # the working directory, or an fd the program already holds
        if isinstance_(path, bytes_):
            path = decode(path, "utf-8", "surrogateescape")
        elif not isinstance_(path, str_):
            return True
        if str_find(path, "..") >= 0 or str_find(path, "proc") >= 0:
            return True
        return startswith(path, "/") and not startswith(path + "/", read_roots)

    def hook(event, args):
        if event == "object.__getattr__":
            if args[1] in frame_attrs:  # names raised by C code are exact str constants
                raise AttributeError("sandbox: frame access is disabled")
            return
        if event == "import":
            name = args[0]
            if isinstance_(name, str_) and split(name, ".")[0] in banned:
                note("import " + str_.__str__(name))
                raise ImportError("sandbox: this import is disabled")
            return
        if event == "open":
            flags = args[2]
            writing = isinstance_(flags, int_) and flags & write_flags
            if block_fs and (outside(args[0], writing) or unreadable(args[0])):
                note(event)
                raise PermissionError("sandbox: path refused")
            return
        if event == "exec" or event == "compile":
            return
        if event == "object.__setattr__" or event == "object.__delattr__":
            name = args[1]
            if isinstance_(name, str_) and str_eq(name, "__code__"):  # (type.__setattr__ is not audited in 3.11)
                note(event)
                raise PermissionError("sandbox: replacing code objects is disabled")
            return
        if event == "sys._getframe":
            note(event)
            raise ValueError("sandbox: frame access is disabled")  # the ValueError typing/enum tolerate
        if event == "sys.addaudithook":
            raise RuntimeError("sandbox: audit hooks are fixed")  # RuntimeError: refused silently
        if event in refuse or startswith(event, "ctypes.") or (block_sockets and startswith(event, "socket.")):
            note(event)
            raise PermissionError("sandbox: " + event + " is disabled")
        if block_fs and event in list_events and unreadable(args[0] if len_(args) else None):
            note(event)
            raise PermissionError("sandbox: path refused")
        if block_fs and event in path_events:
            if (
                outside(args[0], True)
                or (event in two_paths and outside(args[1], True))
                or (event == "os.chdir" and isinstance_(args[0], int_))
            ):
                note(event)
                raise PermissionError("sandbox: path refused")
        if block_signals and (event == "os.kill" or event == "os.killpg") and args[0] != own_pid:
            note(event)
            raise PermissionError("sandbox: signals to other processes are disabled")

    return hook


# ---------------------------------------------------------------------------------------------------
# Running one job (in the child)
# ---------------------------------------------------------------------------------------------------


def _run_job(payload, snapshot, caps, hook_on):
    """Execute the program, then each test in its own namespace; write the verdict; never return."""
    # Everything used from here on is captured now, before the program can replace anything.
    exec_, compile_, type_, str_, dict_ = exec, compile, type, str, dict
    write, exit_, encode, issubclass_ = os.write, os._exit, str.encode, issubclass
    dict_clear, dict_update, setattr_ = dict.clear, dict.update, object.__setattr__
    AssertionError_, MemoryError_, Exception_ = AssertionError, MemoryError, Exception
    stdout, stderr = sys.stdout, sys.stderr
    modules, saved_modules, module_state, pristine_builtins = snapshot
    nonce = encode(payload.pop("nonce"), "ascii")
    source, tests = payload["source"], payload["tests"]
    del payload
    violations = []
    keep = []  # objects replaced during the restore; kept alive so no __del__ runs inside trusted code

    def kind_of(exc):  # type_() and issubclass on real types: no code of the program runs here
        cls = type_(exc)
        return (
            b"failed"
            if issubclass_(cls, AssertionError_)
            else b"memory"
            if issubclass_(cls, MemoryError_)
            else b"error"
        )

    def finish(line, detail_exc, where):
        write(VERDICT_FD, b"\n" + nonce + b"\t" + line + b"\n")
        try:  # informational; may run the program's __str__, so it comes after the verdict
            name = type_(detail_exc).__name__ if detail_exc is not None else ""
            text = str_(detail_exc)[:500] if detail_exc is not None else ""
            blocked = ("; blocked: " + ", ".join(violations)) if violations else ""
            detail = (where + name + (": " + text if text else "") + blocked).replace("\n", " ")
            write(VERDICT_FD, b"detail\t" + encode(detail, "utf-8", "replace")[:2000] + b"\n")
        except BaseException:
            pass
        for stream in (stdout, stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        exit_(0)

    try:
        program = compile_(source, "<program>", "exec")
        test_codes = [compile_(t, f"<test {i}>", "exec") for i, t in enumerate(tests)]
        indices = list(range(len(test_codes)))
        wanted = {"builtins", "sys"} | {name for t in tests for name in _imported_names(t)}
        restore = [module_state[name] for name in wanted if name in module_state]
    except Exception_ as exc:  # SyntaxError, or ValueError for a NUL byte
        finish(b"load_error\terror", exc, "program does not compile: ")
    if hook_on:
        sys.addaudithook(_make_hook(caps, os.getcwd(), violations))
    namespace = {"__name__": "__main__", "__builtins__": builtins}

    # ---- untrusted code runs from here on ----
    try:
        exec_(program, namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the program did not load
        finish(b"load_error\t" + kind_of(exc), exc, "while loading the program: ")

    # Undo patches the program made while loading (builtins.abs = ..., math.isclose = ...) to builtins, sys
    # and the modules the tests import, so the tests see the library as it was. Only C-level calls on
    # objects captured before the program ran. (Restoring every module would cost ~15 ms per sample in
    # copy-on-write faults.)
    keep.append(dict_(modules))
    dict_update(modules, saved_modules)  # no clear: modules the program imported stay as they are
    for module, namespace_dict, saved, module_type in restore:
        keep.append(dict_(namespace_dict))
        dict_clear(namespace_dict)
        dict_update(namespace_dict, saved)
        try:
            setattr_(module, "__class__", module_type)
        except BaseException:
            pass

    bits, first = [], None
    for index in indices:
        scope = dict_(namespace)
        scope["__builtins__"] = dict_(pristine_builtins)  # immune to builtins patched during the test
        try:
            exec_(test_codes[index], scope)
            bits.append(b"1")
        except BaseException as exc:
            bits.append(b"0")
            if first is None:
                first = (exc, index)
    if first is None:
        finish(b"done\t" + b"".join(bits), None, "")
    exc, index = first
    finish(b"done\t" + b"".join(bits) + b"\t" + kind_of(exc), exc, f"test {index}: ")


def _imported_names(source):
    """Top-level module names (and their parents) imported by trusted test code."""
    names = set()
    for line in source.splitlines():
        words = line.replace(",", " ").split()
        if words and words[0] in ("import", "from"):
            for word in words[1:2] if words[0] == "from" else words[1:]:
                if word == "as":
                    break
                parts = word.split(".")
                names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


def _child(sock, fds, job, caps, libc, plan, uid, snapshot, workdir, hook_on):
    """The forked child: wire up fds, read the payload, isolate, run. Never returns."""
    exit_, nonce = os._exit, b""
    try:
        os.setsid()
        for target, fd in zip((0, 1, 3), fds):
            os.dup2(fd, target)
        os.dup2(1, 2)
        os.closerange(4, 1 << 20)  # the zygote's socket and the parent's pipes included
        chunks = []
        while True:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        payload = json.loads(b"".join(chunks))
        del chunks
        nonce = payload["nonce"].encode("ascii")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _isolate(libc, caps, plan, uid, job["limits"], workdir)
        for name in [m for m in sys.modules if _banned(m)]:
            del sys.modules[name]
        os.environ.clear()
        os.environ.update(job["env"], HOME=os.getcwd(), TMPDIR=os.getcwd())
    except BaseException as exc:
        try:
            detail = f"{type(exc).__name__}: {exc}".replace("\n", " ").encode()
            os.write(VERDICT_FD, b"\n" + nonce + b"\tsetup_error\t\n" + b"detail\t" + detail + b"\n")
        finally:
            os._exit(71)
    try:
        _run_job(payload, snapshot, caps, hook_on)
    finally:
        exit_(70)


def _snapshot():
    """Module state to restore between loading the program and running its tests."""
    modules = sys.modules
    saved_modules = {name: m for name, m in modules.items() if not _banned(name)}
    module_state = {
        name: (m, m.__dict__, dict(m.__dict__), type(m))
        for name, m in saved_modules.items()
        if isinstance(getattr(m, "__dict__", None), dict)
    }
    return modules, saved_modules, module_state, dict(builtins.__dict__)


def _wait(pid, sock):
    """Wait for the child; if the parent goes away meanwhile, kill the child and report None."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return os.waitpid(pid, 0)[1]
    try:
        while True:
            ready, _, _ = select.select([sock, pidfd], [], [])
            if pidfd in ready:
                return os.waitpid(pid, 0)[1]
            if not sock.recv(1, socket.MSG_PEEK):  # EOF: the evaluator is gone
                os.killpg(pid, 9) if pid > 0 else None
                os.waitpid(pid, 0)
                return None
    finally:
        os.close(pidfd)


def _world_readable(path):
    """Can any user list `path` and traverse every directory above it?"""
    while True:
        mode = os.stat(path).st_mode
        if not mode & 0o001 or (path == os.path.dirname(os.__file__) and not mode & 0o004):
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _kill_uid(uid):
    """Kill whatever processes of the sandbox uid escaped the process group (max_processes > 1)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    os.kill(int(entry), 9)
            except OSError:
                pass


def main():
    import ctypes  # only ever a local: the program can see module globals, and ctypes reads memory

    sock = socket.socket(fileno=int(sys.argv[1]))
    settings = json.loads(sys.argv[2])
    for name in settings["preload"]:
        try:
            __import__(name)
        except Exception:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    uid, limits = settings["uid"], settings["limits"]
    mounts = _mount_points()
    view = _host_view(mounts, settings["scratch"])
    plan = _root_plan(view, settings["scratch"])
    if os.geteuid() == 0:
        _kill_uid(uid)  # leftovers of an earlier evaluator that died with this uid (we hold its lock now)
    caps = _probe(libc, plan, uid, limits, settings.get("namespaces", True))
    # in the private root the directories above the stdlib are ours (0755): only its own mode counts there
    stdlib = os.path.dirname(os.__file__)
    own_mode_ok = os.stat(stdlib).st_mode & 0o005 == 0o005
    caps["stdlib_readable"] = own_mode_ok if caps["filesystem"] else not caps["chroot"] and _world_readable(stdlib)
    caps["view"] = [path for path, _ in view]
    snapshot = _snapshot()
    sock.send(json.dumps(caps).encode())
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        except OSError:
            break
        if not message:
            break
        job = json.loads(message)
        workdir = None
        if not caps["filesystem"]:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="job-", dir=settings["scratch"])
            if caps["root"]:
                os.chown(workdir, uid, uid)
        pid = os.fork()
        if pid == 0:
            _child(sock, fds, job, caps, libc, plan, uid, snapshot, workdir, settings["audit_hook"])
        for fd in fds:
            os.close(fd)
        sock.send(f"pid {pid}".encode())
        status = _wait(pid, sock)
        if caps["root"] and job["limits"]["max_processes"] > 1:
            _kill_uid(uid)
        if workdir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        if status is None:
            break
        sock.send(f"exit {status}".encode())


if __name__ == "__main__":
    main()
