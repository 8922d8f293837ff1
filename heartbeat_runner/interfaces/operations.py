"""Operator commands: explain a job, reset it, list runs, guard config removals.

The answers come from the views (``jobs_trigger_explanation``,
``heartbeat_cursor_history``, ``heartbeat_run_overview``); this module only picks
rows and writes the audit events.
"""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import overload

from heartbeat_runner.core.errors import ConfigError, ConflictError, InvalidInputError, NotFoundError
from heartbeat_runner.core.records import BLOCKED_STATUSES, Event, EventType, JobStatus, Outcome, utcnow
from heartbeat_runner.core.settings import Settings, Target
from heartbeat_runner.jobs.base import LIMIT_BACKOFF, SKIP_BACKOFF_KEY, SKIP_CODE_KEY
from heartbeat_runner.lakehouse.store import CONTROL, EXPLANATION_VIEW, Cond, TableStore
from heartbeat_runner.policies.retry import RetryPolicies
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.policies.trigger_shaping import Candidate, Decisions, TriggerShaping, hold_decisions
from heartbeat_runner.runner.alerting import IdleSensing, Liveness, runner_liveness
from heartbeat_runner.runner.app import App
from heartbeat_runner.runner.lease import Lease
from heartbeat_runner.runner.tick_result import CONTROL_REFRESHES
from heartbeat_runner.sensing.sources.base import dump_cursor

CURSOR_HISTORY_VIEW = "heartbeat_cursor_history"
RUN_OVERVIEW_VIEW = "heartbeat_run_overview"
RUN_REPORT_ALL_VIEW = "heartbeat_run_report_all"
JOB_RUNS_VIEW = "heartbeat_job_runs"
#: what `runs --json` and `explain --json` give of each job run: its own start, end and duration as its jobs
#: backend recorded them (never when a tick noticed the end), and its queue time where the service has one
JOB_RUN_FIELDS = ("trigger_job_id", "job_run_id", "outcome", "is_retry", "is_manual", "manual_note", "requested_at",
                  "triggered_at", "started_at", "ended_at", "duration_s", "queued_s", "message", "failure_reason",
                  "output_tail")
#: how many of a job's latest runs `explain --json` gives
EXPLAIN_RUNS = 5

#: A cursor before the first item of any source: Delta version -1 (so version 0 is new);
#: the other sources find none of their keys in it (no offset, file, key value or load
#: date) and read from their start. NULL would mean "new sensor": a baseline at the end.
BEGINNING_CURSOR = dump_cursor({"version": -1})

ConfigKey = tuple[str, str, str]


def local_operator() -> str:
    """Who runs this process, as the audit trail names them: ``user@host``."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def runner_health(settings: Settings, store: TableStore | None = None) -> Liveness:
    """Is a runner ticking on this lakehouse? The last tick's end, its interval, and "runner not ticking" past
    ``alerts.runner.not_ticking_after`` (default: three intervals plus a minute). The same answer for ``check``,
    ``status`` and the page.

    The last tick is this machine's liveness file (a runner here rewrites it every tick, no table read) and,
    with ``store`` where that file is absent or on a databricks target, the newer of it and the latest rows of
    ``heartbeat_runs``: a runner on a job cluster leaves no file on a laptop or in the App, so off its machine
    only the lakehouse tells that it ticks."""
    return runner_liveness(settings.lakehouse_dir, load_run_policies(settings.run_policy_file).alerts,
                           store=store, prefer_lakehouse=settings.target is Target.DATABRICKS,
                           row_lag_s=settings.idle_flush_s)


#: the runner's health in each row of ``status --json`` (the rows stay the control table's)
RUNNER_FIELDS = ("runner_healthy", "runner_last_tick_at", "runner_interval_s")


def with_runner_health(rows: list[dict], health: Liveness) -> list[dict]:
    """``rows`` with the runner's health added to each (RUNNER_FIELDS)."""
    figures = health.as_json()
    extra = {"runner_healthy": health.healthy, "runner_last_tick_at": figures["last_tick_at"],
             "runner_interval_s": figures["interval_s"]}
    return [{**row, **extra} for row in rows]


