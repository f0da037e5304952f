"""Run model-generated Python safely enough to score it: HumanEval and the ``code_execution`` reward.

    from trainer_lib.sandbox import Program, Sandbox
    with Sandbox(max_workers=8) as box:
        results = box.run_many([Program(source, tests) for source, tests in batch], timeout=3.0)
    rewards = [r.pass_fraction for r in results]

Threat model: the program is hostile. Three separate questions, defended separately.

1. Containment (the OS enforces it; holds even against arbitrary native code in the child):
   each program runs in its own forked process, as its own unprivileged uid (one per worker, so samples
   cannot signal the evaluator or each other), in a new network namespace (no interfaces: no network,
   and no abstract unix sockets of the host), a new mount namespace whose root is a fresh read-only tmpfs
   that shows only the host view (``Sandbox.isolation["view"]``: read-only binds of the interpreter's
   stdlib, the directories of the shared libraries it has mapped, i.e. libpython, libc, the dynamic
   loader and what the stdlib's extension modules link, locale data, and /dev/null, zero, random,
   urandom) plus a private size-limited noexec tmpfs as the working directory and /tmp, gone when the
   process exits; pivot_root detaches every other host mount, so no host path is reachable at all: no
   unix socket (a container runtime's, an agent's), no mounted secret (a pod's service-account token,
   config maps), no /home, /root, /var, /run, /etc, /proc, /sys or evaluator working directory; a new
   IPC namespace, with rlimits
   (address space, CPU time, file size, open files, RLIMIT_NPROC=1 so no fork or thread, no core dumps),
   no_new_privs, an environment of PATH, LANG, HOME=TMPDIR=its own directory and nothing else, and a
   wall-clock timeout that kills its process group.
   Output beyond a cap kills it (status ``output_limit``). Which layers were active is reported in every
   result (``network_isolated``, ``filesystem_isolated``, ``user_isolated``); as root on Linux all are.
   Without root, a user namespace gives the network and filesystem layers where the kernel allows it,
   plus a PID namespace (the program cannot signal anything outside it, and everything it started dies
   with it), but no separate uid and no RLIMIT_NPROC (it would count all of the user's processes): only
   the audit hook stops fork there. ``Sandbox.isolation`` lists the layers in use.
   Without namespaces (the fallback: a kernel or container that refuses them, or ``namespaces=False``)
   root still chroots each program into its own scratch directory (``isolation["chroot"]``): no host
   path exists for it, native code included, at the price of importing only the preloaded modules;
   /tmp there is not a size-limited tmpfs, only RLIMIT_FSIZE bounds a file. Without root the audit hook
   stands in, for Python code only: it refuses sockets of any family, reading or listing any path
   outside the working directory, the stdlib and the host view, /proc, and writing outside the working
   directory. What that cannot hide: whether a host path exists (``os.stat`` raises no audit event);
   and native code, which a program can run by writing an extension module to its directory and
   importing it, reads every file and lists every directory of the evaluator's user (e.g. a mounted
   service-account token) and connects to the unix sockets that user may write. Where that matters,
   require the namespaces (``SandboxConfig(require_isolation=True)``).

2. Integrity of the verdict (best effort; CPython's audit hooks are not a security boundary):
   a pass is never inferred from the exit code or the output. The parent sends a random nonce through
   stdin, which the child reads and closes before the program runs; only the child's trusted code,
   after the tests returned, writes ``<nonce> done <bits>`` to a separate pipe. The program cannot find
   the nonce because an audit hook refuses every way pure Python can reach another frame or raw memory
   (sys._getframe, tracebacks' tb_frame, generator frames, gc referrers, settrace/setprofile, signal
   handlers, ctypes, code-object construction, marshal) and process creation. So ``sys.exit(0)``,
   ``os._exit(0)``, exceptions in ``finally``, printed "passed" markers, redefining ``check`` (the
   tests run after the program, in a copy of its namespace), patching ``builtins``/``AssertionError``
   or library modules while loading (undone before the tests; tests get a pristine builtins dict),
   and replacing ``__code__`` (refused) all end as failures.
   Not covered: results that lie about equality (an object whose ``__eq__`` always returns True passes
   ``assert f(x) == y``), patching attributes of library *classes* (``type.__setattr__`` is not audited
   in 3.11) or, during a test, of library modules; modules the tests do not import are not restored;
   and CPython bugs that give memory access. Use the verdict as a reward signal, not as proof.

3. What leaves the sandbox: a program's output and what it raises are the only text of its making that
   reaches our results, and through them the evaluation samples (``samples.jsonl`` ``detail``), reports
   and logs. Both pass through :func:`trainer_lib.storage.redact` (the redaction of logs and errors) plus
   bearer-token and private-key patterns, and are cut to a bound (``keep_output_bytes``; ``DETAIL_BYTES``)
   after redaction, so a secret at the cut is blanked whole. Redaction knows credential shapes and this
   process's secrets, not arbitrary file contents: keeping files unreadable is layer 1's job.
"""

from trainer_lib.sandbox.pool import (
    DEFAULT_PRELOAD,
    STATUSES,
    ExecResult,
    Program,
    Sandbox,
    SandboxConfig,
    SandboxError,
    run_many,
    run_program,
)

__all__ = [
    "DEFAULT_PRELOAD",
    "STATUSES",
    "ExecResult",
    "Program",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "run_many",
    "run_program",
]
