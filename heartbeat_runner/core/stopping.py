"""Stopping long-running commands (``run --loop``, ``ui``, ``serve``) on SIGINT / SIGTERM.

Invariants:

- The signal handler takes no lock. Python runs a handler in the main thread between two
  bytecodes, possibly while that thread holds the lock of the very ``threading.Event`` the
  handler would set; ``Event.set()`` from a handler can therefore deadlock the process on
  its way out. The handler only flips a flag; waiters poll it every ``POLL_S``.
- The first signal asks for a graceful stop (the loop finishes its tick); it also puts the
  default handlers back, so a second Ctrl-C or SIGTERM ends the process at once. A tick is
  safe to abort anywhere: that is what the exactly-once tick is built for.
- After a stop signal, the command calls ``shutting_down()`` before it closes the engine: from
  then on the process has ``HEARTBEAT_SHUTDOWN_GRACE_S`` (default 30) seconds to end, else it
  writes every thread's stack to stderr and exits with status 1. A shutdown stuck in the
  engine, dbt or the interpreter never keeps a supervisor waiting without a clue.
- ``SIGUSR1`` (where the platform has it) writes every thread's stack to stderr, so a
  runner that seems stuck can be asked where it is without stopping it.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
from types import FrameType

from heartbeat_runner.core.early_stop import STOP_SIGNALS, adopt
from heartbeat_runner.core.settings import read_environment

#: Longest delay between a signal and a waiter noticing it.
POLL_S = 0.1


class StopRequest:
    """Set by a stop signal or by ``set()`` (tests, other threads); ``wait`` returns once it is."""

    def __init__(self, event: threading.Event | None = None, grace_s: float | None = None):
        """``grace_s``: seconds to end after a signal (default HEARTBEAT_SHUTDOWN_GRACE_S, read through
        the settings declaration)."""
        self._event = event or threading.Event()
        self._signalled = False
        self._grace_s = read_environment().shutdown_grace if grace_s is None else grace_s

    def install(self) -> StopRequest:
        """Handle SIGINT / SIGTERM (and dump stacks on SIGUSR1); a no-op off the main thread. A stop signal the
        program noted before (core/early_stop.py: one whose KeyboardInterrupt was swallowed while it started)
        counts as received now."""
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)
            dump_stacks_on_request()
            if adopt():
                self._on_signal(signal.SIGINT, None)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Flip the flag (no lock, no I/O) and let the next signal of either kind act as usual."""
        self._signalled = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def shutting_down(self) -> None:
        """After a stop signal: exit with the stacks if the process has not ended within the grace period."""
        if self._signalled and sys.__stderr__ is not None:
            faulthandler.dump_traceback_later(self._grace_s, exit=True, file=sys.__stderr__)

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._signalled or self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped or ``timeout`` seconds passed (None: until stopped); True when stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                break
            self._event.wait(left)
        return self.is_set()


def dump_stacks_on_request() -> None:
    """``kill -USR1 <pid>`` prints every thread's stack to stderr (POSIX only)."""
    # sys.__stderr__: faulthandler writes to a file descriptor, which a replaced sys.stderr may lack
    if sys.platform != "win32" and sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
