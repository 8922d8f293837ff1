"""What a tick did and how it is watched: :class:`TickResult` (what ``run --json`` prints and the run report
records), the observers called after its report, the streak of idle ticks the report coalesces, and the small
helpers every step of a tick shares (an event of the tick, a timed stage).

A leaf of the runner: it imports nothing from the tick's steps, which all import it."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from heartbeat_runner.core.logs import TICK_STAGE
from heartbeat_runner.core.records import Event, EventType, Outcome, RunSummary, TickStatus, utcnow
from heartbeat_runner.lakehouse.control_table import Refresh
from heartbeat_runner.lakehouse.maintenance import MaintenanceResult
from heartbeat_runner.lakehouse.store import SkippedSource
from heartbeat_runner.policies.trigger_shaping import HoldKind
from heartbeat_runner.runner.wakeups import POLL, TickScope
from heartbeat_runner.sensing.parallel import SensingOutcome

#: the key of a run summary's figures that carries the jobs backend's memory to the next process
BACKEND_MEMORY = "jobs_backend_memory"
#: the key of a run summary's figures that lists the tick's control table refreshes (Refresh.as_dict, in order)
CONTROL_REFRESHES = "control_refreshes"
#: the events that start or end a run of a job (TickResult.run_events)
RUN_EVENT_TYPES = (EventType.TRIGGERED, EventType.COMPLETED, EventType.FAILED, EventType.REFUSED)
#: figures of a run summary's stage_timings that are counts, not seconds of a stage
COUNT_FIGURES = ("idle_ticks", "sql_parses", "mean_sql_parses", "engine_recycles", "engine_wakes", "loop_restarts")


@dataclass(frozen=True)
class TriggeredJob:
    """A job the jobs API started in this tick."""

    job_id: str
    run_id: str

    def as_dict(self) -> dict[str, str]:
        return {"job_id": self.job_id, "run_id": self.run_id}


@dataclass(frozen=True)
class JobProblem:
    """Something about one job the operator should see: a refused or failed API call, an overdue run."""

    job_id: str
    message: str

    def as_dict(self, key: str = "error") -> dict[str, str]:
        return {"job_id": self.job_id, key: self.message}

    def __str__(self) -> str:
        return f"{self.job_id}: {self.message}"


@dataclass
class TickResult:
    """What one tick did. ``as_dict`` is the shape `run --json` prints."""

    run_id: str
    snapshot_ts: datetime
    sensed: list[SensingOutcome] = field(default_factory=list)
    skipped: list[SkippedSource] = field(default_factory=list)
    triggered: list[TriggeredJob] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    #: runs that ended without success: failures, and refusals (also in ``refused``)
    failed: list[str] = field(default_factory=list)
    #: runs the jobs service refused to execute (a disabled job, a budget policy): REFUSED, never retried by policy
    refused: list[str] = field(default_factory=list)
    #: job id -> when its run in ``completed`` or ``failed`` ended, as its jobs backend recorded it (absent where
    #: the backend does not know): what the control table's job_end_timestamp says, so the alert monitor of a
    #: loop holds the same times as one that a new process loads from the table
    ended_at: dict[str, datetime] = field(default_factory=dict)
    trigger_errors: list[JobProblem] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)  # job ids re-run by their retry policy
    #: job id -> the note of the run an operator asked for (`trigger`, "Run now") this tick requested
    manual: dict[str, str] = field(default_factory=dict)
    overdue: list[JobProblem] = field(default_factory=list)  # runs past their maximum duration
    #: runs the jobs service skipped without executing them: their data is asked for again at a later tick
    runs_skipped: list[JobProblem] = field(default_factory=list)
    #: requests held back this tick: their last run was skipped for a workspace limit and the back-off is not over
    runs_deferred: list[JobProblem] = field(default_factory=list)
    #: ready jobs (and retries) a trigger hold kept back this tick (policies/trigger_shaping.py): which hold, until when
    held: list[JobProblem] = field(default_factory=list)
    #: job id -> the hold that kept it back this tick (the ``heartbeat_jobs_held`` metric counts them by kind)
    held_by: dict[str, HoldKind] = field(default_factory=dict)
    #: the earliest time a hold of ``held`` ends by itself (a minimum interval, a quiet period, a fire time; None:
    #: none does): a loop polls then rather than at its next interval (runner/loop.py)
    release_at: datetime | None = None
    #: runs that never executed, by (termination code, fate): fate ``skipped`` (asked again next tick),
    #: ``limited`` (asked again after a back-off), ``refused`` (a terminal non-run), ``deferred`` (an ask held
    #: back by the back-off): the ``heartbeat_job_runs_not_executed`` metric
    not_executed: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: job ids whose trigger request or run lookup did not fit the tick's API budget (done next tick, in order)
    carried: list[str] = field(default_factory=list)
    #: what the jobs backend said about how it read (e.g. a listing over its page budget)
    api_notes: list[str] = field(default_factory=list)
    #: source keys that sensed again after their latest recorded sensing failed (recorded, never coalesced)
    recovered: list[str] = field(default_factory=list)
    stage_timings: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    #: events this tick appended (0 for a tick that found and changed nothing)
    events_written: int = 0
    #: SQL texts this tick sent to the engine (each one parsed there; see Engine.sql)
    sql_parses: int = 0
    #: the control table's last build of the tick folded its trigger requests in (see ControlTable.refresh)
    control_folded: bool = False
    #: the control build before triggering folded the tick's new data in (see ControlTable.refresh)
    new_data_folded: bool = False
    #: every refresh of the control table the tick made, in order: its path and, for a build, why no fold
    refreshes: list[Refresh] = field(default_factory=list)
    maintenance: MaintenanceResult | None = None
    #: which due sources the tick sensed: every one (a poll), or those a wake-up named
    scope: TickScope = POLL

    @property
    def polled(self) -> bool:
        """The tick sensed every due source (not only those a wake-up named)."""
        return self.scope.polls
    #: the TRIGGERED, COMPLETED and FAILED events this tick recorded, in order (what lineage reports)
    run_events: list[Event] = field(default_factory=list)

    @property
    def sensor_errors(self) -> list[SensingOutcome]:
        return [s for s in self.sensed if s.outcome is Outcome.ERROR]

    @property
    def triggered_job_ids(self) -> list[str]:
        return [t.job_id for t in self.triggered]

    @property
    def sources_with_new_data(self) -> int:
        return sum(1 for s in self.sensed if s.outcome is Outcome.NEW_DATA)

    @property
    def exit_code(self) -> int:
        """0: all good; 2: some source or job API call failed (the rest was processed)."""
        return 2 if self.sensor_errors or self.trigger_errors else 0

    @property
    def is_idle(self) -> bool:
        """Nothing sensed, triggered, reconciled, written or failed: the run report coalesces such ticks."""
        return (self.events_written == 0 and self.sources_with_new_data == 0 and self.exit_code == 0
                and not (self.triggered or self.completed or self.failed or self.retried or self.overdue
                         or self.runs_skipped
                         or self.carried or self.api_notes or self.recovered)
                and not any(s.note for s in self.sensed))

    @property
    def status(self) -> TickStatus:
        return TickStatus.ERROR if self.exit_code else TickStatus.OK

    def refresh_paths(self) -> list[dict[str, str]]:
        """The tick's control table refreshes as its run summary records them (Refresh.as_dict, in order)."""
        return [refresh.as_dict() for refresh in self.refreshes]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "snapshot_ts": self.snapshot_ts, "duration_s": round(self.duration_s, 3),
            "sensed": [s.as_dict() for s in self.sensed],
            "skipped": [{"source_key": s.source_key, "reason": s.reason} for s in self.skipped],
            "triggered": [t.as_dict() for t in self.triggered],
            "completed": self.completed, "failed": self.failed, "refused": self.refused,
            "trigger_errors": [p.as_dict() for p in self.trigger_errors],
            "retried": self.retried, "manual": self.manual,
            "overdue": [p.as_dict("message") for p in self.overdue],
            "runs_skipped": [p.as_dict("message") for p in self.runs_skipped],
            "runs_deferred": [p.as_dict("message") for p in self.runs_deferred],
            "held": [p.as_dict("hold") for p in self.held],
            "carried": self.carried, "api_notes": self.api_notes, "recovered": self.recovered,
            "stage_timings": self.stage_timings, "sql_parses": self.sql_parses, "exit_code": self.exit_code,
            "scope": self.scope.describe(), CONTROL_REFRESHES: self.refresh_paths(),
            **({"maintenance": self.maintenance.as_dict()} if self.maintenance else {}),
        }