def refresh_if_idle(app: App, lease: Lease) -> bool:
    """Rebuild the control table unless a runner is ticking (then read it as it is). True if fresh."""
    if lease.try_acquire() is not None:
        return False
    try:
        app.control.refresh()
    finally:
        lease.release()
    return True


# -- explain ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Explanation:
    job_id: str
    verdict: str
    is_ready: bool
    rows: list[dict]


def explain(store: TableStore, job_id: str, idle: IdleSensing | None = None) -> Explanation:
    """Why ``job_id`` did or did not trigger, from jobs_trigger_explanation; with ``idle`` (the runner's
    latest idle tick, ``idle_sensing``), each source's last evaluation is the newer of the recorded one and that."""
    rows = store.read(EXPLANATION_VIEW, Cond("trigger_job_id", job_id),
                      order_by=["is_active DESC", "dependency", "sensor_source", "sensor_id"])
    if not rows:
        raise unknown_job(job_id)
    rows = with_idle_sensing(rows, idle)
    verdict = rows[0]["verdict"]
    if any(row.get("status") == JobStatus.NEW_EVENT_AVAILABLE.value for row in rows):
        verdict += limit_skip_note(store, job_id)
    return Explanation(job_id, verdict, bool(rows[0]["is_ready"]), rows)


@dataclass(frozen=True)
class HoldLine:
    """What the trigger holds say of one job now (``explain``'s ``trigger:`` line): ``text``, and whether a hold
    keeps the job back (``held``: the text names the hold and until when)."""

    text: str
    held: bool = False


def trigger_hold(store: TableStore, shaping: TriggerShaping, job_id: str, is_ready: bool,
                 now: datetime | None = None) -> HoldLine | None:
    """What the trigger holds (policies/trigger_shaping.py) say of ``job_id`` now: which hold keeps it back and
    until when, or that every hold allows it; None when it has no trigger policy. For a job that is not ready
    (no data to run on), the policy alone. The same rule the tick applies, to the same facts, read once."""
    policy = shaping.for_job(job_id)
    if policy is None:
        return None
    if not is_ready:
        return HoldLine("trigger policy applies once it is ready")
    decisions = _hold_decisions(store, shaping, [job_id], now)
    if job_id in decisions.held:
        return HoldLine(decisions.held[job_id].describe(), held=True)
    reasons = ", ".join(reason.value for reason in decisions.released.get(job_id, ()))
    return HoldLine("no hold: starts at the next tick" + (f" ({reasons})" if reasons else ""))


def trigger_holds(store: TableStore, shaping: TriggerShaping, ready_job_ids: Iterable[str],
                  now: datetime | None = None) -> dict[str, str]:
    """The hold line of each of ``ready_job_ids`` that a trigger hold keeps back now (``status``, the page).

    The jobs are decided together, as a tick decides them (a pool's places go by priority), from one read of
    their facts and one of the running jobs, however many jobs there are; jobs without a trigger policy are
    never held."""
    shaped = [job_id for job_id in ready_job_ids if shaping.for_job(job_id) is not None]
    if not shaped:
        return {}
    return {job_id: hold.describe() for job_id, hold in _hold_decisions(store, shaping, shaped, now).held.items()}


def with_trigger_holds(store: TableStore, shaping: TriggerShaping, rows: list[dict]) -> list[dict]:
    """Control rows with ``trigger_hold``: on each row of a ready job that a trigger hold keeps back now, the
    hold line ``explain`` prints; None elsewhere (``status --json``). Without a trigger policy nothing is read."""
    holds: dict[str, str] = {}
    if shaping.jobs:
        holds = trigger_holds(store, shaping, sorted({row.trigger_job_id for row in store.ready_rows()}))
    for row in rows:
        row["trigger_hold"] = holds.get(row["trigger_job_id"])
    return rows


