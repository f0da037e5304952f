"""The search's reaper: a small process that kills every trial's process group when the search ends,
however it ends (SIGKILL included).

    with TrialReaper() as reaper:
        reaper.add(trial.pgid)      # ... a trial started
        reaper.remove(trial.pgid)   # ... it ended

It runs as ``python -m trainer_lib.runner.tune.trial_reaper`` in a session of its own (so a signal to
the search's process group does not reach it) and reads ``+PGID`` and ``-PGID`` lines on its stdin,
a pipe from the search. When the search ends, the pipe's last writer is gone and the reaper reads
end-of-file: it sends SIGKILL to the groups still listed and exits. Trials inherit no copy of the pipe
(``close_fds``), so they cannot keep it open. Nothing but the standard library is imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading


class TrialReaper:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def __enter__(self) -> TrialReaper:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer_lib.runner.tune.trial_reaper"],
            stdin=subprocess.PIPE,
            start_new_session=True,
            text=True,
        )
        return self

    def send(self, line: str) -> None:
        with self.lock:
            if self.proc is not None and self.proc.stdin is not None:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()

    def add(self, pgid: int) -> None:
        self.send(f"+{pgid}")

    def remove(self, pgid: int) -> None:
        self.send(f"-{pgid}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            with self.lock:
                self.proc.stdin.close()
            self.proc.wait()
            self.proc = None


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the search's to handle
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] == "+":
            groups.add(int(line[1:]))
        elif line[:1] == "-":
            groups.discard(int(line[1:]))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    main()
