"""Run inside the built image (tests/images/test_built_image.py mounts it): hostile programs through the sandbox.

The evaluator here is what a HumanEval or code-reward task runs in its pod: uid 1000, read-only root,
a secret mounted as a file (``--secret``, as a pod's service-account token is), a TCP listener and an
abstract unix socket of its own, and a signal handler that counts what reaches it. Each hostile program
tries one escape and prints a marker only if it worked. Prints one JSON object: the isolation the sandbox
found, each program's status and output, the signals the evaluator received, and which of the files the
programs tried to write exist afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from trainer_lib.sandbox import Program, Sandbox, SandboxConfig


def hostile_programs(secret: str, port: int, abstract: str, pid: int, outside: list[str]) -> dict[str, str]:
    return {
        "read_secret": f"data = open({secret!r}).read()\nprint('LEAKED', data)",
        "tcp_connect": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')",
        "unix_connect": (
            f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({chr(0) + abstract!r})\nprint('CONNECTED')"
        ),
        "write_outside": "".join(f"open({path!r}, 'w').write('x')\n" for path in outside) + "print('WROTE')",
        "signal_evaluator": f"import os\nos.kill({pid}, {int(signal.SIGUSR1)})\nprint('SIGNALLED')",
        "native_signal": (f"import ctypes\nctypes.CDLL(None).kill({pid}, {int(signal.SIGUSR1)})\nprint('SIGNALLED')"),
    }


def main(secret: str) -> int:
    received = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    listener = socket.create_server(("127.0.0.1", 0))
    abstract_name = f"posttrain-probe-{os.getpid()}"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0" + abstract_name)
    unix.listen(1)
    home = os.path.expanduser("~")
    outside = [os.path.join(home, "escaped"), "/tmp/escaped"]
    programs = hostile_programs(secret, listener.getsockname()[1], abstract_name, os.getpid(), outside)
    config = SandboxConfig(timeout=5.0, memory_mb=256)
    with Sandbox(config, max_workers=1) as box:
        isolation = box.isolation
        results = {name: box.run(Program(source, ("assert True",))) for name, source in programs.items()}
    report = {
        "uid": os.getuid(),
        "isolation": {key: value for key, value in isolation.items() if key != "view"},
        "results": {
            name: {"status": r.status, "passed": r.passed, "output": r.output, "detail": r.detail}
            for name, r in results.items()
        },
        "signals": len(received),
        "written": [path for path in outside if os.path.exists(path)],
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
