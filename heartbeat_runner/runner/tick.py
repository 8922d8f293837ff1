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

This module is the order; each step is its own module, sharing :class:`~heartbeat_runner.runner.tick_parts.TickParts`
(the store, control table, backend and the one way to commit events): steps 1-2 ``sensing_step``, step 4
``triggering``, step 5 ``reconciliation``, step 6 ``tick_report``; what a tick did is a
:class:`~heartbeat_runner.runner.tick_result.TickResult`. A tick's jobs API budget is made per tick and handed
to the steps that call the API; nothing else of one tick is kept on :class:`Heartbeat`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, TypeVar, cast, overload

from heartbeat_runner.core.faults import FaultPoint, crash_point, fail_point
from heartbeat_runner.core.logs import TICK_RUN_ID, in_context
from heartbeat_runner.core.records import Event, Outcome, RunStart
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.jobs.base import JobsBackend
from heartbeat_runner.jobs.calls import ApiBudget
from heartbeat_runner.lakehouse.control_table import ControlTable, Refresh
from heartbeat_runner.lakehouse.maintenance import Maintenance, MaintenanceDue, MaintenanceResult
from heartbeat_runner.lakehouse.store import CONTROL, TableStore, concurrently
from heartbeat_runner.policies.retry import RetryPolicies
from heartbeat_runner.policies.trigger_shaping import TriggerShaping
from heartbeat_runner.runner.reconciliation import Reconciler
from heartbeat_runner.runner.sensing_step import Sensing
from heartbeat_runner.runner.sequences import Sequences
from heartbeat_runner.runner.tick_parts import TickParts
from heartbeat_runner.runner.tick_report import TickReport
from heartbeat_runner.runner.tick_result import TickObserver, TickResult, stage
from heartbeat_runner.runner.triggering import TrackedJobs, Triggering
from heartbeat_runner.runner.wakeups import POLL, TickScope
from heartbeat_runner.sensing.parallel import sense_all
from heartbeat_runner.sensing.sources.base import SenseContext

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class _Part(Generic[_T]):
    """An attribute of :class:`Heartbeat` kept on its :class:`TickParts`, where the steps read it: read there, and
    set there by a caller that gives a built runner other settings or policies (tests, benchmarks)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, heartbeat: None, owner: type) -> _Part[_T]: ...

    @overload
    def __get__(self, heartbeat: Heartbeat, owner: type) -> _T: ...

    def __get__(self, heartbeat: Heartbeat | None, owner: type) -> _T | _Part[_T]:
        return self if heartbeat is None else cast(_T, getattr(heartbeat.parts, self.name))

    def __set__(self, heartbeat: Heartbeat, value: _T) -> None:
        setattr(heartbeat.parts, self.name, value)


class Heartbeat:
    """Runs ticks against one store, control table (which builds through the dbt project) and jobs backend.

    It keeps nothing of one tick for the next: each step keeps what is its own (sensing: the failing and skipped
    sources; triggering: whether the policies were copied; reconciliation: the backend's memory handed over; the
    report: the idle streak), and every tick leaves the control and sensor state tables current."""

    store = _Part[TableStore]()
    control = _Part[ControlTable]()
    backend = _Part[JobsBackend]()
    ctx = _Part[SenseContext]()
    settings = _Part[Settings]()
    policies = _Part[RetryPolicies]()
    shaping = _Part[TriggerShaping]()
    sequences = _Part[Sequences]()

    def __init__(self, store: TableStore, control: ControlTable, backend: JobsBackend, ctx: SenseContext,
                 *, progress: Callable[[str], None] | None = None, policies: RetryPolicies | None = None,
                 maintenance: Maintenance | None = None, sequences: Sequences | None = None,
                 shaping: TriggerShaping | None = None, before_trigger: Callable[[], None] | None = None,
                 observer: TickObserver | None = None):
        given: dict[str, Any] = {"policies": policies, "shaping": shaping, "progress": progress,
                                 "before_trigger": before_trigger}
        # what is not given keeps TickParts' default (declared there only)
        self.parts = TickParts(store, control, backend, ctx, sequences or Sequences(store, {}),
                               **{name: value for name, value in given.items() if value is not None})
        self.sensing = Sensing(self.parts)
        self.triggering = Triggering(self.parts)
        self.reconciler = Reconciler(self.parts, self.triggering)
        self.report = TickReport(self.parts)
        self.maintenance = maintenance
        #: watches each tick's result after its report (alerts, lineage)
        self.observer = observer or TickObserver()

    @property
    def loop_restarts(self) -> int:
        """How often the running loop restarted itself past its memory ceiling (the loop sets it; reported)."""
        return self.report.loop_restarts

    @loop_restarts.setter
    def loop_restarts(self, count: int) -> None:
        self.report.loop_restarts = count

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
           previous tick's last build is current and this one costs a version read;
        2. after the new-data events, control table only: the ready view must see them to trigger; it folds
           the tick's new data in when nothing else was recorded since the first;
        3. before the report: what triggering and reconciliation recorded, with the sensor state table
           (what other products follow), so ``status``, the page and the next tick read current state; it
           folds the tick's own requests and the runs that ended when that is all it recorded.
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

        self.triggering.prepare_windows()
        with stage(timings, "models"):
            self.refresh_models(into=result)
        with stage(timings, "sensing"):
            self.sensing.sense(result)
        crash_point(FaultPoint.AFTER_SENSING)
        fail_point(FaultPoint.AFTER_SENSING)
        with stage(timings, "events_write"):
            self.parts.append(result, self.sensed_events(result))
        crash_point(FaultPoint.AFTER_NEW_DATA_EVENTS)
        with stage(timings, "dbt"):
            # triggering reads the control table alone; the tick's new data folds into it when that is all
            result.new_data_folded = self.refresh_models(control_only=True, into=result).folded_new_data
        budget = ApiBudget(self.settings.jobs_api)  # the tick's: triggering and reconciliation share it
        with stage(timings, "triggering"):
            # two independent reads of the control table just built: at once
            ready, tracked = concurrently(self.store.ready_rows, self.triggering.tracked_jobs)
            self.triggering.trigger_ready(result, budget, ready, tracked.resumed,
                                          [row.trigger_job_id for row in tracked.in_progress])
            self.triggering.trigger_windows(result, budget)
        fail_point(FaultPoint.AFTER_TRIGGERING)
        with stage(timings, "reconciliation"):
            follow_ups = self.reconciler.reconcile(result, budget, tracked)
            self.reconciler.request_follow_ups(result, budget, follow_ups)
        ends: Refresh | None = None
        if result.completed:
            with stage(timings, "after_ends"):
                ends = self._after_ends(result, budget, tracked)
        with stage(timings, "report"):
            # what triggering and reconciliation recorded, before the report; its per-source rows meanwhile
            concurrently(lambda: self._refresh_recorded(result, ends), lambda: self.report.write_evaluations(result))
            result.sql_parses = self.store.engine.sql_count - parses_before
            self.report.write_report(result, began, time.monotonic())
        with stage(timings, "alerts"):
            self.observer.observe(result)
        if self.maintenance is not None and not result.is_idle:
            self._maintain(result)
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
        with stage(result.stage_timings, "maintenance"):
            due = self.maintenance.due()
            if due is MaintenanceDue.RUN:
                self.parts.progress("maintenance: archiving and compacting Heartbeat's tables")
                result.maintenance = self.run_maintenance()
            elif due is MaintenanceDue.CONTROL:
                result.maintenance = MaintenanceResult(compacted={CONTROL: self.maintenance.compact_control()})

    def run_maintenance(self) -> MaintenanceResult:
        """Archive and compact; the control table does not change, so it stays current."""
        assert self.maintenance is not None
        return self.control.run_maintenance(self.maintenance)

    def close(self) -> None:
        """Write the summary of a pending idle streak (call when the runner stops)."""
        fail_point(FaultPoint.CLOSING)
        self.observer.close()
        self.report.flush()

    def sensed_events(self, result: TickResult) -> list[Event]:
        """The NEW_DATA / CURSOR events of what ``result`` sensed, against the cursors as they are now."""
        return self.sensing.sensed_events(result)

    def refresh_models(self, force: bool = False, *, control_only: bool = False,
                       into: TickResult | None = None) -> Refresh:
        """Bring the control table (and, unless ``control_only``, the sensor state table) up to date; see
        :meth:`ControlTable.refresh`. The events table's version is read every tick (a file listing on local
        engines); a tick whose events table is gone fails here, even when idle ticks read nothing else, so
        the loop sees its lakehouse is unusable. ``into``: the tick whose refreshes this one joins."""
        refreshed = self.control.refresh(force=force, control_only=control_only)
        if into is not None:
            into.refreshes.append(refreshed)
        return refreshed

    def _refresh_recorded(self, result: TickResult, ends: Refresh | None = None) -> None:
        """Step 3 of :meth:`tick`: the control and sensor state tables. ``ends``: the refresh after reconciliation
        (:meth:`_after_ends`); when nothing was recorded since, its folds are the tick's last."""
        refreshed = self.refresh_models(into=result)
        unchanged = ends is not None and ends.version == refreshed.version
        result.control_folded = refreshed.folded or (unchanged and ends is not None and ends.folded)

    # -- step 5b: what waited for the runs that ended ------------------------------------------

    def _after_ends(self, result: TickResult, budget: ApiBudget, tracked: TrackedJobs) -> Refresh:
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
        due = [(target, jobs) for target, jobs in self.parts.store.sensors_due()
               if target.source_key not in sensed and ended & set(jobs.split(","))]
        if not due:
            return refreshed
        self.parts.progress(f"sensing {len(due)} source(s) of {len(ended)} job(s) whose runs ended")
        outcomes = sense_all(due, self.parts.ctx, max_workers=self.parts.settings.max_workers,
                             timeout_s=self.parts.settings.sensor_timeout_s, look_first=False)
        pass_result = replace(result, sensed=outcomes)  # sensed_events reads only the run id, snapshot and sensed
        result.sensed += outcomes
        result.recovered += self.sensing.recoveries(outcomes)
        self.sensing.skipped_last -= {s.target.source_key for s in outcomes}
        self.parts.append(result, self.sensed_events(pass_result))
        fresh = [s for s in outcomes if s.outcome is Outcome.NEW_DATA]
        if not fresh:
            return refreshed
        # the jobs this pass may have made ready; not those the first pass asked for, refused or held back
        jobs = (ended | {job for s in fresh for job in s.trigger_job_ids.split(",") if job}) - {
            p.job_id for p in result.trigger_errors + result.runs_deferred}
        refreshed = self.refresh_models(control_only=True, into=result)
        ready = [row for row in self.parts.store.ready_rows() if row.trigger_job_id in jobs]
        if ready:
            # a pool counts what runs now: the tick's in-progress jobs less those that ended, plus its new starts
            running = sorted({row.trigger_job_id for row in tracked.in_progress} - ended - set(result.failed)
                             | set(result.triggered_job_ids))
            self.triggering.trigger_ready(result, budget, ready, [], running, asks=False)
        return refreshed
