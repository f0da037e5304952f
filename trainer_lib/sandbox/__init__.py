"""Run model-generated Python safely enough to score it: HumanEval and the ``code_execution`` reward.

    from trainer_lib.sandbox import Program, Sandbox
    with Sandbox(max_workers=8) as box:
        results = box.run_many([Program(source, tests) for source, tests in batch], timeout=3.0)
    rewards = [r.pass_fraction for r in results]

Threat model: the program is hostile. Two separate questions, defended separately.

1. Containment (the OS enforces it; holds even against arbitrary native code in the child):
   each program runs in its own forked process, as its own unprivileged uid (one per worker, so samples
   cannot signal the evaluator or each other), in a new network namespace (no interfaces: no network),
   a new mount namespace (every mount read-only, /proc and /sys hidden, a private size-limited tmpfs as
   the working directory and /tmp, gone when the process exits), a new IPC namespace, with rlimits
   (address space, CPU time, file size, open files, RLIMIT_NPROC=1 so no fork or thread, no core dumps),
   no_new_privs, an environment of PATH, LANG, HOME=TMPDIR=its own directory and nothing else, and a
   wall-clock timeout that kills its process group.
   Output beyond a cap kills it (status ``output_limit``). Which layers were active is reported in every
   result (``network_isolated``, ``filesystem_isolated``, ``user_isolated``); as root on Linux all are.
   Without root, a user namespace gives the network and filesystem layers where the kernel allows it,
   plus a PID namespace (the program cannot signal anything outside it, and everything it started dies
   with it), but no separate uid and no RLIMIT_NPROC (it would count all of the user's processes): only
   the audit hook stops fork there. ``Sandbox.isolation`` lists the layers in use.

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
