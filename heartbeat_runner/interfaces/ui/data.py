"""What the status page shows, read from the same tables and views as the CLI.

Each function takes the table store (and, for run output, the jobs backend) and returns
plain records the server turns into JSON. Nothing here writes: operator actions live in
``ui.actions``. The dependency rule is not repeated here either: readiness and the
verdict come from ``jobs_trigger_explanation``, the view ``explain`` prints.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from heartbeat_runner.core.records import JobState, JobStatus, Outcome, TickStatus
from heartbeat_runner.interfaces.operations import (
    RUN_REPORT_ALL_VIEW,
    explain,
    late_data,
    pending_ask,
    recent_runs,
    trigger_holds,
    with_idle_sensing,
)
from heartbeat_runner.jobs.base import JobsBackend, RunOutput
from heartbeat_runner.lakehouse.store import EVENTS, EXPLANATION_VIEW, Cond, TableStore
from heartbeat_runner.policies.trigger_shaping import TriggerShaping
from heartbeat_runner.runner.alerting import idle_sensing, list_alerts
from heartbeat_runner.runner.tick_result import COUNT_FIGURES

JOB_RUNS_VIEW = "heartbeat_job_runs"
LATEST_RUN_VIEW = "heartbeat_job_latest_run"
#: how many runs, events and ticks a page lists
RECENT_RUNS = 50
RECENT_EVENTS = 60
RECENT_TICKS = 60
#: the open alerts the page lists at most (the CLI's `alerts --limit` shows more)
OPEN_ALERTS_SHOWN = 200


class JobPhase(str, enum.Enum):
    """One word per job for the page, derived from its active control rows in this order."""

    PAUSED = "PAUSED"          # a row is paused
    RUNNING = "RUNNING"        # a run is in progress (or requested)
    FAILED = "FAILED"          # the last run failed: blocked until a successful run
    REFUSED = "REFUSED"        # the jobs service refused the last run (it never ran): blocked until a retry
    TRIGGER_ERROR = "TRIGGER_ERROR"  # the jobs API refused the latest request: asked again each tick (same token)
    SENSING_ERROR = "SENSING_ERROR"  # a hard dependency's source fails sensing: the job cannot get ready
    READY = "READY"            # every hard dependency has new data: triggers at the next tick
    WAITING = "WAITING"        # some dependency has new data, a hard one has none yet
    IDLE = "IDLE"              # nothing new on any dependency


class SourceHealth(str, enum.Enum):
    """A source node's colour in the graph: its last sensing."""

    ERROR = "ERROR"
    NEW_DATA = "NEW_DATA"
    QUIET = "QUIET"


@dataclass(frozen=True)
class Dependency:
    source_key: str
    label: str
    sensor_source: str
    kind: str  # hard | soft
    met: bool
    status: str | None
    state: str
    since: datetime | None
    sensing_error: str | None


@dataclass(frozen=True)
class RunRecord:
    """One run Heartbeat requested of a job (a row of heartbeat_job_runs)."""

    job_run_id: str | None
    outcome: str
    requested_at: datetime | None
    triggered_at: datetime | None
    #: the run's own start and end (its backend's times); duration_s is theirs, None while running or unknown
    started_at: datetime | None
    ended_at: datetime | None
    duration_s: float | None
    #: seconds it waited in the jobs service's queue, where there is one
    queued_s: float | None
    is_retry: bool
    message: str | None
    windows: list[dict[str, Any]] = field(default_factory=list)
    #: "2 of 3" for a run of a bounded catch-up sequence
    catch_up: str | None = None
    #: for a run an operator asked for (`trigger`, the page's "Run now"): who asked and why
    manual: str | None = None
    #: a failed run (or a refused request): one line saying what went wrong; None otherwise
    failure_reason: str | None = None
    #: a failed run: the last lines of its output (redacted), where its backend keeps them; None otherwise
    output_tail: list[str] | None = None


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    job_name: str | None
    phase: JobPhase
    verdict: str
    since: datetime | None
    dependencies: list[Dependency]
    last_run: RunRecord | None