class TickObserver:
    """Watches each tick's result after its report is written (the alert monitor, runner/alerting.py; lineage,
    runner/lineage.py).

    The default watches nothing. ``observe`` must not raise and must not block on the network.
    """

    def observe(self, result: TickResult) -> None:
        """Called once per tick, after the report."""

    def close(self) -> None:
        """Called when the runner stops."""


@dataclass
class TickObservers(TickObserver):
    """Several observers, called in order."""

    observers: list[TickObserver]

    def observe(self, result: TickResult) -> None:
        for observer in self.observers:
            observer.observe(result)

    def close(self) -> None:
        for observer in self.observers:
            observer.close()


@dataclass
class IdleStreak:
    """Consecutive idle ticks, written to the run summary as one row when the streak ends or grows old."""

    first_run_id: str
    first_snapshot: datetime
    ticks: int = 0
    duration_s: float = 0.0
    sources_sensed: int = 0
    sql_parses: int = 0
    began: float = field(default_factory=time.monotonic)

    def add(self, result: TickResult) -> None:
        self.ticks += 1
        self.duration_s += result.duration_s
        self.sources_sensed = len(result.sensed)
        self.sql_parses += result.sql_parses

    def summary(self, process: dict[str, Any] | None = None) -> RunSummary:
        return RunSummary(
            run_id=self.first_run_id, snapshot_ts=self.first_snapshot, ended_ts=utcnow(),
            duration_s=round(self.duration_s, 4), sources_sensed=self.sources_sensed, sources_with_new_data=0,
            sensor_errors=0, jobs_triggered=0, jobs_completed=0, jobs_failed=0, trigger_errors=0,
            status=TickStatus.OK,
            message=f"{self.ticks} idle tick(s) coalesced: nothing new, triggered or reconciled",
            stage_timings=json.dumps({"idle_ticks": self.ticks,
                                      "mean_tick_s": round(self.duration_s / max(1, self.ticks), 4),
                                      "mean_sql_parses": round(self.sql_parses / max(1, self.ticks), 1),
                                      **(process or {})}),
        )


def tick_event(result: TickResult, kind: EventType, job_id: str, **fields: Any) -> Event:
    """An event of the tick ``result`` about job ``job_id``."""
    return Event(event_type=kind, run_id=result.run_id, snapshot_ts=result.snapshot_ts, trigger_job_id=job_id,
                 **fields)


class stage:
    """Adds the wall time of a block to ``timings[name]``; the block's log lines name the stage."""

    def __init__(self, timings: dict[str, float], name: str):
        self.timings, self.name = timings, name

    def __enter__(self) -> None:
        self.began = time.monotonic()
        self.token = TICK_STAGE.set(self.name)

    def __exit__(self, *exc) -> None:
        TICK_STAGE.reset(self.token)
        self.timings[self.name] = self.timings.get(self.name, 0.0) + time.monotonic() - self.began
