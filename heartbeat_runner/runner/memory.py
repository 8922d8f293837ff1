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
from dataclasses import dataclass, field

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


#: a bound left at its default is at least this many times what a fresh process holds after its first tick
WORKLOAD_HEADROOM = 1.5


@dataclass
class WorkloadBound:
    """A MiB bound that, left at its default, follows the workload.

    Invariant: ``mib()`` is the configured bound when the user set it (or it is 0: off), else the larger of
    the default and ``WORKLOAD_HEADROOM`` × the largest size ``fresh`` reported (what a fresh process holds
    after its first tick). So a lakehouse whose working set is above the default (10,000 sources hold
    ~1 GiB) is not recycled or restarted after every tick, which would gain nothing and cost a start each
    time, while one that grows past its own fresh size still is."""

    configured: float
    user_set: bool
    variable: str
    fresh_mib: float = 0.0

    def mib(self) -> float:
        if self.user_set or not self.configured:
            return self.configured
        return max(self.configured, WORKLOAD_HEADROOM * self.fresh_mib)

    def fresh(self, rss_mib: float) -> None:
        """A fresh process's size after its first tick; logs once when that raises the bound."""
        before = self.mib()
        self.fresh_mib = max(self.fresh_mib, rss_mib)
        if self.mib() > before:
            log.info("%s: %.0f MiB right after a fresh start, so its default bound of %g MiB becomes %.0f MiB "
                     "(set %s to fix a bound)", self.variable, rss_mib, self.configured, self.mib(), self.variable)

    def describe(self) -> str:
        raised = "" if self.mib() == self.configured else f" (default {self.configured:g}, raised to the workload)"
        return f"{self.variable}={self.mib():.0f}{raised}"


@dataclass
class EngineRecycler:
    """Replaces the embedded engine's process when it has served enough or grown too large."""

    app: App
    policy: MemoryPolicy
    uses: int = 0
    bound: WorkloadBound = field(init=False)

    def __post_init__(self) -> None:
        self.bound = WorkloadBound(self.policy.engine_max_rss_mb, self.policy.engine_max_rss_set,
                                   "HEARTBEAT_ENGINE_MAX_RSS_MB")

    def due(self) -> str | None:
        """Why the engine should be recycled now, or None. The first use of a fresh engine tells the bound
        what the workload needs (:class:`WorkloadBound`)."""
        every = self.policy.engine_recycle_ticks
        if every and self.uses >= every:
            return f"{self.uses} uses"
        if not self.bound.configured:
            return None
        rss = self.app.engine.engine_rss_bytes() / MIB
        if self.uses == 1:
            self.bound.fresh(rss)
        if rss > self.bound.mib():
            return f"{rss:.0f} MiB > {self.bound.describe()}"
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
    #: False: the bound is the default, raised to what this process holds after its first tick (WorkloadBound)
    user_set: bool = True
    bound: WorkloadBound = field(init=False)
    _checks: int = 0

    def __post_init__(self) -> None:
        self.bound = WorkloadBound(self.max_rss_mb, self.user_set, "HEARTBEAT_MAX_RSS_MB")

    def passed(self) -> float | None:
        """The tree's RSS in MiB when it is above the ceiling, else None. The tree's RSS is read (and kept in
        the metrics, for scrapes to read without a look at the processes) even without a ceiling."""
        rss_bytes = tree_rss_bytes(leave_out=is_job_run)
        metrics().tree_rss.set(rss_bytes)
        rss = rss_bytes / MIB
        self._checks += 1
        if self._checks == 1:
            self.bound.fresh(rss)
        limit = self.bound.mib()
        return rss if limit and rss > limit else None


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