def as_json(value: Any) -> Any:
    """Records, enums and timestamps as JSON-able values (timestamps in ISO 8601, UTC)."""
    if hasattr(value, "__dataclass_fields__"):
        return as_json(asdict(value))
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


# -- overview ----------------------------------------------------------------------------------

def overview(store: TableStore, lakehouse_dir: Path | None = None,
             shaping: TriggerShaping | None = None) -> list[JobSummary]:
    """Every active job with its phase, verdict, dependencies and last run, by job id; with ``lakehouse_dir``,
    each source's last evaluation counts the runner's latest idle tick (as on the job page and in ``explain``);
    with ``shaping`` (the run-policy file's trigger holds), a ready job that a hold keeps back says which hold
    and until when in its verdict."""
    idle = idle_sensing(lakehouse_dir) if lakehouse_dir else None
    rows = store.read(EXPLANATION_VIEW, Cond("is_active", True), order_by=["trigger_job_id", "dependency",
                                                                          "sensor_source", "sensor_id"])
    latest = {r["trigger_job_id"]: _run_record(r) for r in store.read(LATEST_RUN_VIEW)}
    by_job: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_job[row["trigger_job_id"]].append(row)
    summaries = [_summary(job_id, with_idle_sensing(job_rows, idle), latest.get(job_id))
                 for job_id, job_rows in sorted(by_job.items())]
    if shaping is None:
        return summaries
    holds = trigger_holds(store, shaping, [s.job_id for s in summaries if s.phase is JobPhase.READY])
    return [replace(s, verdict=f"{s.verdict}; {holds[s.job_id]}") if s.job_id in holds else s for s in summaries]


def _summary(job_id: str, rows: list[dict], last_run: RunRecord | None) -> JobSummary:
    phase = job_phase(rows)
    return JobSummary(job_id=job_id, job_name=rows[0]["trigger_job_name"], phase=phase, verdict=rows[0]["verdict"],
                      since=_phase_since(phase, rows, last_run), dependencies=[_dependency(r) for r in rows],
                      last_run=last_run)


def job_phase(rows: Iterable[dict]) -> JobPhase:
    """The phase of a job from its active explanation rows (see JobPhase for the order)."""
    rows = list(rows)
    statuses = {r["status"] for r in rows}
    if any(r["job_state"] == JobState.PAUSED for r in rows):
        return JobPhase.PAUSED
    if JobStatus.IN_PROGRESS in statuses:
        return JobPhase.RUNNING
    if JobStatus.FAILED in statuses:
        return JobPhase.FAILED
    if JobStatus.REFUSED in statuses:
        return JobPhase.REFUSED
    if any(r["last_error"] and r["status"] == JobStatus.NEW_EVENT_AVAILABLE for r in rows):
        return JobPhase.TRIGGER_ERROR
    if any(r["sensing_error"] and r["dependency"] == "hard" for r in rows):
        return JobPhase.SENSING_ERROR
    if any(r["is_ready"] for r in rows):
        return JobPhase.READY
    if JobStatus.NEW_EVENT_AVAILABLE in statuses:
        return JobPhase.WAITING
    return JobPhase.IDLE


def _phase_since(phase: JobPhase, rows: list[dict], last_run: RunRecord | None) -> datetime | None:
    """Since when the job is in its phase: the oldest waiting data, the run's start or end, the last change."""
    waiting = [r["status_change_timestamp"] for r in rows
               if r["status"] == JobStatus.NEW_EVENT_AVAILABLE and r["status_change_timestamp"]]
    if phase in (JobPhase.READY, JobPhase.WAITING) and waiting:
        return min(waiting)
    if phase is JobPhase.RUNNING and last_run is not None:
        return last_run.triggered_at or last_run.requested_at
    changes = [r["status_change_timestamp"] for r in rows if r["status_change_timestamp"]]
    return max(changes) if changes else None


