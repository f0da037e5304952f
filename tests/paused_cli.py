"""Run a ``posttrain`` command that stops, for a test to SIGKILL, at an exact point of its own file I/O.

    python -m tests.paused_cli EVENT PATTERN READY_FILE -- sft key=value ...

A Python audit hook watches the process's file operations: ``mkdir`` (``os.mkdir``, so also
``os.makedirs``), ``rename`` (``os.rename`` / ``os.replace``, matched on the destination) and
``open`` (for writing). The first operation of kind EVENT whose path matches the regular expression
PATTERN is held before it happens: the hook writes READY_FILE and blocks that thread until the test
kills the process or deletes READY_FILE (then the operation goes ahead: a test that sent SIGTERM
meanwhile sees what the process does with it). ``audit`` holds at a custom audit event
``tests.hold`` whose argument matches PATTERN (raised by test code the process runs, e.g. a
reward function in the middle of a step).
Nothing in trainer_lib is patched; the test waits for READY_FILE and kills the process there,
instead of racing a tiny run that finishes in a second with a polling loop.

Holding ``rename`` of ``.../step-00000004/COMPLETE`` kills a save after every file of the
checkpoint is written (and uploaded, for an s3:// ``checkpoint_dir``) but before its marker;
holding ``mkdir`` of ``.../step-00000004`` kills between checkpoints, before anything of step 4
exists.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

_EVENTS = {"mkdir": "os.mkdir", "rename": "os.rename", "open": "open", "audit": "tests.hold"}


def install(event: str, pattern: str, ready_file: str) -> None:
    wanted, regex, fired = _EVENTS[event], re.compile(pattern), threading.Event()

    def hook(name: str, args: tuple) -> None:
        if name != wanted or fired.is_set():
            return
        path = args[1] if name == "os.rename" else args[0]
        if name == "open" and (not isinstance(args[1], str) or not set(args[1]) & set("wax+")):
            return  # only opens that write
        if not isinstance(path, (str, bytes, os.PathLike)) or not regex.search(os.fsdecode(path)):
            return
        fired.set()  # (before the write below, which is an open too)
        with open(ready_file, "w", encoding="utf-8") as fh:
            fh.write(f"{name} {os.fsdecode(path)}\n")
        while os.path.exists(ready_file):  # held here until the test kills the process (or deletes the file)
            time.sleep(0.01)

    sys.addaudithook(hook)


#: a worker's sitecustomize: the rank HOLD_RANK installs the hook (torchrun workers are not started by main)
WORKER_SITE = """import os
if os.environ.get("RANK") == os.environ.get("HOLD_RANK"):
    from tests.paused_cli import install
    install(os.environ["HOLD_EVENT"], os.environ["HOLD_PATTERN"], os.environ["HOLD_READY"])
"""


def worker_env(tmp_path, **extra) -> dict:
    """The environment of a ``posttrain ... --nproc N`` test run: one thread per worker, its own data cache
    under ``tmp_path``, and the hold hook in the worker whose RANK is ``HOLD_RANK`` (given in ``extra``
    with HOLD_EVENT, HOLD_PATTERN and HOLD_READY as :func:`install` takes them; without them no worker holds)."""
    from tests.conftest import REPO, clean_env

    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(WORKER_SITE)
    env = clean_env()
    env.update(OMP_NUM_THREADS="1", POSTTRAIN_CACHE=str(tmp_path / "cache"), **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), REPO, env.get("PYTHONPATH")) if p)
    return env


def main(argv: list[str]) -> int:
    event, pattern, ready_file, separator, *command = argv
    if separator != "--" or event not in _EVENTS:
        raise SystemExit(__doc__)
    install(event, pattern, ready_file)
    from trainer_lib.cli import main as posttrain

    return posttrain(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
