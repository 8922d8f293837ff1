"""Step 6 of a tick: its report. The per-source rows of a tick that did something, then its run summary; idle
ticks are coalesced into one summary row, written when the streak ends or grows old.

Invariant: a tick's summary row is written after its per-source rows (a summary means they are complete), and
a pending idle streak's row goes before the next busy tick's, or when the runner stops (:meth:`TickReport.flush`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from heartbeat_runner.core.records import Outcome, RunSummary, SensorEvaluation, utcnow
from heartbeat_runner.runner.tick_parts import TickParts
from heartbeat_runner.runner.tick_result import BACKEND_MEMORY, CONTROL_REFRESHES, IdleStreak, TickResult


class TickReport:
    """The run report of every tick of one runner (module docstring: its invariant)."""

    def __init__(self, parts: TickParts):
        self.parts = parts
        #: the idle ticks not yet written (None: the latest tick was not idle)
        self._idle: IdleStreak | None = None
        #: how often the running loop restarted itself past its memory ceiling (set by the loop)
        self.loop_restarts = 0

    def flush(self) -> None:
        """Write the summary of a pending idle streak (the runner stops)."""
        if self._idle is not None:
            self.parts.store.append_run(self._idle.summary(self.summary_figures()), [])
            self._idle = None

    def write_evaluations(self, result: TickResult) -> None:
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
        self.parts.store.append_runs([], evaluations)

    def write_report(self, result: TickResult, began: float, report_began: float) -> None:
        """The run summary of a tick (its per-source rows are written: :meth:`write_evaluations`); idle ticks
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
            self.parts.store.append_run(streak.summary(self.summary_figures()), [])
            return
        pending = [self._idle.summary(self.summary_figures())] if self._idle is not None else []
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
                                      **self.summary_figures()}),
        )]
        self.parts.store.append_runs(summaries, [])

    def _idle_row_due(self) -> bool:
        """Whether the idle streak is old enough for its row: ``idle_flush_s``, or while the engine is parked
        ``memory.idle_flush_parked_s`` if longer (the append would start the engine for that row alone; what
        pages show stays current through the liveness file, and the row is written with the next tick that
        does something, whichever comes first)."""
        wait = self.parts.settings.idle_flush_s
        if self.parts.store.engine.parked:
            wait = max(wait, self.parts.settings.memory.idle_flush_parked_s)
        return self._idle is not None and time.monotonic() - self._idle.began >= wait

    def summary_figures(self) -> dict[str, Any]:
        """The process figures, and the jobs backend's memory for the next process (see JobsBackend.memory)."""
        memory = self.parts.backend.memory()
        return {**self._process_figures(), **({BACKEND_MEMORY: memory} if memory is not None else {})}

    def _process_figures(self) -> dict[str, int]:
        """What the run report tells about the process: engine recycles, starts after parking and loop
        restarts, when any."""
        engine = self.parts.store.engine
        figures = {"engine_recycles": engine.recycles, "engine_wakes": engine.wakes, "loop_restarts": self.loop_restarts}
        return {name: value for name, value in figures.items() if value}