def _hold_decisions(store: TableStore, shaping: TriggerShaping, job_ids: list[str],
                    now: datetime | None) -> Decisions:
    """The trigger holds' decisions on ``job_ids`` (ready, with a policy) now: the rule the tick applies, to the
    same facts (heartbeat_job_trigger_facts) and the same running jobs."""
    facts = store.trigger_facts(job_ids)
    running = [row.trigger_job_id for row in store.jobs_with_status(JobStatus.IN_PROGRESS)]
    return hold_decisions(shaping, [Candidate(job_id).with_facts(facts.get(job_id, {})) for job_id in job_ids],
                          running, now or utcnow())


def limit_skip_note(store: TableStore, job_id: str) -> str:
    """Why a ready job may not be asked for yet: its latest run was skipped for a workspace limit, and its data
    waits for the back-off (``jobs.base.LIMIT_BACKOFF``) before it is asked for again; "" otherwise."""
    skip = store.latest_skip(job_id)
    if skip is None or not skip.get("payload") or not json.loads(skip["payload"]).get(SKIP_BACKOFF_KEY):
        return ""
    payload = json.loads(skip["payload"])
    return (f"; its last run {skip['job_run_id']} was skipped for a workspace limit "
            f"({payload.get(SKIP_CODE_KEY)}) at {skip['event_ts']}: its data is asked for again after a back-off "
            f"({LIMIT_BACKOFF.first_s:g}s, doubling per skipped run, at most {LIMIT_BACKOFF.max_s:g}s)")


def with_idle_sensing(rows: list[dict], idle: IdleSensing | None) -> list[dict]:
    """One job's explanation ``rows`` with the idle tick's evaluation of each source where that is newer than the
    recorded one: NO_NEW_DATA at the idle tick, and the recorded one's note (why it was skipped, e.g. "J1 in
    progress", or a sensing warning) gone from ``row_state`` and the job's ``verdict``. True because an idle
    tick sensed each of its sources with no new data, no error and no note; a tick per process and a loop leave
    the same liveness file, so both tell the same. A recorded error is kept: a recovery is never idle (the
    tick that senses a failing source again is recorded). ``last_evaluation_run_id`` still names the latest
    recorded evaluation."""
    fresh = [_with_idle_sensing(row, idle) for row in rows]
    verdict = rows[0]["verdict"] if rows else None
    for before, after in zip(rows, fresh):
        detail = before.get("last_outcome_detail")
        if after is not before and detail and verdict:
            label = f"{before['sensor_source']}:{before['sensor_id']}"
            verdict = verdict.replace(f"{label} (warning: {detail})", label)
    return [{**row, "verdict": verdict} if row.get("verdict") != verdict else row for row in fresh]


def _with_idle_sensing(row: dict, idle: IdleSensing | None) -> dict:
    recorded = row.get("last_evaluated_at")
    if (idle is None or row.get("source_key") not in idle.source_keys
            or row.get("last_outcome") == Outcome.ERROR.value or (recorded is not None and recorded >= idle.sensed_at)):
        return row
    fresh = {**row, "last_evaluated_at": idle.sensed_at, "last_outcome": Outcome.NO_NEW_DATA.value}
    detail = row.get("last_outcome_detail")
    if detail:
        state = row.get("row_state")
        fresh.update(last_outcome_detail=None, sensing_warning=None,
                     row_state=state.replace(f" (warning: {detail})", "") if isinstance(state, str) else state)
    return fresh


# -- job-level operator events (pause, resume, complete, retry) ---------------------------------------

def record_job_event(app: App, job_id: str, kind: EventType, *, by: str | None = None, via: str = "cli",
                     job_run_id: str | None = None, message: str | None = None, reason: str | None = None) -> Event:
    """Append one operator event of ``job_id`` after checking the job is in the control table.

    The payload names who did it, through what (``cli`` or ``ui``) and why if told: the audit trail.
    """
    app.require_config()
    if not app.store.control_rows(job_id):
        raise unknown_job(job_id)
    audit = {"by": by or local_operator(), "via": via, **({"reason": reason} if reason else {})}
    event = Event(event_type=kind, run_id=kind.value.lower(), snapshot_ts=utcnow(), trigger_job_id=job_id,
                  job_run_id=job_run_id, message=message, payload=json.dumps(audit, sort_keys=True))
    app.store.append_events([event])
    return event