def _dependency(row: dict) -> Dependency:
    return Dependency(source_key=row["source_key"], label=f"{row['sensor_source']}:{row['sensor_id']}",
                      sensor_source=row["sensor_source"], kind=row["dependency"],
                      met=row["status"] == JobStatus.NEW_EVENT_AVAILABLE, status=row["status"],
                      state=row["row_state"], since=row["status_change_timestamp"],
                      sensing_error=row["sensing_error"])


def _run_record(row: dict) -> RunRecord:
    return RunRecord(job_run_id=row["job_run_id"], outcome=row["outcome"], requested_at=row["requested_at"],
                     triggered_at=row["triggered_at"], started_at=row["started_at"], ended_at=row["ended_at"],
                     duration_s=row["duration_s"], queued_s=row["queued_s"],
                     is_retry=bool(row["is_retry"]), message=row["message"], windows=windows_of(row["parameters"]),
                     catch_up=catch_up_of(row["parameters"]), manual=row.get("manual_note"),
                     failure_reason=row.get("failure_reason"),
                     output_tail=tail_of(row.get("output_tail")))


def tail_of(recorded: str | None) -> list[str] | None:
    """The output tail recorded with a failed run (a JSON array of lines), or None."""
    try:
        lines = json.loads(recorded) if recorded else None
    except ValueError:
        return None
    return [str(line) for line in lines] if isinstance(lines, list) else None


def catch_up_of(parameters: str | None) -> str | None:
    """"k of n" when the run is run k of a catch-up sequence of n runs."""
    try:
        position = json.loads(json.loads(parameters or "{}").get("heartbeat_catch_up") or "null")
    except (ValueError, AttributeError):
        return None
    return f"{position['run']} of {position['runs']}" if isinstance(position, dict) else None


def windows_of(parameters: str | None) -> list[dict[str, Any]]:
    """The windows a run consumed, from the job parameters it was sent (empty when none were recorded)."""
    if not parameters:
        return []
    try:
        windows = json.loads(json.loads(parameters).get("heartbeat_windows") or "[]")
    except (ValueError, AttributeError):
        return []
    return windows if isinstance(windows, list) else []


# -- graph -------------------------------------------------------------------------------------

def graph(jobs: list[JobSummary]) -> dict[str, list[dict[str, Any]]]:
    """Sources -> jobs: each source once however many jobs read it; edges hard or soft."""
    sources: dict[str, dict[str, Any]] = {}
    edges = []
    for job in jobs:
        for dep in job.dependencies:
            node = sources.setdefault(dep.source_key, {"id": f"source:{dep.source_key}", "kind": "source",
                                                       "label": dep.label, "group": dep.sensor_source,
                                                       "health": SourceHealth.QUIET, "jobs": 0})
            node["jobs"] += 1
            node["health"] = _worse(node["health"], _health(dep))
            edges.append({"from": node["id"], "to": f"job:{job.job_id}", "kind": dep.kind})
    nodes = list(sources.values()) + [
        {"id": f"job:{j.job_id}", "kind": "job", "label": j.job_name or j.job_id, "job_id": j.job_id,
         "group": "job", "phase": j.phase} for j in jobs]
    return {"nodes": as_json(nodes), "edges": edges}


def _health(dep: Dependency) -> SourceHealth:
    if dep.sensing_error:
        return SourceHealth.ERROR
    return SourceHealth.NEW_DATA if dep.met else SourceHealth.QUIET


def _worse(a: SourceHealth, b: SourceHealth) -> SourceHealth:
    order = list(SourceHealth)
    return a if order.index(a) <= order.index(b) else b


# -- job page ----------------------------------------------------------------------------------

