"""The on-call view `status` prints: one line per job, what needs attention first.

On top: the counts by status, the runner's health, the open alerts, the failing sources and the
catch-up sequences in progress (a line each); then one line per job (id, name, status, since,
verdict) in the order an on-call engineer works through them: failed, trigger errors, sensing
errors, overdue, running, then the rest (a running or failed job's verdict says when its run is a
retry or a manual run). Every line fits the width it is given (ids, states and times are never cut; names are shortened in the middle,
verdicts at the end); with no width (a pipe without $COLUMNS) nothing is cut. With a height
(``status --watch`` on a terminal) the job lines stop where the screen does and the last line says
how many more there are.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from rich.text import Text

from heartbeat_runner.core.records import EventType
from heartbeat_runner.interfaces.output import Column, Fit, compact_table, cut_line, short_time, timestamp
from heartbeat_runner.interfaces.ui.data import JobPhase, JobSummary, RunRecord
from heartbeat_runner.runner.alerting import Liveness

#: the most open alerts and failing sources listed on top (the rest are counted)
TOP_ALERTS = 5
TOP_SOURCES = 5
#: the most catch-up sequences listed on top (the rest are counted; `status --wide` has them all)
TOP_SEQUENCES = 5


class Attention(str, enum.Enum):
    """A job's status in the on-call view, in the order the view lists them (most urgent first)."""

    FAILED = "failed"
    REFUSED = "refused"
    TRIGGER_ERROR = "trigger error"
    SENSING_ERROR = "sensing error"
    OVERDUE = "overdue"
    RUNNING = "running"
    READY = "ready"
    WAITING = "waiting"
    PAUSED = "paused"
    IDLE = "idle"


STYLES = {Attention.FAILED: "bold red", Attention.REFUSED: "bold red", Attention.TRIGGER_ERROR: "bold red",
          Attention.SENSING_ERROR: "red", Attention.OVERDUE: "yellow", Attention.RUNNING: "cyan", Attention.READY: "green",
          Attention.WAITING: "yellow", Attention.PAUSED: "dim", Attention.IDLE: "dim"}
_BY_PHASE = {JobPhase.FAILED: Attention.FAILED, JobPhase.REFUSED: Attention.REFUSED,
             JobPhase.TRIGGER_ERROR: Attention.TRIGGER_ERROR,
             JobPhase.SENSING_ERROR: Attention.SENSING_ERROR, JobPhase.RUNNING: Attention.RUNNING,
             JobPhase.READY: Attention.READY, JobPhase.WAITING: Attention.WAITING,
             JobPhase.PAUSED: Attention.PAUSED, JobPhase.IDLE: Attention.IDLE}
#: the kind of alert that makes a job overdue
OVERDUE_KIND = "JOB_OVERDUE"
JOB_COLUMNS = (Column("JOB"), Column("NAME", Fit.MIDDLE, 8), Column("STATUS"), Column("SINCE"),
               Column("VERDICT", Fit.END, 16))


@dataclass(frozen=True)
class JobLine:
    """One job as the on-call view lists it."""

    job_id: str
    name: str
    attention: Attention
    since: datetime | None
    verdict: str


@dataclass(frozen=True)
class CatchUp:
    """A catch-up sequence in progress (a row of heartbeat_job_sequences not finished yet): run ``run`` of
    ``runs`` of job ``job_id``, where it stands, and the windows of that run ("source:id from → to")."""

    job_id: str
    run: int
    runs: int
    state: str
    windows: str

    @classmethod
    def of(cls, row: dict) -> CatchUp:
        run, runs = int(row["run"]), int(row["runs"])
        windows = ", ".join(f"{w.get('sensor_source')}:{w.get('sensor_id')} {_span(w)}" for w in _windows(row.get("windows")))
        return cls(str(row["trigger_job_id"]), run, runs, _sequence_state(row, run), windows)

    def line(self) -> str:
        return f"  {self.job_id}: run {self.run} of {self.runs} {self.state}" + (
            f" · {self.windows}" if self.windows else "")