def ask_retry(app: App, job_id: str, *, by: str | None = None, via: str = "cli", reason: str | None = None) -> Event:
    """Ask the next tick to re-run failed job ``job_id`` over the data its failed run had, with a new
    token (see heartbeat_retry_asks). Only a FAILED or REFUSED job that Heartbeat triggered can be retried;
    any other job is refused with nothing recorded. Asking twice before the tick still makes one retry."""
    app.require_config()
    rows = app.store.control_rows(job_id)
    if not rows:
        raise unknown_job(job_id)
    failed = [r for r in app.store.jobs_with_status(*BLOCKED_STATUSES) if r.trigger_job_id == job_id]
    if not failed:
        status = ", ".join(sorted({str(r["status"] or "no status yet") for r in rows}))
        raise InvalidInputError(f"job {job_id} has not failed (status: {status}); only a FAILED or REFUSED job "
                                "can be retried")
    if failed[0].base_idempotency_token is None:
        raise InvalidInputError(f"job {job_id} failed without a run Heartbeat triggered, so there is no run to "
                                "repeat; use `complete --job-id` once it ran, or `reset`")
    return record_job_event(app, job_id, EventType.RETRY_ASKED, by=by, via=via, reason=reason,
                            message="retry asked; the next tick re-runs the failed request with a new token")


def ask_trigger(app: App, job_id: str, *, by: str | None = None, via: str = "cli",
                reason: str | None = None) -> Event:
    """Ask the next tick to run ``job_id`` now, consuming whatever it has pending or nothing (see
    heartbeat_trigger_asks). Refused, with nothing recorded, for a job that is running, failed (that
    is `retry`) or runs per event-time window. Asking twice before the tick still makes one run."""
    app.require_config()
    rows = app.store.control_rows(job_id)
    if not rows:
        raise unknown_job(job_id)
    statuses = {r["status"] for r in rows}
    if JobStatus.IN_PROGRESS.value in statuses:
        runs = sorted({str(r["job_run_id"]) for r in rows if r["job_run_id"]})
        raise InvalidInputError(f"job {job_id} is running ({', '.join(runs) or 'run requested'}); "
                                "ask again once it has ended")
    if JobStatus.FAILED.value in statuses:
        raise InvalidInputError(f"job {job_id} has failed: `retry --job-id {job_id}` re-runs it over the data "
                                "its failed run had")
    if JobStatus.REFUSED.value in statuses:
        raise InvalidInputError(f"the jobs service refused job {job_id}'s last run: once the cause is fixed, "
                                f"`retry --job-id {job_id}` runs it over the data that run had")
    if job_id in load_run_policies(app.settings.run_policy_file).windows:
        raise InvalidInputError(f"job {job_id} runs once per final event-time window (its run policy); "
                                "it cannot be run by hand")
    return record_job_event(app, job_id, EventType.TRIGGER_ASKED, by=by, via=via, reason=reason,
                            message="manual run asked; the next tick requests it")


@dataclass(frozen=True)
class ResetDone:
    plan: ResetPlan
    #: the run of the job that was going when it was reset with ``force``: cancelled before the reset
    running_run: str | None


class JobRunningError(ConflictError):
    """``reset`` of a job whose run is still going, without ``force``: nothing was recorded."""