def job_page(store: TableStore, job_id: str, policy_file: Path | None = None,
             lakehouse_dir: Path | None = None) -> dict[str, Any]:
    """The explain verdict, the run timeline, the recent events and any late data of one job
    (HeartbeatError if unknown); each source's last evaluation counts the runner's latest idle tick."""
    found = explain(store, job_id, idle_sensing(lakehouse_dir) if lakehouse_dir else None)
    active = [r for r in found.rows if r["is_active"]]
    rows = store.read(JOB_RUNS_VIEW, Cond("trigger_job_id", job_id), order_by=["requested_at DESC"], limit=RECENT_RUNS)
    runs = [_run_record(r) for r in rows]
    asked = pending_ask(store, job_id)
    alerts = [a for a in open_alerts(store, lakehouse_dir) if job_id in a["jobs"]]
    return as_json({
        "job_id": job_id,
        "job_name": found.rows[0]["trigger_job_name"],
        "phase": job_phase(active) if active else None,
        "verdict": found.verdict + (f"; {asked}" if asked else ""),
        "ready": found.is_ready,
        "rows": [_explain_row(r) for r in found.rows],
        "runs": runs,
        "events": recent_events(store, job_id, sorted({r["source_key"] for r in active})),
        "late_data": late_data(store, policy_file, job_id),
        "alerts": alerts,
    })


def open_alerts(store: TableStore, lakehouse_dir: Path | None = None) -> list[dict[str, Any]]:
    """The open alerts (heartbeat_alerts, what `alerts` lists; with ``lakehouse_dir`` also the "runner not
    ticking" alert `check` raised), newest first; ``jobs`` as a list of job ids."""
    rows = list_alerts(store, include_resolved=False, limit=OPEN_ALERTS_SHOWN, lakehouse_dir=lakehouse_dir)
    return as_json([{**row, "jobs": json.loads(row["jobs"]) if row["jobs"] else []} for row in rows])


def _explain_row(row: dict) -> dict[str, Any]:
    keep = ("sensor_source", "sensor_id", "source_key", "dependency", "is_active", "job_state", "status",
            "status_change_timestamp", "row_state", "last_evaluated_at", "last_outcome", "job_run_id", "last_error")
    return {k: row.get(k) for k in keep}


def recent_events(store: TableStore, job_id: str, source_keys: list[str]) -> list[dict[str, Any]]:
    """The newest events of the job and of the sources it reads, newest first (from the hot log:
    `maintain` archives old history, and recent events are never archived)."""
    columns = ["event_ts", "event_type", "run_id", "source_key", "trigger_job_id", "job_run_id", "cursor_to",
               "rows", "message"]
    found = store.read(EVENTS, Cond("trigger_job_id", job_id), columns=columns,
                       order_by=["event_ts DESC"], limit=RECENT_EVENTS)
    if source_keys:
        found += store.read(EVENTS, Cond("source_key", source_keys, "in"), columns=columns,
                            order_by=["event_ts DESC"], limit=RECENT_EVENTS)
    found.sort(key=lambda e: e["event_ts"], reverse=True)
    return found[:RECENT_EVENTS]


def run_output(store: TableStore, backend: JobsBackend, job_id: str, run_id: str) -> RunOutput | None:
    """Where to read a run's output (a page of the jobs service, or the captured text).

    None unless Heartbeat recorded ``run_id`` as a run of ``job_id``: a page never shows
    another job's output under this job's address.
    """
    if not store.read(JOB_RUNS_VIEW, Cond("trigger_job_id", job_id), Cond("job_run_id", run_id),
                      columns=["job_run_id"], limit=1):
        return None
    return backend.run_output(job_id, run_id)


# -- ticks -------------------------------------------------------------------------------------

def ticks(store: TableStore, limit: int = RECENT_TICKS) -> dict[str, Any]:
    """Recent ticks with their stage durations (``runs``, one per tick, for the chart), the same ticks with
    consecutive failing ticks of one error folded into one row (``rows``), and the sources they could not
    sense or skipped, a source failing the same way tick after tick folded into one row (``problems``)."""
    runs = recent_runs(store, limit)
    ids = [r["run_id"] for r in runs]
    problems = store.read(RUN_REPORT_ALL_VIEW, Cond("run_id", ids, "in"),
                          Cond("outcome", [Outcome.ERROR.value, Outcome.SKIPPED.value], "in"),
                          columns=["run_id", "snapshot_ts", "source_key", "outcome", "error", "trigger_job_ids"],
                          order_by=["snapshot_ts DESC", "source_key"]) if ids else []
    for run in runs:
        run["stages"] = _stages(run.pop("stage_timings", None))
    return as_json({"runs": runs, "rows": [asdict(r) for r in fold_failing_ticks(runs)],
                    "problems": [asdict(p) for p in fold_problems(problems, ids)]})


