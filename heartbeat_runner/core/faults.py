"""Fault injection for tests.

``HEARTBEAT_CRASH_AT=<point>`` kills the process there (crash tests);
``HEARTBEAT_FAIL_AT=<point>[:N]`` raises an unexpected (non-Heartbeat) exception there,
the first N times in this process (default 1), as an engine failure would (loop tests);
``HEARTBEAT_HANG_AT=<point>`` blocks there for good, as a stuck engine call would (stop tests).
"""

from __future__ import annotations

import os
import threading
import time

#: Named step boundaries of a tick (see tick.py for the order).
CRASH_POINTS = (
    "after_sensing",
    "after_new_data_events",
    "during_dbt_build",
    "after_trigger_requested",
    "after_trigger_call",
    "during_trigger_calls",
    "after_triggered",
)
CRASH_EXIT_CODE = 86


def crash_point(name: str) -> None:
    """Die here, abruptly (no cleanup, like a killed process), when HEARTBEAT_CRASH_AT names this point."""
    if os.environ.get("HEARTBEAT_CRASH_AT") == name:
        os._exit(CRASH_EXIT_CODE)


class InjectedFault(RuntimeError):
    """The exception HEARTBEAT_FAIL_AT raises: deliberately not a HeartbeatError."""


_failures_left: dict[str, int] = {}
_lock = threading.Lock()


def fail_point(name: str) -> None:
    """Raise InjectedFault here while HEARTBEAT_FAIL_AT=<name>[:N] has failures left; never return
    when HEARTBEAT_HANG_AT=<name>."""
    while os.environ.get("HEARTBEAT_HANG_AT") == name:
        time.sleep(1)
    point, _, count = os.environ.get("HEARTBEAT_FAIL_AT", "").partition(":")
    if point != name:
        return
    with _lock:
        left = _failures_left.setdefault(name, int(count or 1))
        if left <= 0:
            return
        _failures_left[name] = left - 1
    raise InjectedFault(f"injected failure at {name}")
