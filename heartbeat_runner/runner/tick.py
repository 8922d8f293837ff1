"""One tick of the heartbeat: sense, record, decide (dbt), trigger, reconcile.

The order is what makes a tick safe to crash anywhere:

1. sense every due source (cursors come from the events table); note the
   sources skipped because no row reading them is eligible;
2. append the NEW_DATA/CURSOR events in one commit; the cursor *is* the latest
   event, so it can never advance without the event (event ids are deterministic:
   hash of the source, the cursor event sensed from and the window, so re-sensing
   the same window after a crash yields the same event);
3. bring the control table up to date when any event arrived since the last build: the tick's new data
   folded into its sources' rows, else a dbt build
   (:class:`~heartbeat_runner.lakehouse.control_table.ControlTable` knows what it was built at);
4. resume, first and in order, requests an earlier tick recorded that never got a run
   id (same token, so no second run: a crash, an unknown outcome, or the API budget);
   then for each job in ``jobs_ready_to_trigger``: append TRIGGER_REQUESTED with a
   deterministic idempotency token (all in one commit), *then* call the jobs API with
   those tokens on a bounded pool of workers within the tick's API budget, then append
   every TRIGGERED with its run id in one commit (``before_trigger`` runs first: the
   CLI checks there that it still holds the lease); a request the budget left out
   stays recorded and is resumed next tick;
5. reconcile IN_PROGRESS jobs in one ``JobsBackend.reconcile`` (finished runs become
   COMPLETED / FAILED) and look for a successful run of FAILED jobs (unblocks them); when runs completed,
   steps 1-4 again for those jobs alone (``Heartbeat._after_ends``): their sources, skipped while they ran,
   are sensed, and data that landed meanwhile starts their next run in this tick, not at the next poll;
6. bring the control and sensor state tables up to date, then write the run report. When all the
   tick appended after its control build is its own trigger requests, their answers and the ends of runs,
   each commit is folded into the rows it changes (``ControlTable.refresh``) instead of every row derived
   again; anything else, or another process's commit, and dbt derives the table from the events.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from heartbeat_runner.core.errors import JobsBackendError, SourceError
from heartbeat_runner.core.faults import FaultPoint, crash_point, fail_point
from heartbeat_runner.core.logs import TICK_RUN_ID, TICK_STAGE, in_context
from heartbeat_runner.core.records import (
    Event,
    EventType,
    JobStatus,
    Outcome,
    RunStart,
    RunSummary,
    SensorEvaluation,
    TickStatus,
    as_utc,
    idempotency_token,
    job_parameters,
    new_data_event_id,
    random_event_id,
    skipped_token,
    utcnow,
)
from heartbeat_runner.jobs.base import (
    LIMIT_BACKOFF,
    REFUSED_PREFIX,
    SKIP_BACKOFF_KEY,
    SKIP_CODE_KEY,
    FailedJob,
    JobsBackend,
    Reconciliation,
    RunOutcome,
    RunRef,
    RunStatus,
    TriggerRequest,
)
from heartbeat_runner.jobs.calls import ApiBudget, call_all
from heartbeat_runner.lakehouse.control_table import ControlTable, Refresh
from heartbeat_runner.lakehouse.maintenance import Maintenance, MaintenanceDue, MaintenanceResult
from heartbeat_runner.lakehouse.store import (
    CONTROL,
    ControlRow,
    ReadyRow,
    RetryAsk,
    SkippedSource,
    TableStore,
    TriggerAsk,
    concurrently,
)
from heartbeat_runner.policies.event_windows import source_grains
from heartbeat_runner.policies.retry import RetryPolicies, overrun, retry_token
from heartbeat_runner.policies.trigger_shaping import (
    RELEASE_KEY,
    Candidate,
    Decisions,
    HoldKind,
    ReleaseReason,
    TriggerShaping,
    hold_decisions,
)
from heartbeat_runner.runner.empty_reads import ASKS, SEQUENCES, SKIPS, EmptyReads
from heartbeat_runner.runner.sequences import NextRun, Sequences
from heartbeat_runner.runner.wakeups import POLL, TickScope
from heartbeat_runner.sensing.parallel import SensingOutcome, sense_all
from heartbeat_runner.sensing.sources.base import SenseContext

log = logging.getLogger(__name__)

#: the key of a run summary's figures that carries the jobs backend's memory to the next process
BACKEND_MEMORY = "jobs_backend_memory"
#: the key of a run summary's figures that lists the tick's control table refreshes (Refresh.as_dict, in order)
CONTROL_REFRESHES = "control_refreshes"
#: tokens of one request's chain (see skipped_token) read in one query
SKIP_CHAIN = 8
#: how long ticks may hurry (Heartbeat.hurry) before one does everything again, in seconds: the most the sensor
#: state table lags the control table, and maintenance waits, while wake-ups keep coming
HURRY_MAX_S = 10.0
#: the events that start or end a run of a job (TickResult.run_events)
RUN_EVENT_TYPES = (EventType.TRIGGERED, EventType.COMPLETED, EventType.FAILED)
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
    failed: list[str] = field(default_factory=list)
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
    #: another tick was waiting, so this one left the sensor state table's merge to it (Heartbeat.hurry)
    sensor_state_deferred: bool = False
    #: another tick was waiting, so this one left its maintenance, due or not, to a later tick
    maintenance_deferred: bool = False
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
            "completed": self.completed, "failed": self.failed,
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


@dataclass(frozen=True)
class TrackedJobs:
    """The jobs the control table, as built for triggering, holds IN_PROGRESS or FAILED, read once per tick: the
    triggering step resumes ``resumed`` and the reconciliation step looks after the rest (the table is not
    built in between, so one read serves both)."""

    in_progress: list[ControlRow]
    failed: list[ControlRow]
    #: recorded requests that never got a run id (a crash, an unknown outcome, the API budget), in job order:
    #: resumed with the same token, so no second run
    resumed: list[TriggerRequest]

    def running(self, just_triggered: list[str]) -> list[ControlRow]:
        """The in-progress jobs with a run to look up (not the ones this tick started)."""
        return [row for row in self.in_progress if row.trigger_job_id not in just_triggered and row.job_run_id]


@dataclass(frozen=True)
class FollowUps:
    """What reconciliation found: the events to record in one commit (finished runs, recoveries, the retry
    requests and the next runs of sequences), and the runs to request once they are recorded."""

    events: list[Event]
    retries: list[TriggerRequest]
    next_runs: list[NextRun]

    @property
    def requests(self) -> list[TriggerRequest]:
        return self.retries + [step.request for step in self.next_runs]


class Heartbeat:
    """Runs ticks against one store, control table (which builds through the dbt project) and jobs backend."""

    def __init__(self, store: TableStore, control: ControlTable, backend: JobsBackend, ctx: SenseContext,
                 *, progress: Callable[[str], None] | None = None, policies: RetryPolicies | None = None,
                 maintenance: Maintenance | None = None, sequences: Sequences | None = None,
                 shaping: TriggerShaping | None = None):
        self.store = store
        self.policies = policies or RetryPolicies()
        #: the trigger holds and pools of the run-policy file (off unless it has a trigger section)
        self.shaping = shaping or TriggerShaping()
        self.sequences = sequences or Sequences(store, {})
        #: the control table: every event this tick records goes through it, and it builds (see tick())
        self.control = control
        self.backend = backend
        self.ctx = ctx
        self.settings = store.engine.settings
        self.progress = progress or (lambda message: None)
        #: called before any jobs API call; raising stops the tick there (e.g. a lost lease)
        self.before_trigger: Callable[[], None] = lambda: None
        #: whether another tick is waiting (a loop's wake-up came during this one): what no trigger depends on
        #: (the sensor state table's merge, maintenance) is then left to a later tick (see _hurried)
        self.hurry: Callable[[], bool] = lambda: False
        #: when a tick last did everything it could leave (monotonic; None: none yet in this process)
        self._caught_up_at: float | None = None
        #: the latest tick left the sensor state table's merge to this one (see tick(): step 3)
        self._state_waits = False
        self.maintenance = maintenance
        self.observer = TickObserver()
        self._idle: IdleStreak | None = None
        #: the jobs API budget of the current tick (trigger and reconcile steps share it)
        self._budget = ApiBudget(self.settings.jobs_api)
        self._windows_synced = False
        #: reads found empty that only other processes' commits can fill (the asks, sequences moved on)
        self._empty = EmptyReads()
        #: how often the running loop restarted itself past its memory ceiling (set by the loop)
        self.loop_restarts = 0
        #: source keys whose latest recorded sensing failed (None: not read yet by this process)
        self._failing: set[str] | None = None
        #: the jobs backend was handed the memory of the latest run summary (once per process)
        self._backend_recalled = False
        #: source keys the latest tick left skipped (not due, not sensed): a woken tick senses those due now
        self._skipped_last: set[str] = set()

    # -- the tick ---------------------------------------------------------------------------

    def tick(self, start: RunStart | None = None, scope: TickScope = POLL,
             result: TickResult | None = None) -> TickResult:
        """One tick, in the order that makes a crash anywhere safe (module docstring). ``start`` (default: now)
        is its run id and snapshot, fixed by a caller that records the tick's failure under that id
        (runner/loop.py). ``scope``: the due sources it senses (a wake-up names some; every other step is
        the same in every tick).

        The control table is refreshed up to three times (five in a tick that records completed runs: twice
        more in :meth:`_after_ends`, control table only, for the same reasons as 1 and 2); each is a no-op
        when the events did not move since the last build (ControlTable's built marker), and each is needed:

        1. before sensing: which rows are eligible (paused, in progress, failed) is read from it, so other
           processes' commits (a config load, ``complete``, ``reset``, another runner) and a tick that
           crashed between its append and its build must be in it; in a loop nobody else writes to, the
           previous tick's last build is current and this one costs a version read. After a tick that
           hurried, the control table only: the sensor state table it left waits for step 3;
        2. after the new-data events, control table only: the ready view must see them to trigger; it folds
           the tick's new data in when nothing else was recorded since the first;
        3. before the report: what triggering and reconciliation recorded, with the sensor state table
           (what other products follow), so ``status``, the page and the next tick read current state; it
           folds the tick's own requests and the runs that ended when that is all it recorded. When another
           tick is waiting (``hurry``), the sensor state table is left to it: no trigger reads that table,
           and its merge is the costliest step after triggering (maintenance waits too). Ticks hurry for at
           most HURRY_MAX_S in a row; then one merges whatever waits, as the next unhurried tick does.
        """
        start = start or RunStart.now()
        result = result or TickResult(run_id=start.run_id, snapshot_ts=start.snapshot_ts, scope=scope)
        with in_context(TICK_RUN_ID, start.run_id):  # every log line of the tick carries its run id
            return self._tick(result)

    def _tick(self, result: TickResult) -> TickResult:
        """The tick's steps (see :meth:`tick`), filling ``result`` as they go: a caller that passed it in reads
        what a tick that raised had done (what it sensed, triggered, recorded) for its FAILED row."""
        began = time.monotonic()
        parses_before = self.store.engine.sql_count
        timings = result.stage_timings

        self._prepare_windows()
        with _stage(timings, "models"):
            self.refresh_models(control_only=self._state_waits, into=result)  # what a hurried tick left: at step 3
        with _stage(timings, "sensing"):
            self._sense(result)
        crash_point(FaultPoint.AFTER_SENSING)
        fail_point(FaultPoint.AFTER_SENSING)
        with _stage(timings, "events_write"):
            self._append(result, self.sensed_events(result))
        crash_point(FaultPoint.AFTER_NEW_DATA_EVENTS)
        with _stage(timings, "dbt"):
            # triggering reads the control table alone; the tick's new data folds into it when that is all
            result.new_data_folded = self.refresh_models(control_only=True, into=result).folded_new_data
        self._budget = ApiBudget(self.settings.jobs_api)
        with _stage(timings, "triggering"):
            # two independent reads of the control table just built: at once
            ready, tracked = concurrently(self.store.ready_rows, self._tracked_jobs)
            self._trigger_ready(result, ready, tracked.resumed, [row.trigger_job_id for row in tracked.in_progress])
            self._trigger_windows(result)
        fail_point(FaultPoint.AFTER_TRIGGERING)
        with _stage(timings, "reconciliation"):
            follow_ups = self._reconcile(result, tracked)
            self._request_follow_ups(result, follow_ups)
        ends: Refresh | None = None
        if result.completed:
            with _stage(timings, "after_ends"):
                ends = self._after_ends(result, tracked)
        with _stage(timings, "report"):
            # what triggering and reconciliation recorded, before the report; its per-source rows meanwhile
            concurrently(lambda: self._refresh_recorded(result, ends), lambda: self._write_evaluations(result))
            result.sql_parses = self.store.engine.sql_count - parses_before
            self._write_report(result, began, time.monotonic())
        with _stage(timings, "alerts"):
            self.observer.observe(result)
        if self.maintenance is not None and not result.is_idle:
            result.maintenance_deferred = self._hurried()
            if not result.maintenance_deferred:
                self._maintain(result)
        if not (result.sensor_state_deferred or result.maintenance_deferred):
            self._caught_up_at = time.monotonic()
        result.duration_s = time.monotonic() - began
        log.info("tick %s: sensed %d source(s), %d with new data, %d error(s); triggered %d, completed %d, failed %d "
                 "(%.2f s)", result.status.value, len(result.sensed), result.sources_with_new_data,
                 len(result.sensor_errors) + len(result.trigger_errors), len(result.triggered), len(result.completed),
                 len(result.failed), result.duration_s)
        return result

    def _maintain(self, result: TickResult) -> None:
        """Maintenance when it is due, else the control table compacted alone when it needs it (every tick
        folds into it: Maintenance.due)."""
        assert self.maintenance is not None
        with _stage(result.stage_timings, "maintenance"):
            due = self.maintenance.due()
            if due is MaintenanceDue.RUN:
                self.progress("maintenance: archiving and compacting Heartbeat's tables")
                # a wake-up that comes meanwhile stops it between two steps: the rest waits for a later tick
                result.maintenance = self.run_maintenance(interrupt=self._hurried)
                result.maintenance_deferred = result.maintenance.interrupted
            elif due is MaintenanceDue.CONTROL:
                result.maintenance = MaintenanceResult(compacted={CONTROL: self.maintenance.compact_control()})

    def run_maintenance(self, interrupt: Callable[[], bool] = lambda: False) -> MaintenanceResult:
        """Archive and compact (stopping between two steps when ``interrupt`` says so); the control table does
        not change, so it stays current."""
        assert self.maintenance is not None
        return self.control.run_maintenance(self.maintenance, interrupt=interrupt)

    def close(self) -> None:
        """Write the summary of a pending idle streak (call when the runner stops)."""
        fail_point(FaultPoint.CLOSING)
        self.observer.close()
        if self._idle is not None:
            self.store.append_run(self._idle.summary(self._summary_figures()), [])
            self._idle = None

    def _recoveries(self, sensed: list[SensingOutcome]) -> list[str]:
        """Sources whose latest recorded sensing failed and that sensed now. Such a tick is recorded, not
        coalesced as idle, so the failure shown by `status`, `explain` and the page clears at once rather
        than when an idle streak is flushed. The failing set is read once per process, then kept up to date
        from each tick's outcomes (a source not sensed this tick keeps its state)."""
        if self._failing is None:
            self._failing = {r["source_key"] for r in self.store.sensing_failures()}
        keys = {s.target.source_key for s in sensed}
        failing_now = {s.target.source_key for s in sensed if s.outcome is Outcome.ERROR}
        recovered = sorted((keys - failing_now) & self._failing)
        self._failing = (self._failing - keys) | failing_now
        return recovered

    def _summary_figures(self) -> dict[str, Any]:
        """The process figures, and the jobs backend's memory for the next process (see JobsBackend.memory)."""
        memory = self.backend.memory()
        return {**self._process_figures(), **({BACKEND_MEMORY: memory} if memory is not None else {})}

    def _recall_backend(self) -> None:
        """Once per process, when there are failed jobs to look after: hand the backend the memory the latest
        run summary carries (a process per tick would otherwise start every look afresh)."""
        if self._backend_recalled:
            return
        self._backend_recalled = True
        memory = self.store.latest_run_figures().get(BACKEND_MEMORY)
        if isinstance(memory, dict):
            self.backend.remember(memory)

    def _process_figures(self) -> dict[str, int]:
        """What the run report tells about the process: engine recycles, starts after parking and loop
        restarts, when any."""
        engine = self.store.engine
        figures = {"engine_recycles": engine.recycles, "engine_wakes": engine.wakes, "loop_restarts": self.loop_restarts}
        return {name: value for name, value in figures.items() if value}

    def refresh_models(self, force: bool = False, *, control_only: bool = False,
                       into: TickResult | None = None) -> Refresh:
        """Bring the control table (and, unless ``control_only``, the sensor state table) up to date; see
        :meth:`ControlTable.refresh`. The events table's version is read every tick (a file listing on local
        engines); a tick whose events table is gone fails here, even when idle ticks read nothing else, so
        the loop sees its lakehouse is unusable. ``into``: the tick whose refreshes this one joins."""
        refreshed = self.control.refresh(force=force, control_only=control_only)
        self._empty.seen(refreshed.version)
        if into is not None:
            into.refreshes.append(refreshed)
        return refreshed

    def _refresh_recorded(self, result: TickResult, ends: Refresh | None = None) -> None:
        """Step 3 of :meth:`tick`: the control table, and the sensor state table unless the tick hurries. ``ends``:
        the refresh after reconciliation (:meth:`_after_ends`); when nothing was recorded since, its folds are
        the tick's last."""
        result.sensor_state_deferred = self._state_waits = self._hurried()
        refreshed = self.refresh_models(control_only=result.sensor_state_deferred, into=result)
        unchanged = ends is not None and ends.version == refreshed.version
        result.control_folded = refreshed.folded or (unchanged and ends is not None and ends.folded)

    def _hurried(self) -> bool:
        """Whether this tick leaves what no trigger depends on to a later one: another tick is waiting, and a
        tick did everything less than HURRY_MAX_S ago (so a storm of wake-ups delays it by that at most)."""
        caught_up = self._caught_up_at
        return caught_up is not None and time.monotonic() - caught_up < HURRY_MAX_S and self.hurry()

    # -- step 1: sensing --------------------------------------------------------------------

    def _sense(self, result: TickResult) -> None:
        """Sense every due source in the tick's scope; note the skipped ones and the sources that recovered.

        A woken tick also senses the sources the latest tick left skipped that are due now: a run's end that
        another process recorded (a job's own ``complete``, folded by the refresh before sensing), a resume or a
        reset made them eligible, and data may have landed while they were skipped (the ends this tick records
        itself are :meth:`_after_ends`'s)."""
        due = self.store.sensors_due()
        if result.scope.source_keys is not None:
            named = result.scope.source_keys | self._skipped_last
            due = [d for d in due if d[0].source_key in named]
        result.skipped = self.store.sensors_skipped()
        self._skipped_last = {s.source_key for s in result.skipped}
        self.progress(f"sensing {len(due)} source(s)")
        # a wake-up's sources are likely changed: a bulk look would only delay sensing them
        result.sensed = sense_all(due, self.ctx, max_workers=self.settings.max_workers,
                                  timeout_s=self.settings.sensor_timeout_s, look_first=result.scope.polls)
        result.recovered = self._recoveries(result.sensed)

    # -- step 2: events from sensing --------------------------------------------------------

    def sensed_events(self, result: TickResult) -> list[Event]:
        """The NEW_DATA / CURSOR events of what ``result`` sensed, against the cursors as they are now."""
        events = []
        new_data = any(s.result is not None and s.result.new_data for s in result.sensed)
        # Read again now: a source whose cursor moved while it was sensed was recorded by someone else.
        current = self.store.current_cursors() if new_data else None
        for sensed in result.sensed:
            outcome, target = sensed.result, sensed.target
            if outcome is None or (not outcome.new_data and outcome.cursor_to in (None, target.cursor)):
                continue
            key = target.source_key
            if current is not None and (key not in current or current[key][0] != target.cursor):
                log.warning("%s moved on while it was sensed (another runner?); not recorded", key, extra={"source": key})
                continue
            parent = current[key][1] if current is not None else None
            cursor_to = outcome.cursor_to if outcome.cursor_to is not None else target.cursor
            kind = EventType.NEW_DATA if outcome.new_data else EventType.CURSOR
            event_id = (new_data_event_id(key, parent, target.cursor, cursor_to) if kind is EventType.NEW_DATA
                        else random_event_id())
            events.append(Event(
                event_type=kind, run_id=result.run_id, snapshot_ts=result.snapshot_ts, event_id=event_id,
                source_key=target.source_key, sensor_source=target.sensor_source, sensor_id=target.sensor_id,
                cursor_from=target.cursor, cursor_to=cursor_to,
                window_from=outcome.window_from, window_to=outcome.window_to, rows=outcome.rows,
                message=outcome.detail,
                payload=outcome.payload(),
            ))
        return events

    # -- step 4: trigger --------------------------------------------------------------------

    def _trigger_ready(self, result: TickResult, ready: list[ReadyRow], carried: list[TriggerRequest],
                       running: list[str] | None = None, *, asks: bool = True) -> None:
        """Step 4: resume ``carried`` (requests earlier ticks recorded without a run id), first and in order,
        and request the runs of the ready jobs and of operators' asks (unless ``asks`` is False), all in one
        round of API calls. With trigger shaping, only the wanted runs every hold allows (``_shaped``;
        ``running``: the jobs in progress)."""
        by_job: dict[str, list[ReadyRow]] = defaultdict(list)
        for row in ready:
            by_job[row.trigger_job_id].append(row)
        if carried:
            self.progress(f"resuming {len(carried)} trigger request(s) left by an earlier tick")
        wanted = [Wanted(job_id, rows[0].trigger_job_name, rows, _consumed(rows[0].consumed_event_ids))
                  for job_id, rows in by_job.items()]
        if asks:
            wanted += self._manual_runs(set(by_job) | {request.job_id for request in carried})
        wanted = self._shaped(wanted, running or [], result)
        wanted = self._past_skips(wanted, result)
        if not wanted:
            if carried:
                self._request_runs(result, [], carried)
            return
        planned: list[tuple[Wanted, TriggerRequest, dict[str, Any]]] = []
        events = self.store.new_data_events(sorted({i for want in wanted for i in want.consumed}))
        for want in wanted:
            try:
                planned.append((want, *self._request_for(want, result.run_id, events)))
            except SourceError as exc:  # a catch-up policy the source cannot apply: this job waits
                result.trigger_errors.append(JobProblem(want.job_id, f"catch-up plan: {exc}"))
        result.manual.update({want.job_id: note for want, _, _ in planned if (note := want.message)})
        self._request_runs(result, [self._requested_event(result, req, payload, ",".join(want.consumed) or None,
                                                          want.message)
                                    for want, req, payload in planned], carried + [req for _, req, _ in planned])

    def _holds(self, candidates: list[Candidate], running: list[str], result: TickResult) -> Decisions:
        """The trigger holds' decisions on ``candidates`` now (policies/trigger_shaping.py), the held ones noted
        in ``result.held``. The facts they read come from heartbeat_job_trigger_facts, one query."""
        facts = self.store.trigger_facts([c.job_id for c in candidates])
        candidates = [c.with_facts(facts.get(c.job_id, {})) for c in candidates]
        decisions = hold_decisions(self.shaping, candidates, running, utcnow())
        for job_id, hold in decisions.held.items():
            log.info("job %s %s", job_id, hold.describe(), extra={"job": job_id})
            result.held.append(JobProblem(job_id, hold.describe()))
            result.held_by[job_id] = hold.kind
            if hold.until is not None and (result.release_at is None or hold.until < result.release_at):
                result.release_at = hold.until
        return decisions

    def _shaped(self, wanted: list[Wanted], running: list[str], result: TickResult) -> list[Wanted]:
        """The wanted runs that every trigger hold allows now, each with its release reasons (recorded with its
        request); the others wait in their rows, untouched, for a later tick. Unchanged without trigger shaping.

        This is the hold rule's one Python step (the reasons it is not a SQL view are in
        policies/trigger_shaping.py's docstring): applied to the rows of jobs_ready_to_trigger and to operators'
        asks, after the dependency rule and before any request is recorded."""
        shaped = [want for want in wanted if self.shaping.for_job(want.job_id) is not None]
        if not shaped:
            return wanted
        # an operator's ask for a job that is ready anyway is that job's run (it consumes the same rows): it
        # skips the time holds as any operator's run does
        asks = {} if self._empty.still_empty(ASKS) else self.store.trigger_asks()
        wanted = [replace(want, ask=asks[want.job_id]) if want.ask is None and want.job_id in asks
                  and self.shaping.for_job(want.job_id) is not None else want for want in wanted]
        shaped = [want for want in wanted if self.shaping.for_job(want.job_id) is not None]
        decisions = self._holds([Candidate(want.job_id, operator=want.ask is not None) for want in shaped],
                                running, result)
        return [replace(want, released=decisions.released.get(want.job_id, ())) for want in wanted
                if want.job_id not in decisions.held]

    def _past_skips(self, wanted: list[Wanted], result: TickResult | None = None) -> list[Wanted]:
        """Each wanted run with the first token of its chain (``skipped_token``) whose run was not skipped: the
        same data asked again after a skipped run gets a new token (the old one would hand back the skipped
        run), derived from recorded events only, so a crash replays it.

        A run a workspace limit skipped (its RUN_SKIPPED event says ``backoff``) holds its data back until
        ``LIMIT_BACKOFF.after(n)`` has passed since that skip, n the skipped runs of the same data so far: such
        a want is left out of this tick and noted in ``result.runs_deferred`` (and the metrics)."""
        attempts = self._skip_attempts([want.first_token for want in wanted])
        wanted = [replace(want, attempt=attempts.get(want.first_token, 0)) for want in wanted]
        skipped = {skipped_token(want.first_token, want.attempt - 1): want for want in wanted if want.attempt}
        if not skipped:
            return wanted
        now, held = utcnow(), set()
        for token, (skipped_at, payload) in self.store.skip_events(sorted(skipped)).items():
            want = skipped[token]
            if not payload.get(SKIP_BACKOFF_KEY):
                continue
            due = as_utc(skipped_at) + timedelta(seconds=LIMIT_BACKOFF.after(want.attempt))
            if now < due:
                held.add(want.first_token)
                code = str(payload.get(SKIP_CODE_KEY) or "SKIPPED")
                if result is not None:
                    result.runs_deferred.append(JobProblem(want.job_id, (
                        f"its last run was skipped for a workspace limit ({code}, {want.attempt} skipped run(s) of "
                        f"this data); asked again after {due.isoformat(timespec='seconds')}")))
                    result.not_executed[(code, "deferred")] += 1
        return [want for want in wanted if want.first_token not in held]

    def _skip_attempts(self, tokens: list[str]) -> dict[str, int]:
        """For each first token, the first attempt of its chain whose run was not skipped (0: the token itself).
        The chains are read ``SKIP_CHAIN`` tokens at a time, and only while the events hold a skipped run at all
        (that is read again only when a process committed since the last read that found none: EmptyReads)."""
        if not tokens or self._empty.still_empty(SKIPS):
            return {}
        any_skipped = self.store.any_skipped()
        self._empty.found(SKIPS, empty=not any_skipped)
        if not any_skipped:
            return {}
        attempts: dict[str, int] = {}
        left, start = sorted(set(tokens)), 0
        while left:
            chains = {t: [skipped_token(t, n) for n in range(start, start + SKIP_CHAIN)] for t in left}
            skipped = self.store.skipped_tokens(sorted({t for chain in chains.values() for t in chain}))
            for token, chain in chains.items():
                free = next((n for n, t in enumerate(chain) if t not in skipped), None)
                if free is not None:
                    attempts[token] = start + free
            left, start = [t for t in left if t not in attempts], start + SKIP_CHAIN
        return attempts

    def _manual_runs(self, exclude: set[str]) -> list[Wanted]:
        """The runs operators asked for (``trigger``) that no other request of this tick covers. The asks are
        read again only when another process committed since the last read that found none (see EmptyReads:
        idle ticks and the runner's own commits leave them unread); an ask is an event, so a new one is
        always such a commit."""
        if self._empty.still_empty(ASKS):
            return []
        found = self.store.trigger_asks()
        self._empty.found(ASKS, empty=not found)
        asks = {job: ask for job, ask in found.items() if job not in exclude}
        if not asks:
            return []
        return [Wanted(run.trigger_job_id, run.trigger_job_name, run.rows, run.consumed_event_ids,
                       ask=asks[run.trigger_job_id])
                for run in self.store.manual_runs(sorted(asks))]

    def _tracked_jobs(self) -> TrackedJobs:
        """The jobs in progress and the failed ones, and the recorded requests among them that never got a run
        id (their parameters in one query)."""
        jobs = self.store.jobs_by_status(JobStatus.IN_PROGRESS, JobStatus.FAILED)
        in_progress = jobs[JobStatus.IN_PROGRESS]
        unanswered = [(row, token) for row in in_progress
                      if row.job_run_id is None and (token := row.last_idempotency_token)]
        payloads = self.store.trigger_payloads([token for _, token in unanswered])
        resumed = [TriggerRequest(row.trigger_job_id, row.trigger_job_name, token, payloads.get(token, {}))
                   for row, token in unanswered]
        return TrackedJobs(in_progress, jobs[JobStatus.FAILED], resumed)

    def _requested_event(self, result: TickResult, request: TriggerRequest, payload: dict[str, Any],
                         consumed_event_ids: str | None = None, message: str | None = None) -> Event:
        """The TRIGGER_REQUESTED event of ``request``, with the payload recorded for it."""
        return Event(event_type=EventType.TRIGGER_REQUESTED, run_id=result.run_id, snapshot_ts=result.snapshot_ts,
                     trigger_job_id=request.job_id, idempotency_token=request.idempotency_token,
                     consumed_event_ids=consumed_event_ids, payload=json.dumps(payload, sort_keys=True),
                     message=message)

    def _request_runs(self, result: TickResult, events: list[Event], requests: list[TriggerRequest]) -> None:
        """Record ``events`` (the new requests among them) in one commit, then call the jobs API for ``requests``
        (earlier requests carried over first)."""
        if not events and not requests:
            return
        self.before_trigger()
        self._append(result, events)
        crash_point(FaultPoint.AFTER_TRIGGER_REQUESTED)
        if requests:
            self.progress(f"triggering {len(requests)} job(s)")
            self._call_backend(requests, result)

    def _prepare_windows(self) -> None:
        """Copy the window policies to their table (once per runner) and tell sensing which sources'
        event times to record, in buckets of the smallest window size reading each."""
        windows = self.sequences.windows
        if not self._windows_synced:
            self.store.sync_window_policies({job: (p.size_s, p.lateness_s, p.late_data.value)
                                             for job, p in windows.items()})
            # the trigger policies too (a job with a quiet period keeps sensing while its data waits); the jobs of
            # the config at the runner's start (a job added to a running loop gets its default at the next start)
            jobs = {r["trigger_job_id"] for r in self.store.control_rows()} if self.shaping.enabled else set()
            self.store.sync_trigger_policies(self.shaping.table_rows(jobs))
            self._windows_synced = True
        if windows:
            pairs = [(r["trigger_job_id"], r["source_key"]) for r in self.store.control_rows()]
            self.ctx.event_time_grains = source_grains(windows, pairs)

    def _trigger_windows(self, result: TickResult) -> None:
        """Step 4 for jobs with an event-time window policy: each final window runs once, in order
        (a sequence), empty ones are skipped and recorded; late rows may earn a window one correction run."""
        if not self.sequences.windows:
            return
        plans = self.sequences.window_plans(result.run_id, result.snapshot_ts)
        planned = {p.job_id for p in plans}
        for job_id in self.store.windowed_jobs_free():
            correction = None if job_id in planned else self.sequences.correction(job_id, result.run_id)
            if correction is not None:
                plans.append(correction)
        requested = [(p.request, p.payload) for p in plans if p.request is not None]
        events = [e for p in plans for e in p.skipped] + [
            self._requested_event(result, request, payload) for request, payload in requested]
        if events:
            self._request_runs(result, events, [request for request, _ in requested])

    def _request_for(self, want: Wanted, run_id: str, events: list[dict]) -> tuple[TriggerRequest, dict[str, Any]]:
        """The request of a wanted run and the payload recorded with it (its parameters, and the plan of a
        catch-up sequence when its policy cuts the backlog into several runs)."""
        token = want.token
        payload = self.sequences.first_request(want.job_id, want.rows, token, {"heartbeat_run_id": run_id}, events)
        if want.released:
            payload[RELEASE_KEY] = [reason.value for reason in want.released]
        return TriggerRequest(job_id=want.job_id, job_name=want.job_name, idempotency_token=token,
                              parameters=job_parameters(payload)), payload

    def _call_backend(self, requests: list[TriggerRequest], result: TickResult) -> None:
        """Call the jobs API for the (recorded) requests on the pool, within the tick's budget, and record
        every answer in one commit. A request that did not start, or whose outcome is unknown, stays
        recorded without a run id: the next tick resumes it with the same token (no second run)."""
        calls = call_all(requests, self.backend.trigger, self._budget, on_answer=_trigger_crash_points(len(requests)))
        answers: list[Event] = []
        for answer in calls.answers:
            request, exc = answer.item, answer.error
            if exc is not None:
                result.trigger_errors.append(JobProblem(request.job_id, str(exc)))
                if exc.retryable:
                    log.warning("trigger of %s will be retried: %s", request.job_id, exc, extra={"job": request.job_id})
                    continue
                answers.append(self._event(result, EventType.TRIGGER_ERROR, request.job_id,
                                           idempotency_token=request.idempotency_token, message=str(exc)))
                continue
            run_id = str(answer.value)
            log.info("triggered %s (run %s)", request.job_id, run_id, extra={"job": request.job_id})
            result.triggered.append(TriggeredJob(request.job_id, run_id))
            answers.append(self._event(result, EventType.TRIGGERED, request.job_id, job_run_id=run_id,
                                       idempotency_token=request.idempotency_token))
        if calls.not_started:
            result.carried += [request.job_id for request in calls.not_started]
            log.warning("%d trigger request(s) did not fit the tick's jobs API budget; next tick resumes them",
                        len(calls.not_started))
        self._append(result, answers)
        crash_point(FaultPoint.AFTER_TRIGGERED)

    # -- step 5: reconcile ------------------------------------------------------------------

    def _reconcile(self, result: TickResult, jobs: TrackedJobs) -> FollowUps:
        """Step 5: ask the jobs backend about the running jobs and the failed ones; the events of what it found,
        and the retries and next runs of sequences due now (requested by :meth:`_request_follow_ups`)."""
        tracked = jobs.running(result.triggered_job_ids)
        failed = jobs.failed
        if failed:
            self._recall_backend()
        found = self._reconciliation(tracked, failed, result)
        events: list[Event] = []
        next_runs = self._sequences_due(result)
        for row in tracked:
            status = found.statuses.get(row.job_run_id or "")
            finished = self._finished_run_events(row, status, result) if status is not None else []
            events.extend(finished)
            next_runs.extend(self._next_run(row, finished, result))
        retries: list[TriggerRequest] = []
        asks = self.store.retry_asks() if failed else {}
        due: list[tuple[ControlRow, RetryAsk | None, TriggerRequest]] = []
        for row in failed:
            recovered = self._recovery_events(row, found.recovered.get(row.trigger_job_id), result)
            ask = asks.get(row.trigger_job_id)
            retry = None if recovered or row.trigger_job_id in found.deferred else self._retry_request(row, ask)
            if retry is not None:
                (retry,) = self._past_skipped_retries([retry])
                due.append((row, ask, retry))
            events.extend(recovered)
            next_runs.extend(self._next_run(row, recovered, result))
        for row, ask, retry in self._shaped_retries(due, jobs, result):
            if retry is not None:
                retries.append(retry)
                result.retried.append(row.trigger_job_id)
                events.append(self._event(result, EventType.RETRY_REQUESTED, row.trigger_job_id,
                                          idempotency_token=retry.idempotency_token,
                                          payload=json.dumps(retry.parameters, sort_keys=True),
                                          message=_retry_message(row, ask)))
        # the next run of a sequence goes into the same commit as the success before it
        events.extend(step.event for step in next_runs)
        return FollowUps(events, retries, next_runs)

    def _shaped_retries(self, due: list[tuple[ControlRow, RetryAsk | None, TriggerRequest]], jobs: TrackedJobs,
                        result: TickResult) -> list[tuple[ControlRow, RetryAsk | None, TriggerRequest]]:
        """The retries due now that the trigger holds allow: an operator's ``retry`` counts against the pool
        only, an automatic one keeps the minimum interval too; a held retry is decided again next tick."""
        shaped = [item for item in due if self.shaping.for_job(item[0].trigger_job_id) is not None]
        if not shaped:
            return due
        ended = set(result.completed) | set(result.failed)  # runs that ended this tick free their places
        running = sorted({row.trigger_job_id for row in jobs.in_progress} - ended | set(result.triggered_job_ids))
        decisions = self._holds([Candidate(row.trigger_job_id, operator=ask is not None, follow_up=ask is None)
                                 for row, ask, _ in shaped], running, result)
        return [item for item in due if item[0].trigger_job_id not in decisions.held]

    def _request_follow_ups(self, result: TickResult, follow_ups: FollowUps) -> None:
        """Record what reconciliation found in one commit, then call the jobs API for the retries and next runs
        recorded in it (the same tokens on a replay after a crash in between)."""
        self._append(result, follow_ups.events)
        if follow_ups.next_runs:
            crash_point(FaultPoint.AFTER_NEXT_WINDOW_REQUESTED)
        if follow_ups.retries:
            crash_point(FaultPoint.AFTER_RETRY_REQUESTED)
        if follow_ups.requests:
            self.before_trigger()
            self._call_backend(follow_ups.requests, result)

    def _sequences_due(self, result: TickResult) -> list[NextRun]:
        """Next runs of sequences whose run succeeded without the runner recording it (a job's own `complete`):
        read again only when another process committed since the last read that found none."""
        if self._empty.still_empty(SEQUENCES):
            return []
        due = self.sequences.due(result.run_id, result.snapshot_ts)
        self._empty.found(SEQUENCES, empty=not due)
        return due

    def _reconciliation(self, tracked: list[ControlRow], failed: list[ControlRow], result: TickResult) -> Reconciliation:
        """Ask the backend, in one call, about the tracked runs and the failed jobs; note what it could not do."""
        found = self.backend.reconcile(
            [RunRef(row.trigger_job_id, row.job_run_id) for row in tracked if row.job_run_id],
            [FailedJob(row.trigger_job_id, since, row.job_run_id) for row in failed
             if (since := row.job_end_timestamp or row.status_change_timestamp) is not None],
            self._budget)
        result.trigger_errors += [JobProblem(p.job_id, p.message) for p in found.problems]
        result.carried += found.deferred
        result.api_notes += found.notes
        return found

    def _next_run(self, row: ControlRow, finished: list[Event], result: TickResult) -> list[NextRun]:
        """The next run of the job's catch-up sequence if ``finished`` records its current run's success."""
        if not any(e.event_type is EventType.COMPLETED for e in finished):
            return []
        step = self.sequences.after_success(row.trigger_job_id, row.trigger_job_name, row.base_idempotency_token,
                                            result.run_id, result.snapshot_ts)
        return [step] if step is not None else []

    def _request(self, row: ControlRow, token: str) -> TriggerRequest:
        """Rebuild the recorded request of ``row`` with idempotency token ``token``."""
        return TriggerRequest(row.trigger_job_id, row.trigger_job_name, token, self.store.trigger_payload(token))

    def _retry_request(self, row: ControlRow, ask: RetryAsk | None) -> TriggerRequest | None:
        """The retry of a failed job due now (same data, new token): asked for by an operator, or due by
        the job's policy. Both derive the token from the failures so far, so a crash between recording
        the retry and calling the API replays the same token, and one failure gets at most one retry."""
        if row.base_idempotency_token is None or row.job_end_timestamp is None:
            return None
        if ask is None:
            policy = self.policies.for_job(row.trigger_job_id)
            if not policy.enabled or not policy.decide(row.consecutive_failures, row.job_end_timestamp,
                                                       utcnow()).retry_now:
                return None
        base = self._request(row, row.base_idempotency_token)
        return replace(base, idempotency_token=retry_token(base.idempotency_token, row.consecutive_failures))

    def _past_skipped_retries(self, retries: list[TriggerRequest]) -> list[TriggerRequest]:
        """A retry whose run was skipped is asked again with the next token of its chain, as a first request is
        (the same token would hand back the skipped run)."""
        attempts = self._skip_attempts([retry.idempotency_token for retry in retries])
        return [replace(retry, idempotency_token=skipped_token(retry.idempotency_token,
                                                               attempts.get(retry.idempotency_token, 0)))
                for retry in retries]

    def _report_overrun(self, row: ControlRow, run_id: str, status: RunStatus, result: TickResult) -> None:
        """Report (and optionally cancel) run ``run_id`` of ``row`` going on for longer than the configured maximum."""
        limit = self.settings.max_run_duration_s
        over = overrun(status, timedelta(seconds=limit) if limit else None, utcnow())
        if over is None:
            return
        message = f"run {run_id} is {over} past its maximum duration of {limit:g}s"
        if self.settings.cancel_overdue_runs and self.backend.can_cancel:
            try:
                self.backend.cancel_run(row.trigger_job_id, run_id)
                message += "; cancelled"
            except JobsBackendError as exc:
                message += f"; cancelling failed: {exc}"
        log.warning("job %s: %s", row.trigger_job_id, message)
        result.overdue.append(JobProblem(row.trigger_job_id, message))

    def _finished_run_events(self, row: ControlRow, status: RunStatus, result: TickResult) -> list[Event]:
        """Events for the row's run (``status``) if it has finished; report it if overdue."""
        run_id = status.run_id
        if not status.outcome.finished:
            self._report_overrun(row, run_id, status, result)
            return []
        if status.outcome is RunOutcome.SKIPPED:
            # the run never executed: its request is void (heartbeat_in_lifecycle), the data it consumed is
            # pending again, and a later tick asks with a new token (_past_skips), after a back-off when a
            # workspace limit stopped it
            code = status.code or "SKIPPED"
            later = "after a back-off (workspace limit)" if status.backoff else "at a later tick"
            note = f"run {run_id} was skipped ({status.message}); its data is asked for again {later}"
            result.runs_skipped.append(JobProblem(row.trigger_job_id, note))
            result.not_executed[(code, "limited" if status.backoff else "skipped")] += 1
            payload = {**status.timing(), SKIP_CODE_KEY: code, SKIP_BACKOFF_KEY: status.backoff}
            return [self._event(result, EventType.RUN_SKIPPED, row.trigger_job_id, job_run_id=run_id,
                                idempotency_token=row.last_idempotency_token, message=status.message,
                                payload=json.dumps(payload))]
        if status.outcome is RunOutcome.REFUSED:
            # a terminal non-run: the job is blocked as by a failure (JOB_FAILED alert, FAILED status) and never
            # asked again by itself; its own words say it never ran and what to do
            code = status.code or "REFUSED"
            refusal = (f"{REFUSED_PREFIX} ({status.message}); the job waits until the cause is fixed in the "
                       "workspace, then `retry`")
            log.warning("job %s: run %s %s", row.trigger_job_id, run_id, refusal)
            result.failed.append(row.trigger_job_id)
            result.not_executed[(code, "refused")] += 1
            if status.end_time is not None:
                result.ended_at[row.trigger_job_id] = status.end_time
            return [self._event(result, EventType.FAILED, row.trigger_job_id, job_run_id=run_id, message=refusal,
                                payload=json.dumps({**status.timing(), "refused": code}))]
        success = status.outcome is RunOutcome.SUCCESS
        message: str | None = status.message
        if success and status.partial:
            policy = self.policies.for_job(row.trigger_job_id)
            if not policy.partial_success_counts(status.failed_tasks):
                success = False
                message = (f"{status.message}; counted as failed by the job's policy "
                           f"(success_with_failures: {policy.success_with_failures})")
        (result.completed if success else result.failed).append(row.trigger_job_id)
        if status.end_time is not None:
            result.ended_at[row.trigger_job_id] = status.end_time
        return [self._event(result, EventType.COMPLETED if success else EventType.FAILED, row.trigger_job_id,
                            job_run_id=run_id, message=message, payload=_timing_payload(status))]

    def _recovery_events(self, row: ControlRow, run: RunStatus | None, result: TickResult) -> list[Event]:
        """A COMPLETED event when ``run``, a successful run after the row's failure, was found."""
        if run is None:
            return []
        result.completed.append(row.trigger_job_id)
        if run.end_time is not None:
            result.ended_at[row.trigger_job_id] = run.end_time
        return [self._event(result, EventType.COMPLETED, row.trigger_job_id, job_run_id=run.run_id,
                            message=f"successful run {run.run_id} found; job unblocked", payload=_timing_payload(run))]

    # -- step 5b: what waited for the runs that ended ------------------------------------------

    def _after_ends(self, result: TickResult, tracked: TrackedJobs) -> Refresh:
        """Sense the sources of the jobs whose runs this tick recorded as completed, and trigger those jobs again
        when that found new data: data that landed while a job ran starts its next run in the tick that records
        the end, not at the next poll (a woken tick senses only the sources its wake-up named, and a poll sensed
        before reconciliation, while the job was in progress and its sources were skipped).

        Invariant: this is steps 1-4 again, for those sources and jobs only, through the same calls and so the
        same commit grouping and exactly-once rules: the ends are folded into the control table first (so the
        sensor plan sees the jobs eligible), every NEW_DATA / CURSOR event of the pass goes in one commit against
        the cursors read again, the control table is rebuilt before the ready view is read, and the requests
        are recorded in one commit before any jobs API call, with tokens derived from the consumed events (a
        crash anywhere here leaves what the next tick resumes or senses again, as after steps 2 and 4). Only the
        ready rows of the jobs whose runs completed and of the jobs reading the sources that had new data are
        requested (everything else the ready view holds was the first pass's to decide; a job whose request
        this tick refused or held back waits for the next), with no manual asks, windows or resumed requests.
        Sources this tick already sensed are not sensed again."""
        ended = set(result.completed)
        refreshed = self.refresh_models(control_only=True, into=result)  # folds the ends: the sources become due
        sensed = {s.target.source_key for s in result.sensed}
        due = [(target, jobs) for target, jobs in self.store.sensors_due()
               if target.source_key not in sensed and ended & set(jobs.split(","))]
        if not due:
            return refreshed
        self.progress(f"sensing {len(due)} source(s) of {len(ended)} job(s) whose runs ended")
        outcomes = sense_all(due, self.ctx, max_workers=self.settings.max_workers,
                             timeout_s=self.settings.sensor_timeout_s, look_first=False)
        pass_result = replace(result, sensed=outcomes)  # sensed_events reads only the run id, snapshot and sensed
        result.sensed += outcomes
        result.recovered += self._recoveries(outcomes)
        self._skipped_last -= {s.target.source_key for s in outcomes}
        self._append(result, self.sensed_events(pass_result))
        fresh = [s for s in outcomes if s.outcome is Outcome.NEW_DATA]
        if not fresh:
            return refreshed
        # the jobs this pass may have made ready; not those the first pass asked for, refused or held back
        jobs = (ended | {job for s in fresh for job in s.trigger_job_ids.split(",") if job}) - {
            p.job_id for p in result.trigger_errors + result.runs_deferred}
        refreshed = self.refresh_models(control_only=True, into=result)
        ready = [row for row in self.store.ready_rows() if row.trigger_job_id in jobs]
        if ready:
            # a pool counts what runs now: the tick's in-progress jobs less those that ended, plus its new starts
            running = sorted({row.trigger_job_id for row in tracked.in_progress} - ended - set(result.failed)
                             | set(result.triggered_job_ids))
            self._trigger_ready(result, ready, [], running, asks=False)
        return refreshed

    # -- step 6: report ---------------------------------------------------------------------

    def _write_evaluations(self, result: TickResult) -> None:
        """The per-source rows of a tick that is not idle (written before its summary: a summary means
        they are complete). They go to their own table, so they are appended while the models build."""
        if result.is_idle:
            return
        evaluations = [
            SensorEvaluation(
                run_id=result.run_id, snapshot_ts=result.snapshot_ts, source_key=s.target.source_key,
                sensor_source=s.target.sensor_source, sensor_id=s.target.sensor_id,
                trigger_job_ids=s.trigger_job_ids,
                window_from=s.result.window_from if s.result else None,
                window_until=s.result.window_to if s.result else None,
                outcome=s.outcome.value, rows=s.result.rows if s.result else None,
                error=s.note, duration_s=round(s.duration_s, 4),
            )
            for s in result.sensed
        ] + [
            SensorEvaluation(
                run_id=result.run_id, snapshot_ts=result.snapshot_ts, source_key=s.source_key,
                sensor_source=s.sensor_source, sensor_id=s.sensor_id, trigger_job_ids=s.trigger_job_ids,
                window_from=None, window_until=None, outcome=Outcome.SKIPPED.value, rows=None,
                error=s.reason, duration_s=0.0,
            )
            for s in result.skipped
        ]
        self.store.append_runs([], evaluations)

    def _write_report(self, result: TickResult, began: float, report_began: float) -> None:
        """The run summary of a tick (its per-source rows are written: ``_write_evaluations``); idle ticks
        are coalesced into one summary row, written when the streak ends or is old enough
        (``_idle_row_due``: bounded commits while nothing happens).

        The recorded duration counts every stage from ``began``; only the summary row's append is after
        it (it holds the figure)."""
        result.duration_s = time.monotonic() - began
        if result.is_idle:
            if self._idle is None:
                self._idle = IdleStreak(result.run_id, result.snapshot_ts)
            self._idle.add(result)
            if not self._idle_row_due():
                return
            streak, self._idle = self._idle, None
            self.store.append_run(streak.summary(self._summary_figures()), [])
            return
        pending = [self._idle.summary(self._summary_figures())] if self._idle is not None else []
        self._idle = None
        stages = {**result.stage_timings, "report": time.monotonic() - report_began}
        summaries = pending + [RunSummary(
            run_id=result.run_id, snapshot_ts=result.snapshot_ts, ended_ts=utcnow(),
            duration_s=round(result.duration_s, 4), sources_sensed=len(result.sensed),
            sources_with_new_data=result.sources_with_new_data,
            sensor_errors=len(result.sensor_errors), jobs_triggered=len(result.triggered),
            jobs_completed=len(result.completed), jobs_failed=len(result.failed),
            trigger_errors=len(result.trigger_errors),
            status=result.status,
            message="; ".join([*map(str, result.trigger_errors + result.overdue + result.runs_skipped),
                               *result.api_notes,
                               *([f"carried to the next tick (jobs API budget): {', '.join(result.carried)}"]
                                 if result.carried else [])]) or None,
            stage_timings=json.dumps({**{k: round(v, 4) for k, v in stages.items()},
                                      "sql_parses": result.sql_parses, CONTROL_REFRESHES: result.refresh_paths(),
                                      **self._summary_figures()}),
        )]
        self.store.append_runs(summaries, [])

    def _idle_row_due(self) -> bool:
        """Whether the idle streak is old enough for its row: ``idle_flush_s``, or while the engine is parked
        ``memory.idle_flush_parked_s`` if longer (the append would start the engine for that row alone; what
        pages show stays current through the liveness file, and the row is written with the next tick that
        does something, whichever comes first)."""
        wait = self.settings.idle_flush_s
        if self.store.engine.parked:
            wait = max(wait, self.settings.memory.idle_flush_parked_s)
        return self._idle is not None and time.monotonic() - self._idle.began >= wait

    def _append(self, result: TickResult, events: list[Event]) -> None:
        """One commit of ``events`` through the control table; the empty reads carried over it when this process
        made the only commit."""
        self.control.append(events)
        result.events_written += len(events)
        result.run_events += [e for e in events if e.event_type in RUN_EVENT_TYPES]
        if events:
            self._empty.committed(self.store.events_version() if self._empty.carrying else None)
        if any(e.event_type is EventType.RUN_SKIPPED for e in events):
            self._empty.found(SKIPS, empty=False)

    @staticmethod
    def _event(result: TickResult, kind: EventType, job_id: str, **fields) -> Event:
        return Event(event_type=kind, run_id=result.run_id, snapshot_ts=result.snapshot_ts,
                     trigger_job_id=job_id, **fields)


@dataclass(frozen=True)
class Wanted:
    """A run this tick requests: a ready job's (the dependency rule) or one an operator asked for."""

    job_id: str
    job_name: str | None
    rows: list[ReadyRow]      # the rows whose pending data it consumes (none: a manual run over nothing new)
    consumed: list[str]       # the NEW_DATA event ids it consumes
    ask: TriggerAsk | None = None
    #: how many earlier asks of the same data had their runs skipped (see Heartbeat._past_skips)
    attempt: int = 0
    #: why the trigger holds let it start (policies/trigger_shaping.py); empty without trigger shaping
    released: tuple[ReleaseReason, ...] = ()

    @property
    def first_token(self) -> str:
        """Job id + consumed events; a manual run adds its ask, so it never repeats another run's token."""
        return idempotency_token(self.job_id, self.consumed + ([f"ask:{self.ask.ask_event_id}"] if self.ask else []))

    @property
    def token(self) -> str:
        """The token of this ask: the first, or the next of its chain after skipped runs."""
        return skipped_token(self.first_token, self.attempt)

    @property
    def message(self) -> str | None:
        if self.ask is None:
            return None
        return (f"manual run asked by {self.ask.by}" + (f" ({self.ask.reason})" if self.ask.reason else "")
                + (f"; consumes {len(self.consumed)} pending event(s)" if self.consumed else "; nothing new pending"))


def _consumed(event_ids: str) -> list[str]:
    return [i for i in event_ids.split(",") if i]


def _retry_message(row: ControlRow, ask: RetryAsk | None) -> str:
    """The RETRY_REQUESTED event's note: who asked for it, or the policy."""
    if ask is None:
        return f"automatic retry after {row.consecutive_failures} failed run(s)"
    return (f"retry asked by {ask.by}" + (f" ({ask.reason})" if ask.reason else "")
            + f" after {row.consecutive_failures} failed run(s)")


def _timing_payload(status: RunStatus) -> str | None:
    """A run end event's payload: the run's own start, end and queue time (None when the backend knows none)."""
    timing = status.timing()
    return json.dumps(timing) if timing else None


def _trigger_crash_points(calls: int) -> Callable[[int], None]:
    """Crash points among the parallel trigger calls: after the first answer, and after half of them."""
    def on_answer(answered: int) -> None:
        if answered == 1:
            crash_point(FaultPoint.AFTER_TRIGGER_CALL)
        if answered == (calls + 1) // 2:
            crash_point(FaultPoint.DURING_TRIGGER_CALLS)
    return on_answer


class _stage:
    """Adds the wall time of a block to ``timings[name]``; the block's log lines name the stage."""

    def __init__(self, timings: dict[str, float], name: str):
        self.timings, self.name = timings, name

    def __enter__(self) -> None:
        self.began = time.monotonic()
        self.token = TICK_STAGE.set(self.name)

    def __exit__(self, *exc) -> None:
        TICK_STAGE.reset(self.token)
        self.timings[self.name] = self.timings.get(self.name, 0.0) + time.monotonic() - self.began
