"""``heartbeat.json``: a running stage says it is alive, so a reader can tell running from stale.

A stage's rank 0 writes it beside ``metrics.jsonl`` when its loop starts (``evaluate``: in its output_dir,
its steps each model's generation and scoring), then a thread rewrites it every
``interval_s`` seconds (10; ``$POSTTRAIN_HEARTBEAT_S``) while the process lives (so a long step or a long
evaluation still counts as alive), and the stage's end writes its final state. A process killed with
SIGKILL writes nothing more: its file keeps ``"state": "running"`` with an ``updated`` time that falls behind, which
:func:`run_state` reads as ``stale``. Each write replaces the file whole (``os.replace``).

    {"state": "running", "stage": "grpo", "step": 12, "total_steps": 60, "pid": 4242, "host": "node-1",
     "started": 1733320000.0, "updated": 1733320360.5, "interval_s": 10.0, "config": {"lr": 1e-05, ...}}

``config`` is the stage's flat config with secrets redacted (what is running, before ``lineage.json``
records it with the model).

``state`` is one of ``running``, ``finished``, ``preempted`` (SIGTERM, resumable) and ``failed`` (the loop
stopped on an error: a non-finite loss, a bad batch, a lost peer).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

HEARTBEAT_FILE = "heartbeat.json"
STATES = ("running", "finished", "preempted", "failed")
#: a running heartbeat older than this many intervals is stale
STALE_INTERVALS = 3
#: seconds between beats (the environment may set it: tests beat fast)
INTERVAL_ENV = "POSTTRAIN_HEARTBEAT_S"


def beat_interval() -> float:
    return float(os.environ.get(INTERVAL_ENV) or 10.0)


class Heartbeat:
    """Writes ``<log_dir>/heartbeat.json``; ``enabled=False`` (ranks other than 0) makes every call a no-op."""

    def __init__(self, log_dir: str, stage: str, total_steps: int, enabled: bool = True, config: dict | None = None):
        self.path = os.path.join(log_dir, HEARTBEAT_FILE)
        self.enabled = enabled
        self.interval_s = interval_s = beat_interval()
        self.record = {
            "state": "running",
            "stage": stage,
            "step": 0,
            "total_steps": int(total_steps),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": round(time.time(), 3),
            "interval_s": interval_s,
            "config": config or {},
        }
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, step: int) -> None:
        """The loop begins at ``step`` (a resumed run's first): write, then keep writing until :meth:`end`."""
        if not self.enabled:
            return
        self.record["step"] = int(step)
        self.write()
        self._thread = threading.Thread(target=self._beat, name="posttrain-heartbeat", daemon=True)
        self._thread.start()

    def step(self, step: int) -> None:
        """Steps done so far (written at the next beat)."""
        self.record["step"] = int(step)

    def end(self, state: str) -> None:
        """The final state (``finished``, ``preempted`` or ``failed``), written once; later calls do nothing."""
        if not self.enabled or self.record["state"] != "running":
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        self.record["state"] = state
        self.write()

    @contextlib.contextmanager
    def failing(self):
        """An error raised inside ends the heartbeat ``failed`` (unless it ended already), then goes on."""
        try:
            yield
        except BaseException:
            self.end("failed")
            raise

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.write()
            except OSError:  # the output folder is gone: nothing left to say alive in
                return

    def write(self) -> None:
        with self._lock:
            record = {**self.record, "updated": round(time.time(), 3)}
            temp = f"{self.path}.{os.getpid()}.tmp"
            with open(temp, "w", encoding="utf-8") as fh:
                json.dump(record, fh)
            os.replace(temp, self.path)


def run_state(heartbeat: dict | None, finished: bool, now: float | None = None) -> str:
    """A stage output's state for a reader: ``finished`` when its model is complete (``summary.json``),
    else the heartbeat's final state, ``running`` while it beats, ``stale`` once it stopped beating
    (a killed process), ``unknown`` without a heartbeat (a stage of an older release)."""
    if finished:
        return "finished"
    if not isinstance(heartbeat, dict) or heartbeat.get("state") not in STATES:
        return "unknown"
    if heartbeat["state"] != "running":
        return heartbeat["state"]
    now = time.time() if now is None else now
    try:
        interval, updated = float(heartbeat.get("interval_s", 10.0)), float(heartbeat["updated"])
    except (KeyError, TypeError, ValueError):
        return "unknown"
    return "running" if now - updated <= STALE_INTERVALS * interval else "stale"
