"""Fault injection for tests.

``HEARTBEAT_CRASH_AT=<point>`` kills the process there (crash tests);
``HEARTBEAT_FAIL_AT=<point>[:N]`` raises an unexpected (non-Heartbeat) exception there,
the first N times in this process (default 1), as an engine failure would (loop tests);
``HEARTBEAT_HANG_AT=<point>`` blocks there for good, as a stuck engine call would (stop tests);
``HEARTBEAT_PAUSE_AT=<point>:<file>`` pauses there once per process: it creates ``<file>`` on arrival and
goes on once the test removes it, so a test acts mid-tick (a signal, a commit) without guessing with sleeps.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from heartbeat_runner.core.names import TextEnum


class FaultPoint(TextEnum):
    """Every point where a test may crash (``HEARTBEAT_CRASH_AT``), fail or hang the process: the one
    registry. ``crash_point``/``fail_point`` take a member, so mypy rejects a point that is not here."""

    # a tick, in order (runner/tick.py, lakehouse/dbt_invoke.py)
    AFTER_SENSING = "after_sensing"
    AFTER_NEW_DATA_EVENTS = "after_new_data_events"
    DURING_DBT_BUILD = "during_dbt_build"
    AFTER_TRIGGER_REQUESTED = "after_trigger_requested"
    AFTER_TRIGGER_CALL = "after_trigger_call"
    DURING_TRIGGER_CALLS = "during_trigger_calls"
    AFTER_TRIGGERED = "after_triggered"
    AFTER_TRIGGERING = "after_triggering"  # the triggering stage done, reconciliation not started
    AFTER_NEXT_WINDOW_REQUESTED = "after_next_window_requested"
    AFTER_RETRY_REQUESTED = "after_retry_requested"  # a retry recorded, the jobs API not called yet
    CLOSING = "closing"
    # alerts (runner/alerting.py): a raised or resolved alert recorded, its message not sent yet
    AFTER_ALERT_RECORDED = "after_alert_recorded"
    # lineage (runner/lineage.py): an OpenLineage event accepted by its transport, LINEAGE_SENT not recorded yet
    AFTER_LINEAGE_SENT = "after_lineage_sent"
    # maintenance (lakehouse/maintenance.py): archiving moves keys staged, copied, deleted
    ARCHIVE_EVENTS_AFTER_STAGING = "archive_events_after_staging"
    ARCHIVE_EVENTS_AFTER_COPY = "archive_events_after_copy"
    ARCHIVE_EVENTS_AFTER_DELETE = "archive_events_after_delete"
    ARCHIVE_RUNS_AFTER_STAGING = "archive_runs_after_staging"
    ARCHIVE_RUNS_AFTER_COPY = "archive_runs_after_copy"
    ARCHIVE_RUNS_AFTER_DELETE = "archive_runs_after_delete"
    ARCHIVE_REPORT_AFTER_STAGING = "archive_report_after_staging"
    ARCHIVE_REPORT_AFTER_COPY = "archive_report_after_copy"
    ARCHIVE_REPORT_AFTER_DELETE = "archive_report_after_delete"
    DURING_COMPACTION = "during_compaction"
    # wake-ups (runner/wakeups.py): a source's notification arrives and is lost
    LOSE_WAKE_UP = "lose_wake_up"


#: The step boundaries of a plain tick a crash test kills the runner at (tests/test_crash.py runs each).
CRASH_POINTS = (FaultPoint.AFTER_SENSING, FaultPoint.AFTER_NEW_DATA_EVENTS, FaultPoint.DURING_DBT_BUILD,
                FaultPoint.AFTER_TRIGGER_REQUESTED, FaultPoint.AFTER_TRIGGER_CALL, FaultPoint.DURING_TRIGGER_CALLS,
                FaultPoint.AFTER_TRIGGERED)


@dataclass(frozen=True)
class ArchiveSteps:
    """The crash points of moving one table's rows to its archive."""

    after_staging: FaultPoint
    after_copy: FaultPoint
    after_delete: FaultPoint


#: what maintenance archives -> its crash points
ARCHIVE_STEPS = {what: ArchiveSteps(*(FaultPoint(f"archive_{what}_{step}")
                                      for step in ("after_staging", "after_copy", "after_delete")))
                 for what in ("events", "runs", "report")}
CRASH_EXIT_CODE = 86


def crash_point(point: FaultPoint) -> None:
    """Die here, abruptly (no cleanup, like a killed process), when HEARTBEAT_CRASH_AT names this point."""
    if os.environ.get("HEARTBEAT_CRASH_AT") == point.value:
        os._exit(CRASH_EXIT_CODE)


class InjectedFault(RuntimeError):
    """The exception HEARTBEAT_FAIL_AT raises: deliberately not a HeartbeatError."""


_failures_left: dict[str, int] = {}
_lock = threading.Lock()


_paused: set[str] = set()

#: how often a paused point looks whether its file is gone
PAUSE_POLL_S = 0.02


def _pause_once(name: str) -> None:
    """HEARTBEAT_PAUSE_AT=<name>:<file>, the first time this process reaches ``name``: create ``<file>``, then
    wait until it is removed (by the test that set it)."""
    chosen, _, marker = os.environ.get("HEARTBEAT_PAUSE_AT", "").partition(":")
    if chosen != name or not marker:
        return
    with _lock:
        if name in _paused:
            return
        _paused.add(name)
    with open(marker, "w", encoding="utf-8") as file:
        file.write(f"{os.getpid()}\n")
    while os.path.exists(marker):
        time.sleep(PAUSE_POLL_S)


def fail_point(point: FaultPoint) -> None:
    """Raise InjectedFault here while HEARTBEAT_FAIL_AT=<point>[:N] has failures left; never return
    when HEARTBEAT_HANG_AT=<point>."""
    name = point.value
    while os.environ.get("HEARTBEAT_HANG_AT") == name:
        time.sleep(1)
    _pause_once(name)
    chosen, _, count = os.environ.get("HEARTBEAT_FAIL_AT", "").partition(":")
    if chosen != name:
        return
    with _lock:
        left = _failures_left.setdefault(name, int(count or 1))
        if left <= 0:
            return
        _failures_left[name] = left - 1
    raise InjectedFault(f"injected failure at {name}")