def reset_job(app: App, job_id: str, since: datetime | None, reason: str, *, by: str | None = None,
              force: bool = False) -> ResetDone:
    """Plan and record a reset of ``job_id``; the caller holds the tick lease. The tables are brought up to date
    first where this process has the dbt project; without it (the App) they are as the last tick left them,
    which is current too: every tick refreshes them under the lease the caller now holds.

    Invariant: a reset never leaves a run unwatched. The reset takes the job's rows out of IN_PROGRESS, so
    nothing would reconcile a run still going, and a later tick could start a second run beside it: such a
    reset is refused (JobRunningError, nothing recorded) unless ``force``, which cancels the run through the
    jobs backend first (refused too when the backend cannot cancel runs)."""
    app.require_config()
    app.ensure_views()
    if app.dbt.available:
        app.control.refresh()
    running = [r["job_run_id"] for r in app.store.control_rows(job_id) if r["status"] == JobStatus.IN_PROGRESS]
    run = next((r for r in running if r), None) if running else None
    if running and not force:
        raise JobRunningError(f"job {job_id} is running{f' (run {run})' if run else ''}: a reset now would leave "
                              "that run unwatched and let a later tick start a second one; wait for it to end, "
                              "or reset with --force to cancel it first")
    plan = plan_reset(app.store, job_id, since, reason)
    if by is not None:
        plan = replace(plan, by=by)
    if running and run is not None:
        backend = app.jobs_backend()
        if not backend.can_cancel:
            raise JobRunningError(f"job {job_id} is running (run {run}) and the {backend.name} jobs backend cannot "
                                  "cancel runs: wait for it to end, then reset")
        backend.cancel_run(job_id, run)
    app.store.append_events(plan.events())
    return ResetDone(plan, run)


# -- reset -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CursorMove:
    source_key: str
    sensor_source: str
    sensor_id: str
    cursor_from: str | None
    cursor_to: str

    @property
    def moved(self) -> bool:
        return self.cursor_from != self.cursor_to


@dataclass(frozen=True)
class ResetPlan:
    """What ``reset`` records: a RESET of the job and one RESET per source moving its cursor back."""

    job_id: str
    since: datetime | None
    #: the point the cursors go back to: ``since``, or earlier when the job had not consumed older data
    as_of: datetime | None
    moves: list[CursorMove]
    #: other active jobs reading the sources moved back: they see the replayed data as new too
    shared_with: list[str]
    reason: str
    by: str = field(default_factory=lambda: local_operator())

    def events(self) -> list[Event]:
        now = utcnow()
        audit = {"by": self.by, "job": self.job_id, "since": _iso(self.since), "as_of": _iso(self.as_of)}
        sources = [
            Event(event_type=EventType.RESET, run_id="reset", snapshot_ts=now, source_key=m.source_key,
                  sensor_source=m.sensor_source, sensor_id=m.sensor_id, cursor_from=m.cursor_from,
                  cursor_to=m.cursor_to, message=self.reason, payload=json.dumps(audit, sort_keys=True))
            for m in self.moves
        ]
        job = Event(event_type=EventType.RESET, run_id="reset", snapshot_ts=now, trigger_job_id=self.job_id,
                    message=self.reason, payload=json.dumps({**audit, "sources": [m.source_key for m in self.moves],
                                                             "also_retriggers": self.shared_with}, sort_keys=True))
        return [*sources, job]


def plan_reset(store: TableStore, job_id: str, since: datetime | None, reason: str) -> ResetPlan:
    """Where each source of the job goes back to: the cursor in force at ``since`` (or the beginning)."""
    rows = store.control_rows(job_id)
    if not rows:
        raise unknown_job(job_id)
    as_of = since
    waiting = [r["status_change_timestamp"] for r in rows if r["status"] == JobStatus.NEW_EVENT_AVAILABLE]
    if since is not None and waiting and min(waiting) <= since:
        as_of = min(waiting) - timedelta(microseconds=1)  # never skip data the job has not consumed
    sources = {r["source_key"]: r for r in rows}
    moves = [CursorMove(key, row["sensor_source"], row["sensor_id"], _cursor_at(store, key, None),
                        _cursor_at(store, key, as_of) if as_of is not None else BEGINNING_CURSOR)
             for key, row in sorted(sources.items())]
    moved = [m.source_key for m in moves if m.moved]
    shared = store.read(CONTROL, Cond("is_active", True), Cond("source_key", moved, "in"),
                        Cond("trigger_job_id", job_id, "<>"), columns=["trigger_job_id"]) if moved else []
    return ResetPlan(job_id, since, as_of, moves, sorted({r["trigger_job_id"] for r in shared}), reason)