def _windows(recorded: str | None) -> list[dict]:
    """A sequence's windows (the JSON list its run received as heartbeat_windows); none when unreadable."""
    try:
        found = json.loads(recorded or "[]")
    except ValueError:
        return []
    return [w for w in found if isinstance(w, dict)] if isinstance(found, list) else []


def _span(window: dict) -> str:
    start, end = window.get("from") or "…", window.get("to") or "…"
    return str(start) if start == end else f"{start} → {end}"


def _sequence_state(row: dict, run: int) -> str:
    """Where a sequence stands, from its job's latest lifecycle event."""
    if row.get("is_paused"):
        return "paused"
    if row.get("next_run_due"):
        return f"done, run {run + 1} due next tick"
    event = row.get("last_lifecycle_event")
    if event in (EventType.FAILED.value, EventType.REFUSED.value):
        return str(event).lower()
    if event in (EventType.TRIGGER_REQUESTED.value, EventType.NEXT_WINDOW_REQUESTED.value,
                 EventType.RETRY_REQUESTED.value):
        return "running"
    return str(event or "not started").lower()


@dataclass(frozen=True)
class OnCall:
    """What the view shows: the jobs (already in attention order), the open alerts and the runner."""

    jobs: list[JobLine]
    alerts: list[dict]
    health: Liveness
    #: failing sources: source key -> its sensing error
    failing: dict[str, str]
    #: catch-up sequences in progress, by job id
    sequences: list[CatchUp]


def on_call(jobs: Sequence[JobSummary], alerts: list[dict], health: Liveness, sequences: Sequence[dict]) -> OnCall:
    """The view of ``jobs`` (the page's overview), the open ``alerts``, the runner's ``health`` and the catch-up
    ``sequences`` not finished yet (rows of heartbeat_job_sequences)."""
    overdue = {job for a in alerts if a.get("kind") == OVERDUE_KIND for job in _jobs_of(a)}
    lines = [_line(job, overdue) for job in jobs]
    order = list(Attention)
    lines.sort(key=lambda line: (order.index(line.attention), line.job_id))
    failing = {d.label: d.sensing_error for job in jobs for d in job.dependencies if d.sensing_error}
    catch_ups = sorted((CatchUp.of(row) for row in sequences), key=lambda c: c.job_id)
    return OnCall(lines, alerts, health, dict(sorted(failing.items())), catch_ups)


def _jobs_of(alert: dict) -> list[str]:
    jobs = alert.get("jobs")
    if isinstance(jobs, str):
        try:
            jobs = json.loads(jobs)
        except ValueError:
            return []
    return [str(j) for j in jobs or []]


#: phases a job is in because of its last run: its verdict says how that run came about (a retry, a manual run)
_PHASES_OF_A_RUN = frozenset({JobPhase.RUNNING, JobPhase.FAILED, JobPhase.REFUSED})


def _line(job: JobSummary, overdue: set[str]) -> JobLine:
    attention = _BY_PHASE[job.phase]
    if job.job_id in overdue and order_of(attention) > order_of(Attention.OVERDUE):
        attention = Attention.OVERDUE
    verdict = job.verdict
    run = job.last_run
    if attention in (Attention.FAILED, Attention.REFUSED) and run is not None and run.failure_reason:
        verdict = f"{run.failure_reason} (run {run.job_run_id}; `explain` for more)"
    if job.phase in _PHASES_OF_A_RUN and run is not None and (kind := run_kind(run)):
        verdict = f"{kind}: {verdict}"
    return JobLine(job.job_id, job.job_name or "", attention, job.since, verdict)


def run_kind(run: RunRecord) -> str | None:
    """How a run came about when not by the dependency rule: "retry" or "manual run" (None: neither)."""
    if run.is_retry:
        return "retry"
    return "manual run" if run.manual else None


