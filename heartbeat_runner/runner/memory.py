"""Memory of long-running processes: recycle the embedded engine, and restart past a ceiling.

The embedded engine (Sail 0.7.2) keeps native memory for every SQL text it parses and gives it
back only when its process ends (docs/memory.md). It runs in a child process, so:

- :class:`EngineRecycler` replaces that child between ticks (``run --loop``) or between reads
  (``ui``), after ``engine_recycle_ticks`` uses or once the child holds ``engine_max_rss_mb``, and
  parks it (ends it until the next query) after ``engine_park_after_s`` without a query;
- :class:`MemoryCeiling` is the safety net for anything else: after a tick in which the whole
  process tree holds more than ``max_rss_mb``, ``run --loop`` ends its tick normally, closes
  everything and re-executes its own command line (:func:`restart_process`). The pid stays the
  same; nothing Heartbeat keeps lives in memory (events, cursors and the control table are Delta
  tables, the tick lease is released between ticks), so nothing is lost or done twice.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.metrics import metrics
from heartbeat_runner.core.processes import tree_rss_bytes
from heartbeat_runner.core.settings import MemoryPolicy
from heartbeat_runner.jobs.local import is_job_run
from heartbeat_runner.runner.app import App

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: how many times this loop has restarted itself (carried across ``exec`` in the environment)
RESTARTS_VARIABLE = "HEARTBEAT_LOOP_RESTARTS"


def loop_restarts() -> int:
    """How many times the running loop has restarted itself past its memory ceiling."""
    text = os.environ.get(RESTARTS_VARIABLE, "0")
    return int(text) if text.isdigit() else 0


@dataclass
class EngineRecycler:
    """Replaces the embedded engine's process when it has served enough or grown too large."""

    app: App
    policy: MemoryPolicy
    uses: int = 0

    def due(self) -> str | None:
        """Why the engine should be recycled now, or None."""
        every, bound = self.policy.engine_recycle_ticks, self.policy.engine_max_rss_mb
        if every and self.uses >= every:
            return f"{self.uses} uses"
        if bound and (rss := self.app.engine.engine_rss_bytes() / MIB) > bound:
            return f"{rss:.0f} MiB > HEARTBEAT_ENGINE_MAX_RSS_MB={bound:g}"
        return None

    def after_use(self) -> float | None:
        """Count one tick (or read); park the engine when it has been idle long enough, else recycle it
        if due. The seconds a recycle took, else None."""
        engine = self.app.engine
        if not engine.can_recycle or engine.parked:
            return None
        park_after = self.policy.engine_park_after_s
        if park_after and engine.idle_s >= park_after and engine.park():
            self.uses = 0  # the next start is a fresh process
            log.info("embedded engine parked after %.0f s without a query", park_after)
            return None
        self.uses += 1
        reason = self.due()
        if reason is None:
            return None
        took = self.app.recycle_engine()
        self.uses = 0
        log.info("embedded engine recycled (%s) in %.2f s", reason, took)
        return took


@dataclass
class MemoryCeiling:
    """The whole process tree's memory bound (``max_rss_mb``; 0: none): the runner and its engine, not the
    local job runs it started (their memory is the jobs', and they outlive a restart)."""

    max_rss_mb: float

    def passed(self) -> float | None:
        """The tree's RSS in MiB when it is above the ceiling, else None. The tree's RSS is read (and kept in
        the metrics, for scrapes to read without a look at the processes) even without a ceiling."""
        rss_bytes = tree_rss_bytes(leave_out=is_job_run)
        metrics().tree_rss.set(rss_bytes)
        rss = rss_bytes / MIB
        return rss if self.max_rss_mb and rss > self.max_rss_mb else None


class RestartRequested(HeartbeatError):
    """The loop passed its memory ceiling: close everything, then :func:`restart_process`."""


def restart_process(reason: str) -> None:
    """Replace this process with a fresh run of its own command line (same pid); never returns.

    Call only after everything is closed: the engine's child ends with its pipe, which ``exec``
    closes; the restart count goes along in the environment."""
    restarts = loop_restarts() + 1
    os.environ[RESTARTS_VARIABLE] = str(restarts)
    print(f"restarting (restart {restarts}): {reason}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