@dataclass(frozen=True)
class TickRow:
    """One row of the ticks table: a tick, or a streak of consecutive ticks that failed the same way.

    ``tick`` is the newest tick of the streak (as heartbeat_run_overview has it); ``repeats`` how many ticks
    the row stands for (1: a single tick) and ``since`` when the oldest of them started."""

    tick: dict[str, Any]
    repeats: int
    since: datetime | None


def fold_failing_ticks(runs: list[dict[str, Any]]) -> list[TickRow]:
    """``runs`` (newest first) with each run of consecutive non-OK ticks of the same status and message
    folded into one TickRow; an OK tick is always its own row, so no success is ever hidden."""
    rows: list[TickRow] = []
    for run in runs:
        last = rows[-1] if rows else None
        if (last is not None and run["status"] != TickStatus.OK and last.tick["status"] == run["status"]
                and last.tick["message"] == run["message"]):
            rows[-1] = TickRow(tick=last.tick, repeats=last.repeats + 1, since=run["snapshot_ts"])
        else:
            rows.append(TickRow(tick=run, repeats=1, since=run["snapshot_ts"]))
    return rows


@dataclass(frozen=True)
class ProblemRow:
    """A source a tick could not sense or skipped, or a streak of consecutive ticks in which it failed the
    same way (same outcome, same error): ``ticks`` of them, the newest ``latest_run_id`` at ``latest``, the
    oldest at ``since``."""

    source_key: str
    outcome: str
    error: str | None
    trigger_job_ids: str | None
    ticks: int
    latest_run_id: str
    latest: datetime | None
    since: datetime | None


def fold_problems(problems: list[dict[str, Any]], tick_ids: list[str]) -> list[ProblemRow]:
    """``problems`` (newest first) folded per source: a problem continues a streak when it is the same
    (outcome, error) in the tick right before the streak's oldest tick (``tick_ids``, newest first); a tick
    in between without it, or another error, starts a new row. Newest row first."""
    position = {run_id: i for i, run_id in enumerate(tick_ids)}
    rows: list[ProblemRow] = []
    #: (source, outcome, error) -> (index in rows, position of the streak's oldest tick)
    streaks: dict[tuple[str, str, str | None], tuple[int, int]] = {}
    for problem in problems:
        key = (problem["source_key"], problem["outcome"], problem["error"])
        at = position.get(problem["run_id"], -1)
        streak = streaks.get(key)
        if streak is not None and at == streak[1] + 1:
            row = rows[streak[0]]
            rows[streak[0]] = replace(row, ticks=row.ticks + 1, since=problem["snapshot_ts"])
            streaks[key] = (streak[0], at)
            continue
        rows.append(ProblemRow(source_key=problem["source_key"], outcome=problem["outcome"], error=problem["error"],
                               trigger_job_ids=problem["trigger_job_ids"], ticks=1, latest_run_id=problem["run_id"],
                               latest=problem["snapshot_ts"], since=problem["snapshot_ts"]))
        streaks[key] = (len(rows) - 1, at)
    return rows


def _stages(timings: str | None) -> dict[str, float]:
    """Seconds per tick stage (an idle streak records its tick count and mean instead; counts are left out)."""
    if not timings:
        return {}
    try:
        parsed = json.loads(timings)
    except ValueError:
        return {}
    return {k: float(v) for k, v in parsed.items() if isinstance(v, (int, float)) and k not in COUNT_FIGURES}
