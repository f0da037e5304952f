"""One trial of a search: a ``posttrain <stage> --config FILE`` process, followed while it trains.

    trial = TrialProcess([python, "-m", "trainer_lib.cli", "dpo", "--config", path], out_dir)
    outcome = trial.follow(on_eval, poll_s=0.5, timeout_s=0)   # on_eval(step, record) -> True stops it

The process starts a session (a process group) of its own, so that stopping it stops everything it
started; :class:`~trainer_lib.runner.tune.trial_reaper.TrialReaper` kills that group when the search
dies. A trial given ``on_start`` (the search's: ``reaper.add``) is held before its command runs until
``on_start(pgid)`` has returned: a search that dies between starting the process and the reaper's
knowing its group (SIGKILL in that window) leaves a held process, which sees the go-ahead pipe close
and exits without running the command. Every process of the trial carries
``POSTTRAIN_TUNE_TRIAL=<its config file>`` in its environment, by which a resumed search finds what a
dead one left (:func:`kill_leftover`). Its stdout and stderr go to ``trial.log`` in its output
directory. Its eval records are read from its ``metrics.jsonl`` as the stage writes them (one flushed
JSON line per record, :mod:`trainer_lib.loop.tracking`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainer_lib.engine.process_group import own_group_env

LOG_FILE = "trial.log"
METRICS_FILE = "metrics.jsonl"
MARKER_ENV = "POSTTRAIN_TUNE_TRIAL"

#: What a held trial runs first (``python -I -S -c HOLD FD COMMAND...``): it waits for a byte on the pipe
#: FD, then becomes COMMAND (same pid, same group); end-of-file (the search died first) ends it unrun.
HOLD = """import os, sys
fd = int(sys.argv[1])
go = os.read(fd, 1)
os.close(fd)
if not go:
    os._exit(75)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"error: cannot run {sys.argv[2]}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)
"""


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # None: stopped by on_eval or by the timeout
    stopped_at: int | None  # the eval step on_eval stopped it at
    timed_out: bool
    reason: str  # why it failed, one line ("" when it exited 0)


class TrialProcess:
    def __init__(
        self,
        command: list[str],
        output_dir: str,
        marker: str,
        log_to_file: bool = True,
        on_start: Callable[[int], None] | None = None,
    ):
        os.makedirs(output_dir, exist_ok=True)
        self.output_dir = output_dir
        self.log_path = os.path.join(output_dir, LOG_FILE)
        self.metrics_path = os.path.join(output_dir, METRICS_FILE)
        self._offset = 0
        hold = go = None
        if on_start is not None:
            if shutil.which(command[0]) is None:  # as Popen would say it, not as a held trial's failure
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[0])
            hold, go = os.pipe()
            command = [sys.executable, "-I", "-S", "-c", HOLD, str(hold), *command]
        try:
            # log_to_file=False: the trial prints to this process's stdout (a Katib trial's pod log)
            with open(self.log_path, "ab") if log_to_file else contextlib.nullcontext() as log:
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT if log_to_file else None,
                    start_new_session=True,
                    env={**own_group_env(), "POSTTRAIN_NO_PROGRESS": "1", MARKER_ENV: marker},
                    pass_fds=() if hold is None else (hold,),
                )
        except BaseException:
            if go is not None:
                os.close(go)
            raise
        finally:
            if hold is not None:
                os.close(hold)
        self.pgid = self.proc.pid  # a new session's leader: its pid is the group's id
        if go is not None:
            try:
                on_start(self.pgid)
            except BaseException:
                os.close(go)  # the held process reads end-of-file and exits unrun
                self.proc.wait()
                raise
            try:
                os.write(go, b"g")
            except OSError:  # it is gone already (killed): follow() sees its end
                pass
            finally:
                os.close(go)

    def new_records(self) -> list[dict]:
        """The records ``metrics.jsonl`` gained since the last call (whole lines only)."""
        try:
            with open(self.metrics_path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def follow(self, on_eval: Callable[[int, dict], bool], poll_s: float = 0.5, timeout_s: float = 0.0) -> Outcome:
        """Wait for the process, handing each eval record to ``on_eval(step, record)`` as it appears; when
        that returns True, or after ``timeout_s`` (0: none), the process group is killed."""
        started = time.monotonic()
        while True:
            finished = self.proc.poll() is not None
            for record in self.new_records():
                if record.get("split") == "eval" and on_eval(int(record.get("step", 0)), record) and not finished:
                    self.kill()
                    return Outcome(None, int(record.get("step", 0)), False, "")
            if finished:
                kill_group(self.pgid)  # what the trial started and left running ends with it
                code = self.proc.returncode
                return Outcome(code, None, False, "" if code == 0 else failure_reason(self.log_path, code))
            if timeout_s and time.monotonic() - started > timeout_s:
                self.kill()
                return Outcome(None, None, True, f"timed out after {timeout_s:g} s (trial_timeout_s)")
            time.sleep(poll_s)

    def kill(self) -> None:
        """SIGKILL to the trial's whole process group, then reap its leader."""
        kill_group(self.pgid)
        self.proc.wait()


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_leftover(marker: str) -> int:
    """Kill the process groups of the processes whose environment carries ``marker`` (what a search that
    died left of a trial); returns how many processes carried it."""
    needle = f"{MARKER_ENV}={marker}".encode() + b"\0"
    groups = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read() + b"\0":
                    groups.add((int(entry), os.getpgid(int(entry))))
        except (OSError, ProcessLookupError):
            continue
    for _, pgid in groups:
        kill_group(pgid)
    return len(groups)


def failure_reason(log_path: str, code: int) -> str:
    """One line on why a trial failed: the CLI's ``error:`` line, else a traceback's last line, else how
    it ended (a signal's name: SIGKILL from outside is often the kernel's out-of-memory killer)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            lines = [line.strip() for line in fh.read().splitlines()[-200:] if line.strip()]
    except OSError:
        lines = []
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1][len("error:") :].strip()
    raised = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    if raised:
        return raised[-1]
    if code < 0:
        name = signal.Signals(-code).name
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exit status {code}"
