"""Preemption as a contract: SIGTERM ends a training stage at a step boundary with a checkpoint.

Kubernetes evicts a pod (node drain, spot reclaim, a higher-priority pod) by sending SIGTERM and,
after the pod's ``terminationGracePeriodSeconds`` (30 s by default), SIGKILL. A stage that uses the
grace period loses nothing: on SIGTERM it finishes the step in progress, all ranks agree at that
step's end to stop (one all-reduce of the flag, so every rank stops at the same step even when the
signal reached them at different moments), it writes a complete checkpoint of that step and exits
with :data:`PREEMPTED_EXIT`, which callers report as retryable. The retried pod resumes from that
checkpoint bit-exact.

``preemption.grace_s`` bounds the whole stop: from SIGTERM, a watchdog ends the process with
:data:`PREEMPTED_EXIT` once that many seconds have passed, whatever it is doing (a step longer than
the grace period is abandoned, as is a save that cannot finish: its checkpoint has no ``COMPLETE``
marker, so the retry resumes from the one before). A save is skipped at once when an earlier save of
this run took longer than the time left. How long a save takes grows with the model and its
optimizer state (about 16 bytes per trainable parameter with Adam, plus the weights, hashed once):
the default of 25 s fits small models under Kubernetes' default 30 s; for large ones raise both the
pod's grace period and ``preemption.grace_s`` (a little below it). ``grace_s=0`` leaves SIGTERM to
its default action (the process dies at once, as with SIGKILL, and resumes from the last scheduled
checkpoint).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

#: The exit status of a stage stopped by SIGTERM: EX_TEMPFAIL of sysexits.h, "a temporary failure;
#: the user is invited to retry". Distinct from 2 (a user's mistake) and 1 (a failure such as storage).
PREEMPTED_EXIT = 75


class Preempted(Exception):
    """SIGTERM stopped the stage at a step boundary; a retry resumes from the newest complete checkpoint."""


class Preemption:
    """The SIGTERM handler of one training run, installed while its steps run.

    The handler only records the time and starts the deadline; the training loop asks
    :meth:`requested` at each step boundary (every rank at the same step)."""

    def __init__(self, grace_s: float):
        self.grace_s = float(grace_s)
        self.received_at: float | None = None
        self._previous = None
        self._installed = False
        self._deadline_started = False

    def install(self) -> None:
        """Take over SIGTERM (the main thread only can; elsewhere, and with ``grace_s`` 0, nothing)."""
        if self.grace_s <= 0 or threading.current_thread() is not threading.main_thread() or self._installed:
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        """Give SIGTERM back to the handler it had before (a stop already under way keeps its deadline)."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _handle(self, signum, frame) -> None:
        if self.received_at is None:
            self.received_at = time.monotonic()
            self.start_deadline()

    def start_deadline(self) -> None:
        """End the process with :data:`PREEMPTED_EXIT` ``grace_s`` after the stop began, whatever runs."""
        if self._deadline_started:
            return
        self._deadline_started = True
        if self.received_at is None:  # (a rank that learnt of the stop from another)
            self.received_at = time.monotonic()
        threading.Thread(target=self._deadline, name="preemption-deadline", daemon=True).start()

    def _deadline(self) -> None:
        from trainer_lib.engine.collectives import say

        time.sleep(max(self.seconds_left(), 0.0))
        say(
            f"preempted: not stopped within preemption.grace_s={self.grace_s:g} s of SIGTERM; exiting now "
            f"(status {PREEMPTED_EXIT}); the retry resumes from the newest complete checkpoint"
        )
        os._exit(PREEMPTED_EXIT)

    def seconds_left(self) -> float:
        """Seconds until the deadline (``grace_s`` before any SIGTERM)."""
        if self.received_at is None:
            return self.grace_s
        return self.grace_s - (time.monotonic() - self.received_at)

    def requested(self, strategy) -> bool:
        """Whether any rank got SIGTERM; every rank calls this at the same step boundary (one all-reduce
        of the flag when there are several). A rank that learns of it here starts its own deadline."""
        local = 1.0 if self.received_at is not None else 0.0
        stop = strategy.all_reduce(local, op="max") > 0 if strategy.world_size > 1 else local > 0
        if stop:
            self.start_deadline()
        return bool(stop)

    def agreed(self, strategy, ok: bool) -> bool:
        """``ok`` on every rank (one all-reduce when there are several)."""
        if strategy.world_size <= 1:
            return ok
        return strategy.all_reduce(0.0 if ok else 1.0, op="max") == 0.0


@contextlib.contextmanager
def passing_sigterm_to(process):
    """While the block runs, a SIGTERM to this process is sent on to ``process`` (a ``subprocess.Popen``)
    instead of ending this one, which then waits for it: a launcher in front of the training processes
    (the train component running ``posttrain --nproc``) lets them stop with their checkpoint. Only the
    main thread can take over a signal; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: process.send_signal(signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