@overload
def _cursor_at(store: TableStore, source_key: str, as_of: datetime) -> str: ...
@overload
def _cursor_at(store: TableStore, source_key: str, as_of: None) -> str | None: ...
def _cursor_at(store: TableStore, source_key: str, as_of: datetime | None) -> str | None:
    """The cursor in force at ``as_of`` (None: the current one); the beginning if there was none yet."""
    when = [] if as_of is None else [Cond("valid_from", as_of.astimezone(timezone.utc).replace(tzinfo=None), "<=")]
    found = store.read(CURSOR_HISTORY_VIEW, Cond("source_key", source_key), *when, columns=["cursor_to"],
                       order_by=["valid_from DESC", "event_id DESC"], limit=1)
    if found:
        return found[0]["cursor_to"]
    return None if as_of is None else BEGINNING_CURSOR


def unknown_job(job_id: str) -> NotFoundError:
    """The error for a job id the control table does not have (CLI exit code and page 404 follow its kind)."""
    return NotFoundError(f"job {shown_id(job_id)!r} is not in the control table")


#: the longest an id given by a user is repeated in an answer or error (a longer one ends in "…")
SHOWN_ID_CHARS = 120


def shown_id(text: str) -> str:
    """An id as given, to repeat in a message: at most SHOWN_ID_CHARS characters."""
    return text if len(text) <= SHOWN_ID_CHARS else text[:SHOWN_ID_CHARS - 1] + "…"