def order_of(attention: Attention) -> int:
    return list(Attention).index(attention)


def render(view: OnCall, width: int | None, height: int | None = None, now: datetime | None = None) -> list[Text]:
    """The view's lines, each at most ``width`` characters (None: whole), at most ``height`` lines (None: all)."""
    now = now or datetime.now(timezone.utc)
    top = [cut_line(line, width) for line in _summary(view, now)]
    table = compact_table(JOB_COLUMNS, [_cells(line, now) for line in view.jobs], width)
    if height is not None and len(top) + 1 + len(table) > height:
        room = max(1, height - len(top) - 3)  # a blank line, the header and the "… more" line
        rest = Counter(line.attention.value for line in view.jobs[room:])
        more = ", ".join(f"{n} {state}" for state, n in rest.items())
        table = table[:1 + room] + [cut_line(Text(f"… {len(view.jobs) - room} more: {more}", style="dim"), width)]
    return top + [Text("")] + table


def _summary(view: OnCall, now: datetime) -> list[Text]:
    counts = Counter(line.attention for line in view.jobs)
    parts = [Text(f"{n} {state.value}", style=STYLES[state]) for state in Attention if (n := counts[state])]
    lines = [Text.assemble(f"{len(view.jobs)} job(s): ", Text(" · ").join(parts),
                           f"   (at {timestamp(now)})")]
    lines.append(health_line(view.health))
    if view.alerts:
        lines.append(Text(f"open alerts: {len(view.alerts)}", style="bold"))
        for alert in view.alerts[:TOP_ALERTS]:
            lines.append(Text.assemble("  ", (str(alert.get("severity") or "").upper(), _severity(alert)), " ",
                                       f"{alert.get('summary')}"))
        if len(view.alerts) > TOP_ALERTS:
            lines.append(Text(f"  … {len(view.alerts) - TOP_ALERTS} more: `alerts`", style="dim"))
    else:
        lines.append(Text("open alerts: none", style="dim"))
    if view.failing:
        lines.append(Text(f"sensing errors: {len(view.failing)} source(s)", style="red"))
        for source, error in list(view.failing.items())[:TOP_SOURCES]:
            lines.append(Text(f"  {source}: {error}"))
        if len(view.failing) > TOP_SOURCES:
            lines.append(Text(f"  … {len(view.failing) - TOP_SOURCES} more: `status --wide`", style="dim"))
    if view.sequences:
        lines.append(Text(f"catch-up sequences: {len(view.sequences)}", style="cyan"))
        lines += [Text(sequence.line()) for sequence in view.sequences[:TOP_SEQUENCES]]
        if len(view.sequences) > TOP_SEQUENCES:
            lines.append(Text(f"  … {len(view.sequences) - TOP_SEQUENCES} more: `status --wide`", style="dim"))
    return lines


def _severity(alert: dict) -> str:
    return "bold red" if str(alert.get("severity")).lower() in ("error", "critical") else "yellow"


def health_line(health: Liveness) -> Text:
    """One line on the runner: ``runner: ticking`` with its last tick and interval, or what is wrong."""
    if health.ticked_at is None:
        return Text.assemble(("runner: NOT TICKING", "bold red"), f". {health.message}; start one with `run --loop`")
    interval = f", about every {health.interval_s:.0f} s" if health.interval_s else ""
    last = timestamp(datetime.fromtimestamp(health.ticked_at, timezone.utc))
    state = ("runner: ticking", "green") if health.healthy else ("runner: NOT TICKING", "bold red")
    return Text.assemble(state, f" (last tick ended {last}, {health.age_s or 0:.0f} s ago{interval}; "
                                f"limit {health.limit_s:.0f} s)")


def _cells(line: JobLine, now: datetime) -> list[tuple[str, str]]:
    return [(line.job_id, ""), (line.name, ""), (line.attention.value, STYLES[line.attention]),
            (short_time(line.since, now), ""), (line.verdict, "")]