def parse_since(text: str) -> datetime:
    """An ISO 8601 date or timestamp; without a zone it is UTC."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise InvalidInputError(f"--since {text!r} is not an ISO 8601 date or timestamp "
                             "(e.g. 2026-05-01 or 2026-05-01T08:30:00Z)") from exc
    since = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if since > utcnow():
        raise InvalidInputError(f"--since {text!r} is in the future: there is nothing to re-process after it "
                             "(give a past date, or leave --since out to re-process from the beginning)")
    return since


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def with_sensing_errors(store: TableStore, rows: list[dict]) -> list[dict]:
    """Control rows with ``sensing_error`` (the row's source failed its latest sensing) and, where the row has
    no other error, ``last_error`` saying so: a failing source is visible in ``status``, not only in ``runs``."""
    failing = {(r["trigger_job_id"], r["source_key"]): r["sensing_error"] for r in store.sensing_failures()}
    for row in rows:
        error = failing.get((row["trigger_job_id"], row["source_key"]))
        row["sensing_error"] = error
        if error and not row.get("last_error"):
            row["last_error"] = f"sensing failed: {error}"
    return rows


# -- runs ------------------------------------------------------------------------------------

def recent_runs(store: TableStore, limit: int) -> list[dict]:
    """The latest runs, newest first (finished ticks, FAILED ones and INCOMPLETE ones)."""
    return store.read(RUN_OVERVIEW_VIEW, order_by=["snapshot_ts DESC"], limit=limit)


def job_runs(store: TableStore, *conditions: Cond, limit: int | None = None) -> list[dict]:
    """Job runs Heartbeat requested (heartbeat_job_runs), newest request first, with JOB_RUN_FIELDS and
    ``tick_run_id`` (the tick that requested the run)."""
    rows = store.read(JOB_RUNS_VIEW, *conditions, order_by=["requested_at DESC"], limit=limit)
    return [{**{name: row[name] for name in JOB_RUN_FIELDS}, "output_tail": _lines(row["output_tail"]),
             "tick_run_id": row["tick_run_id"]} for row in rows]


def _lines(recorded: str | None) -> list[str] | None:
    """An output tail as recorded with a failed run (a JSON array of lines) as a list, or None."""
    try:
        lines = json.loads(recorded) if recorded else None
    except ValueError:
        return None
    return [str(line) for line in lines] if isinstance(lines, list) else None


def latest_job_runs(store: TableStore, job_id: str) -> list[dict]:
    """The latest EXPLAIN_RUNS runs of ``job_id`` (`explain --json`), newest first."""
    return job_runs(store, Cond("trigger_job_id", job_id), limit=EXPLAIN_RUNS)


def with_job_runs(store: TableStore, ticks: list[dict]) -> list[dict]:
    """``ticks`` (rows of heartbeat_run_overview), each with ``job_runs``: the job runs it requested, with
    their durations once they ended (one read for all the ticks)."""
    ids = [tick["run_id"] for tick in ticks]
    by_tick: dict[str, list[dict]] = {run_id: [] for run_id in ids}
    for run in job_runs(store, Cond("tick_run_id", ids, "in")) if ids else []:
        by_tick[run.pop("tick_run_id")].append(run)
    return [{**tick, "job_runs": by_tick[tick["run_id"]]} for tick in ticks]


def control_refreshes(run: dict) -> list[dict[str, str]]:
    """The control table refreshes a tick's summary row (of heartbeat_run_overview) records, in order: each one's
    path, and a build's reason and detail. Empty for an idle streak, an INCOMPLETE tick, a tick that raised
    before its first refresh, or a row an older runner wrote."""
    try:
        figures = json.loads(run.get("stage_timings") or "{}")
    except ValueError:
        return []
    found = figures.get(CONTROL_REFRESHES) if isinstance(figures, dict) else None
    return [dict(r) for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def run_details(store: TableStore, run_id: str) -> tuple[dict, list[dict]]:
    """One run and its per-source rows of the run report."""
    run = store.read(RUN_OVERVIEW_VIEW, Cond("run_id", run_id))
    if not run:
        raise NotFoundError(f"run {run_id!r} not found (see `runs` for recent run ids)")
    report = store.read(RUN_REPORT_ALL_VIEW, Cond("run_id", run_id), order_by=["outcome", "source_key"])
    return run[0], report


# -- safe config changes ---------------------------------------------------------------------

def check_removals(active: Iterable[ConfigKey], new: Iterable[ConfigKey], max_share: float) -> list[ConfigKey]:
    """The active rows a new config would retire; ConfigError when more than ``max_share`` of them."""
    active, new = set(active), set(new)
    retiring = sorted(active - new)
    if active and len(retiring) / len(active) > max_share:
        names = ", ".join(f"{s}:{i} -> job {j}" for s, i, j in retiring[:5])
        more = f" and {len(retiring) - 5} more" if len(retiring) > 5 else ""
        raise ConfigError([
            f"this config would retire {len(retiring)} of {len(active)} active rows "
            f"({len(retiring) / len(active):.0%}, more than the {max_share:.0%} allowed): {names}{more}. "
            "An empty or truncated file? If the removals are intended, run `seed --allow-removals` "
            "(or raise HEARTBEAT_MAX_REMOVAL_SHARE)."
        ])
    return retiring


def late_data(store: TableStore, policy_file: Path | None, job_id: str) -> list[dict]:
    """Rows that arrived for already finalized event-time windows of ``job_id``, per source and window."""
    from heartbeat_runner.core.windows import iso
    from heartbeat_runner.runner.sequences import Sequences

    found = Sequences(store, {}, load_run_policies(policy_file).windows).late_data(job_id)
    return [{"source_key": r.source_key, "window_start": iso(r.window_start_s), "rows": r.rows} for r in found]


def retry_outlook(store: TableStore, policies: RetryPolicies, job_id: str) -> str | None:
    """For a FAILED job with an automatic retry policy: when (or whether) it will be retried."""
    policy = policies.for_job(job_id)
    failed = [r for r in store.jobs_with_status(JobStatus.FAILED) if r.trigger_job_id == job_id]
    if not policy.enabled or not failed or failed[0].job_end_timestamp is None:
        return None
    return policy.decide(failed[0].consecutive_failures, failed[0].job_end_timestamp, utcnow()).reason


def pending_ask(store: TableStore, job_id: str) -> str | None:
    """An operator's retry or manual run of ``job_id`` waiting for the next tick, in one sentence."""
    retry = store.retry_asks().get(job_id)
    if retry is not None:
        return f"retry asked by {retry.by} at {retry.asked_ts:%Y-%m-%d %H:%M:%S}: the next tick re-runs it"
    run = store.trigger_asks().get(job_id)
    if run is not None:
        return f"manual run asked by {run.by} at {run.asked_ts:%Y-%m-%d %H:%M:%S}: the next tick requests it"
    return None
