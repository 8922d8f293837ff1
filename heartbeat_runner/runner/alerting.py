"""The alert monitor: after each tick, fold its result into hot state, raise and resolve alerts, hand them to delivery.

Crash-safe like triggering: ALERT_RAISED / ALERT_RESOLVED are appended *before* any message goes
out (the payload names the destinations); ALERT_SENT is appended after a destination accepted it,
on a later tick (the outbox's thread only sends). A runner that starts reads the alert events once
and re-queues every notice not yet recorded as sent: a kill between a send and its record sends it
again, once, with the same key (and the alert's current words). Event ids are deterministic, so a
replayed record is one event.

An open alert whose words follow its cause (an overdue job: ``Alert.live_words``) is re-worded when the
cause moves on: ALERT_UPDATED records the new summary (``heartbeat_alerts``, ``alerts``, the page show
it); nothing is sent for it, so a cause that changes never pages anyone again.

Cost: the tick's own result is the input; the control table is read when the monitor starts (and
every ``REFRESH_S`` for config changes), the FAILED events of a tick only when a job failed. A tick
with nothing to raise, resolve or record appends nothing; it only rewrites the small liveness file
that ``check`` reads (``<lakehouse>/locks/heartbeat.alive``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.files import replace_whole
from heartbeat_runner.core.records import (
    BLOCKED_STATUSES,
    Event,
    EventType,
    JobStatus,
    Outcome,
    alert_event_id,
    as_utc,
    utcnow,
)
from heartbeat_runner.jobs.base import JobsBackend
from heartbeat_runner.lakehouse.control_table import ControlTable
from heartbeat_runner.lakehouse.store import EVENTS, RUNS, Cond, TableStore
from heartbeat_runner.policies.alerts import (
    Alert,
    AlertKind,
    AlertPolicies,
    Deadline,
    HotState,
    JobFacts,
    Overdue,
    Severity,
    SourceFacts,
    evaluate,
    overdue_jobs,
)
from heartbeat_runner.runner.alert_delivery import Outbox, alert_outbox
from heartbeat_runner.runner.observability import count_open_alerts
from heartbeat_runner.runner.tick_result import TickObserver, TickResult
from heartbeat_runner.senders.send import AlertAction, Attempt, Notice

log = logging.getLogger(__name__)

ALERT_EVENT_TYPES = [EventType.ALERT_RAISED.value, EventType.ALERT_RESOLVED.value, EventType.ALERT_UPDATED.value,
                     EventType.ALERT_SENT.value, EventType.ALERT_DELIVERY_FAILED.value]
#: seconds between re-reads of which jobs read which sources (a seed while the loop runs)
REFRESH_S = 600.0
#: seconds ``close`` waits for messages still queued (a single ``run``)
CLOSE_FLUSH_S = 10.0
ALERTS_VIEW = "heartbeat_alerts"


def liveness_path(lakehouse_dir: Path) -> Path:
    return lakehouse_dir / "locks" / "heartbeat.alive"


def _deadline_text(deadline: Deadline) -> str:
    return f"{deadline.by.isoformat()} {deadline.zone} after {deadline.after.isoformat()}"


def deadlines_since(policies: AlertPolicies, job_ids: list[str], recorded: dict[str, dict[str, str]],
                    now: datetime) -> dict[str, dict[str, str]]:
    """Each job's deadline with since when it is configured: as recorded when it is the same deadline, else ``now``
    (a deadline added or changed is first checked at its first occurrence after it was seen)."""
    found = {}
    for job_id in job_ids:
        deadline = policies.for_job(job_id).deadline
        if deadline is None:
            continue
        text, before = _deadline_text(deadline), recorded.get(job_id)
        found[job_id] = before if before is not None and before["deadline"] == text else {
            "deadline": text, "since": now.isoformat()}
    return found


def _apply_deadlines(state: HotState, deadlines: dict[str, dict[str, str]]) -> None:
    for job_id, record in deadlines.items():
        state.job(job_id).deadline_since = as_utc(datetime.fromisoformat(record["since"]))


@dataclass
class OpenAlert:
    """An alert raised and not resolved: its key, what it said, where it goes."""

    identity: str
    key: str
    notice: Notice
    destinations: tuple[str, ...]


@dataclass
class Changes:
    """What one evaluation changed: alerts raised, re-worded (recorded, not sent) and resolved."""

    raised: list[OpenAlert] = field(default_factory=list)
    updated: list[OpenAlert] = field(default_factory=list)
    resolved: list[OpenAlert] = field(default_factory=list)


@dataclass
class AlertMonitor(TickObserver):
    """Evaluates the ``alerts:`` policies after each tick; records and queues what changed."""

    store: TableStore
    control: ControlTable
    backend: JobsBackend
    policies: AlertPolicies
    lakehouse_dir: Path
    outbox: Outbox[Notice] | None = None
    #: the status page's address (HEARTBEAT_UI_URL): a job alert links to the job's view there
    ui_url: str | None = None
    state: HotState = field(default_factory=HotState)
    open: dict[str, OpenAlert] = field(default_factory=dict)  # by identity
    _loaded_at: float | None = None
    _erring: set[str] = field(default_factory=set)  # jobs whose last tick had a trigger error
    _held: set[str] = field(default_factory=set)  # jobs a trigger hold kept back at the last tick
    _last_tick: float | None = None
    #: the interval between this process's last two polls (a tick a wake-up started measures none)
    _interval: float | None = None

    def __post_init__(self) -> None:
        if self.outbox is None and self.policies.enabled:
            self.outbox = alert_outbox(self.policies.destinations,
                                       group_interval_s=self.policies.group_interval.total_seconds())

    # -- the hook --------------------------------------------------------------------------------

    def observe(self, result: TickResult) -> None:
        """After a tick: liveness, then (with alert policies) fold, evaluate, record, queue. Never raises."""
        self._write_liveness(result)
        try:
            self._record_not_ticking(result.run_id)
        except Exception:  # noqa: BLE001 - recording must never fail the tick; it tries again next tick
            log.exception("recording the runner-not-ticking alert failed")
        if not self.policies.enabled:
            return
        try:
            self._observe(result)
        except Exception:  # noqa: BLE001 - alerting must never fail the tick; it tries again next tick
            log.exception("evaluating alerts failed")

    def close(self) -> None:
        """Send what is queued (bounded), record it, stop the outbox."""
        if self.outbox is None:
            return
        try:
            self.outbox.close(CLOSE_FLUSH_S)
            self._append(self._attempt_events(self.outbox.drain(), "close"))
        except Exception:  # noqa: BLE001 - closing must not hide the command's own outcome
            log.exception("recording the last alert deliveries failed")

    def _observe(self, result: TickResult) -> None:
        if self._loaded_at is None or time.monotonic() - self._loaded_at >= REFRESH_S:
            self._load(first=self._loaded_at is None, now=result.snapshot_ts)
        self.fold(result)
        assert self.outbox is not None
        attempts = self.outbox.drain()
        before = dict(self.open)
        changes = self._changes(evaluate(self.policies, self.state, utcnow()))
        raised, resolved = changes.raised, changes.resolved
        events = self._attempt_events(attempts, result.run_id)
        events += [self._raised_event(a, result.run_id) for a in raised]
        events += [self._updated_event(a, result.run_id) for a in changes.updated]
        events += [self._resolved_event(a, result.run_id) for a in resolved]
        try:
            self._append(events)  # recorded first: then sent
        except Exception:
            self.open = before  # not recorded: the next tick raises (and resolves) them again
            self.outbox.requeue_results(attempts)
            raise
        crash_point(FaultPoint.AFTER_ALERT_RECORDED)
        count_open_alerts(alert.notice.kind for alert in self.open.values())
        self._submit(raised + resolved)

    def _submit(self, alerts: list[OpenAlert]) -> None:
        """Queue each alert's notice for its destinations, all of a destination's in one go (one digest)."""
        by_destination: dict[str, list[Notice]] = defaultdict(list)
        for alert in alerts:
            for destination in alert.destinations:
                by_destination[destination].append(alert.notice)
        assert self.outbox is not None
        for destination, notices in by_destination.items():
            self.outbox.submit(destination, notices)

    # -- hot state ------------------------------------------------------------------------------

    def fold(self, result: TickResult) -> None:
        """Move the hot state forward by what one tick saw and did."""
        now = result.snapshot_ts
        for sensed in result.sensed:
            facts = self.state.source(sensed.target.source_key)
            if facts.watched_since is None:  # first seen: which jobs it feeds, and freshness counts from now
                facts.jobs.update(j for j in sensed.trigger_job_ids.split(",") if j)
                facts.watched_since = now
            outcome = sensed.outcome
            if outcome is Outcome.ERROR:
                facts.failing_since = facts.failing_since or now
                facts.last_error = sensed.error
                continue
            facts.failing_since = facts.last_error = None
            if outcome is Outcome.NEW_DATA:
                facts.last_new_data = now
        erring = {p.job_id: p.message for p in result.trigger_errors}
        for job_id in self._erring - set(erring):
            job = self.state.job(job_id)
            job.trigger_error_since = job.trigger_error = None
        self._erring = set(erring)
        for job_id, message in erring.items():
            job = self.state.job(job_id)
            job.trigger_error_since, job.trigger_error = job.trigger_error_since or now, message
        self._fold_holds(result)
        for triggered in result.triggered:
            job = self.state.job(triggered.job_id)
            job.running_since, job.run_id = now, triggered.run_id
        for job_id in result.completed:  # when the run ended (the table's job_end_timestamp), else now
            job = self.state.job(job_id)
            job.last_completed = result.ended_at.get(job_id, now)
            job.running_since, job.failed_run, job.failed_at = None, None, None
        if result.failed:
            self._fold_failures(result)

    def _fold_holds(self, result: TickResult) -> None:
        """Which jobs a trigger hold kept back at this tick, and by what; the others are held by nothing."""
        held = {p.job_id: p.message for p in result.held}
        for job_id in self._held - set(held):
            self.state.job(job_id).held = None
        self._held = set(held)
        for job_id, line in held.items():
            self.state.job(job_id).held = line

    def _fold_failures(self, result: TickResult) -> None:
        """The failed and refused runs of a tick: their error (the FAILED or REFUSED event) and output link (the
        jobs backend)."""
        events = {e["trigger_job_id"]: e for e in self.store.read(
            EVENTS, Cond("run_id", result.run_id),
            Cond("event_type", [EventType.FAILED.value, EventType.REFUSED.value], "in"),
            columns=["trigger_job_id", "job_run_id", "message"])}
        for job_id in result.failed:
            job, event = self.state.job(job_id), events.get(job_id, {})
            job.refused = job_id in result.refused
            job.failed_run = event.get("job_run_id") or job.run_id or "?"
            job.failed_at, job.running_since = result.ended_at.get(job_id, result.snapshot_ts), None
            job.failure, job.output_link = event.get("message"), self._output_link(job_id, job.failed_run)

    def _output_link(self, job_id: str, run_id: str) -> str | None:
        """The job's view on the status page when HEARTBEAT_UI_URL is set (its reason, output and runs),
        else the run's page at its jobs service (None for a local run)."""
        if self.ui_url:
            return job_view_link(self.ui_url, job_id)
        try:
            output = self.backend.run_output(job_id, run_id)
        except Exception:  # noqa: BLE001 - a link is a nicety; the alert goes without it
            return None
        return output.url if output else None

    def _load(self, *, first: bool, now: datetime) -> None:
        """Which jobs read which sources (hard ones too) and, the first time, the times and open alerts."""
        rows = self.store.control_rows()
        fold_control_rows(self.state, rows, times=first)
        self._note_deadlines(now)
        if first:
            self._load_failing_sources()
            self._load_trigger_errors(rows)
            self._load_alerts()
        self._loaded_at = time.monotonic()

    def _note_deadlines(self, now: datetime) -> None:
        """Since when each job's deadline is configured, kept in the lakehouse (heartbeat_deadlines) across
        runner processes and machines (a tick per process, a new job cluster per scheduled run); written
        only when a deadline was added, changed or removed. A deadline first seen counts from ``now``, the start
        of the tick that saw it (however long that tick then took)."""
        found = deadlines_since(self.policies, sorted(self.state.jobs), self.store.deadlines_seen(), now)
        _apply_deadlines(self.state, found)
        self.store.sync_deadlines(found)

    def _load_failing_sources(self) -> None:
        """Since when each failing source fails, from the run report: a runner that starts (a tick per process)
        counts ``sensing_error_after`` from the same instant as a loop that saw the first failure."""
        fold_sensing_failures(self.state, self.store.sensing_failures())

    def _load_trigger_errors(self, rows: list[dict]) -> None:
        """Since when each job's trigger call is refused (its first TRIGGER_ERROR after its latest run or reset):
        a runner that starts (a tick per process) counts ``trigger_error_after`` from the same instant as a loop.
        Reads the events of those jobs only, and only when there are any."""
        erring = {r["trigger_job_id"]: r["last_error"] for r in rows
                  if r.get("status") == JobStatus.NEW_EVENT_AVAILABLE.value and r.get("last_error")}
        if not erring:
            return
        ends = [EventType.TRIGGERED.value, EventType.COMPLETED.value, EventType.FAILED.value,
                EventType.REFUSED.value, EventType.RESET.value]
        events = self.store.read(EVENTS, Cond("trigger_job_id", sorted(erring), "in"),
                                 Cond("event_type", [EventType.TRIGGER_ERROR.value, *ends], "in"),
                                 columns=["trigger_job_id", "event_type", "event_ts"])
        for job_id, message in erring.items():
            mine = [(as_utc(e["event_ts"]), e["event_type"]) for e in events if e["trigger_job_id"] == job_id]
            after = max((ts for ts, kind in mine if kind in ends), default=None)
            refused = [ts for ts, kind in mine if kind == EventType.TRIGGER_ERROR.value and (after is None or ts > after)]
            if refused:
                job = self.state.job(job_id)
                job.trigger_error_since, job.trigger_error = min(refused), message
                self._erring.add(job_id)

    def _load_alerts(self) -> None:
        """Open alerts from the event log, and every notice recorded but not yet sent: queued again."""
        rows = self.store.read(EVENTS, Cond("event_type", ALERT_EVENT_TYPES, "in"),
                               columns=["event_type", "event_ts", "idempotency_token", "payload"],
                               order_by=["event_ts"])
        sent: set[tuple[str, str, str]] = set()
        recorded: list[tuple[str, OpenAlert, AlertAction]] = []
        words: dict[str, dict] = {}  # alert key -> the payload of its latest ALERT_UPDATED
        for row in rows:
            payload = json.loads(row["payload"] or "{}")
            kind = EventType(row["event_type"])
            if kind is EventType.ALERT_SENT:
                sent.update((k, payload["action"], payload["destination"]) for k in payload.get("keys", []))
            elif kind is EventType.ALERT_UPDATED:
                words[payload["key"]] = payload
            elif kind in (EventType.ALERT_RAISED, EventType.ALERT_RESOLVED):
                action = AlertAction.RAISE if kind is EventType.ALERT_RAISED else AlertAction.RESOLVE
                recorded.append((payload["identity"], _open_alert(payload, action), action))
        unsent = []
        for identity, alert, action in recorded:
            if action is AlertAction.RAISE and alert.key in words:  # its current words, not those it was raised with
                alert = _reworded(alert, words[alert.key])
            if action is AlertAction.RAISE:
                self.open[identity] = alert
            else:
                self.open.pop(identity, None)
            missing = tuple(d for d in alert.destinations if (alert.key, action.value, d) not in sent)
            if missing:
                unsent.append(replace(alert, destinations=missing))
        self._submit(unsent)

    # -- raising and resolving ------------------------------------------------------------------

    def _changes(self, alerts: list[Alert]) -> Changes:
        """The alerts that began (keyed now), the open ones re-worded (their cause moved on: ``live_words``) and
        the open ones whose condition cleared. ``self.open`` gets new records, never changed ones (a caller
        that cannot record the changes puts its copy back)."""
        now = {a.identity: a for a in alerts}
        destinations = tuple(d.name for d in self.policies.destinations)
        changes = Changes()
        for identity, alert in now.items():
            known = self.open.get(identity)
            if known is None:
                self.open[identity] = OpenAlert(identity, alert.key, _notice(alert, AlertAction.RAISE), destinations)
                changes.raised.append(self.open[identity])
            elif alert.live_words and (alert.summary, alert.cause) != (known.notice.summary, known.notice.cause):
                self.open[identity] = replace(known, notice=replace(known.notice, summary=alert.summary,
                                                                    cause=alert.cause))
                changes.updated.append(self.open[identity])
        for identity in [i for i in self.open if i not in now]:
            gone = self.open.pop(identity)
            changes.resolved.append(OpenAlert(identity, gone.key, replace(gone.notice, action=AlertAction.RESOLVE),
                                              gone.destinations))
        return changes

    def _raised_event(self, alert: OpenAlert, run_id: str) -> Event:
        return self._event(EventType.ALERT_RAISED, alert, run_id)

    def _resolved_event(self, alert: OpenAlert, run_id: str) -> Event:
        return self._event(EventType.ALERT_RESOLVED, alert, run_id)

    def _updated_event(self, alert: OpenAlert, run_id: str) -> Event:
        """The alert's new words; at most one per alert and tick (a replayed tick records it once)."""
        return self._event(EventType.ALERT_UPDATED, alert, run_id, run_id)

    def _event(self, kind: EventType, alert: OpenAlert, run_id: str, *parts: str) -> Event:
        notice = alert.notice
        payload = {**notice.as_dict(), "identity": alert.identity, "destinations": list(alert.destinations)}
        return Event(event_type=kind, run_id=run_id, snapshot_ts=utcnow(),
                     event_id=alert_event_id(kind, alert.key, *parts), idempotency_token=alert.key,
                     message=notice.summary, payload=json.dumps(payload, sort_keys=True))

    def _attempt_events(self, attempts: list[Attempt[Notice]], run_id: str) -> list[Event]:
        """ALERT_SENT for each accepted message, ALERT_DELIVERY_FAILED for each refused one (retried)."""
        events: list[Event] = []
        for attempt in attempts:
            by_action: dict[AlertAction, list[str]] = defaultdict(list)
            for notice in attempt.notices:
                by_action[notice.action].append(notice.key)
            for action, keys in by_action.items():
                kind = EventType.ALERT_SENT if attempt.ok else EventType.ALERT_DELIVERY_FAILED
                parts = (action.value, attempt.destination) + (() if attempt.ok else (str(attempt.attempt),))
                payload = {"keys": keys, "action": action.value, "destination": attempt.destination,
                           "attempt": attempt.attempt}
                events.extend(Event(event_type=kind, run_id=run_id, snapshot_ts=utcnow(),
                                    event_id=alert_event_id(kind, key, *parts), idempotency_token=key,
                                    message=attempt.error, payload=json.dumps(payload, sort_keys=True))
                              for key in keys)
        return events

    def _append(self, events: list[Event]) -> None:
        """One commit; alert events change nothing the control table derives, so it stays current."""
        self.control.append_beside(events)

    def _record_not_ticking(self, run_id: str) -> None:
        """The "runner not ticking" alert ``check`` raised (kept in a file while no runner ticks): this runner
        ticks, so it records the alert in the lakehouse, raised at its ``since`` and resolved now, with the
        destinations that accepted its raise, and sends the resolve like any other (its outbox records the
        delivery); from then on ``check`` only forgets the file."""
        path = not_ticking_path(self.lakehouse_dir)
        state = _not_ticking_state(path)
        if not state or state.get("recorded"):
            return
        notice = Notice(**{**state["notice"], "jobs": tuple(state["notice"]["jobs"]), "action": AlertAction.RAISE})
        alert = OpenAlert(f"{notice.kind}|{notice.subject}|", notice.key, notice,
                          tuple(d.name for d in self.policies.destinations))
        delivered = [m.split(":")[0] for m in state.get("sent", []) if m.endswith(":raise")]
        attempts = [Attempt(destination, (notice,), attempt=1) for destination in delivered]
        resolved = OpenAlert(alert.identity, alert.key, replace(notice, action=AlertAction.RESOLVE),
                             alert.destinations)
        self._append([self._raised_event(alert, run_id), *self._attempt_events(attempts, run_id),
                      self._resolved_event(resolved, run_id)])
        state["recorded"] = True
        replace_whole(path, json.dumps(state))
        if self.outbox is not None and self._loaded_at is not None:  # a first load queues it from the events
            self._submit([resolved])

    # -- liveness --------------------------------------------------------------------------------

    def _write_liveness(self, result: TickResult) -> None:
        """When this runner last ticked and how far apart its ticks are (for ``check``); after an idle tick,
        also what it sensed (``idle_sensing``: idle ticks record nothing in the tables)."""
        now = time.time()
        path = liveness_path(self.lakehouse_dir)
        if result.polled:  # a tick a wake-up started comes early: the interval is the polls'
            recorded = _liveness(path) if self._last_tick is None else None  # `run` from cron: the previous process
            previous = self._last_tick if self._last_tick is not None else recorded[0] if recorded else None
            self._interval = now - previous if previous is not None else None
            self._last_tick = now
        interval = self._interval
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            idle = IdleSensing.of(result)
            replace_whole(path, json.dumps({"ticked_at": now, "interval_s": interval, "pid": os.getpid(),
                                            "host": socket.gethostname(),
                                            "idle_sensing": idle.as_json() if idle else None}))
        except OSError as exc:
            log.warning("could not write %s: %s", path, exc)


#: an interval measured across runner processes counts at most this long (a lakehouse idle for days)
MAX_INTERVAL_S = 3600.0


def job_view_link(ui_url: str, job_id: str) -> str:
    """The address of ``job_id``'s view on the status page at ``ui_url`` (the page's ``#/jobs/<id>`` route)."""
    return f"{ui_url.rstrip('/')}/#/jobs/{quote(job_id, safe='')}"


@dataclass(frozen=True)
class IdleSensing:
    """What the latest tick sensed when it was idle (nothing new, no error, no warning; the tables got no
    row of it): each of ``source_keys`` was sensed with no new data at ``sensed_at``. Where a source's
    recorded evaluation is older, this is its current one (``explain`` and the page show it)."""

    sensed_at: datetime
    source_keys: frozenset[str]

    @classmethod
    def of(cls, result: TickResult) -> IdleSensing | None:
        if not result.is_idle:
            return None
        return cls(result.snapshot_ts, frozenset(s.target.source_key for s in result.sensed))

    def as_json(self) -> dict[str, object]:
        return {"sensed_at": self.sensed_at.isoformat(), "source_keys": sorted(self.source_keys)}


def idle_sensing(lakehouse_dir: Path) -> IdleSensing | None:
    """The latest tick's idle sensing from the liveness file (None: that tick was not idle, or no file)."""
    try:
        found = json.loads(liveness_path(lakehouse_dir).read_text())["idle_sensing"]
        if found is None:
            return None
        return IdleSensing(as_utc(datetime.fromisoformat(found["sensed_at"])),
                           frozenset(str(key) for key in found["source_keys"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _liveness(path: Path) -> tuple[float, float | None] | None:
    """When the tick recorded in a liveness file ended, and the interval before it (None: no readable file)."""
    try:
        found = json.loads(path.read_text())
        interval = found.get("interval_s")
        return float(found["ticked_at"]), None if interval is None else min(float(interval), MAX_INTERVAL_S)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def fold_control_rows(state: HotState, rows: list[dict], *, times: bool) -> HotState:
    """Which jobs read which sources (and which are hard) from control rows; with ``times``, also the
    latest fetch, run start, end and failure of each (how a monitor starts, and ``explain``)."""
    for row in rows:
        job, source = state.job(row["trigger_job_id"]), state.source(row["source_key"])
        source.jobs.add(job.job_id)
        created = row.get("row_created_timestamp")
        if created is not None and (job.added_at is None or created < job.added_at):
            job.added_at = created
        if row["dependency_flag"] == "TRUE":
            job.hard_sources.add(source.source_key)
        if times:
            _seed_times(job, source, row)
    return state


def overdue_now(policies: AlertPolicies, control_rows: list[dict], job_id: str,
                seen: dict[str, dict[str, str]], sensing_failures: Iterable[dict] = (), *,
                held: str | None = None) -> Overdue | None:
    """The job's missed deadline and its cause as the control table tells it now (``explain``), or None.
    A deadline no runner has seen yet counts from now, as the runner will count it (nothing is written).
    ``sensing_failures`` (the store's): a failing source is named as failing, as the verdict does; ``held``: the
    trigger hold keeping the job back now, named as the runner's alert names it."""
    state = fold_control_rows(HotState(), control_rows, times=True)
    fold_sensing_failures(state, sensing_failures)
    if job_id in state.jobs:
        state.jobs[job_id].held = held
    now = utcnow()
    _apply_deadlines(state, deadlines_since(policies, [job_id], seen, now))
    return next((o for o in overdue_jobs(policies, state, now) if o.job_id == job_id), None)


def fold_sensing_failures(state: HotState, failures: Iterable[dict]) -> None:
    """Since when each failing source fails, and its error, from the store's ``sensing_failures`` rows."""
    for row in failures:
        source = state.source(row["source_key"])
        since = row.get("failing_since")
        if since is not None and (source.failing_since is None or as_utc(since) < source.failing_since):
            source.failing_since = as_utc(since)
        source.last_error = source.last_error or row.get("sensing_error")


def _seed_times(job: JobFacts, source: SourceFacts, row: dict) -> None:
    """Times from the control table when the monitor starts (afterwards the ticks move them)."""
    fetched = row.get("latest_event_fetched_timestamp")
    if fetched is not None and (source.last_new_data is None or fetched > source.last_new_data):
        source.last_new_data = fetched
    created = row.get("row_created_timestamp")
    if created is not None and (source.watched_since is None or created < source.watched_since):
        source.watched_since = created
    status = row.get("status")
    if status == JobStatus.IN_PROGRESS.value:
        job.running_since, job.run_id = row.get("job_start_timestamp"), row.get("job_run_id")
    elif status == JobStatus.COMPLETED.value:
        job.last_completed = row.get("job_end_timestamp")
    elif status in BLOCKED_STATUSES:
        job.refused = status == JobStatus.REFUSED.value
        job.failed_run = row.get("job_run_id") or "?"
        job.failed_at = row.get("job_end_timestamp") or row.get("status_change_timestamp")
        job.failure = row.get("last_error")


def _notice(alert: Alert, action: AlertAction) -> Notice:
    return Notice(key=alert.key, action=action, kind=alert.kind.value, subject=alert.subject, summary=alert.summary,
                  severity=alert.severity.value, since=alert.since.astimezone(timezone.utc).isoformat(),
                  jobs=alert.jobs, link=alert.link, cause=alert.cause)


def _open_alert(payload: dict, action: AlertAction) -> OpenAlert:
    notice = Notice(key=payload["key"], action=action, kind=payload["kind"], subject=payload["subject"],
                    summary=payload["summary"], severity=payload["severity"], since=payload["since"],
                    jobs=tuple(payload.get("jobs", ())), link=payload.get("link"), cause=payload.get("cause"))
    return OpenAlert(payload["identity"], notice.key, notice, tuple(payload.get("destinations", ())))


def _reworded(alert: OpenAlert, payload: dict) -> OpenAlert:
    """``alert`` with the words an ALERT_UPDATED ``payload`` recorded."""
    return replace(alert, notice=replace(alert.notice, summary=payload["summary"], cause=payload.get("cause")))


def list_alerts(store: TableStore, *, include_resolved: bool, limit: int,
                lakehouse_dir: Path | None = None) -> list[dict]:
    """Rows of the heartbeat_alerts view, newest first: the open ones, or all. With ``lakehouse_dir``, the
    "runner not ticking" alert ``check`` raised and no runner has recorded yet (none ticks) comes first,
    open, in the same shape: one list of alerts whoever raised them."""
    where = [] if include_resolved else [Cond("is_open", True)]
    rows = store.read(ALERTS_VIEW, *where, order_by=["raised_at DESC"], limit=limit)
    pending = not_ticking_row(lakehouse_dir) if lakehouse_dir is not None else None
    return ([pending] + rows)[:limit] if pending else rows


def not_ticking_path(lakehouse_dir: Path) -> Path:
    """Where ``check`` keeps the open "runner not ticking" alert and the destinations that accepted it."""
    return lakehouse_dir / "alerts" / "not_ticking.json"


def _not_ticking_state(path: Path) -> dict:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) and isinstance(state.get("notice"), dict) else {}


def not_ticking_row(lakehouse_dir: Path) -> dict | None:
    """The open "runner not ticking" alert as a heartbeat_alerts row, while no runner has recorded it."""
    state = _not_ticking_state(not_ticking_path(lakehouse_dir))
    if not state or state.get("recorded") or state.get("resolved"):
        return None
    notice = state["notice"]
    since = datetime.fromisoformat(notice["since"])
    delivered = sorted(m.split(":")[0] for m in state.get("sent", []) if m.endswith(":raise"))
    return {"alert_key": notice["key"], "kind": notice["kind"], "severity": notice["severity"],
            "subject": notice["subject"], "summary": notice["summary"], "jobs": json.dumps(list(notice["jobs"])),
            "link": notice.get("link"), "since_ts": since, "raised_at": since, "updated_at": None, "resolved_at": None,
            "is_open": True,
            "destinations": None, "raise_delivered_to": ",".join(delivered) or None, "resolve_delivered_to": None,
            "failed_deliveries": 0, "last_delivery_error": None}


# -- the watcher: "runner not ticking" ---------------------------------------------------------


@dataclass(frozen=True)
class Liveness:
    """Whether a runner ticked recently enough, and the words for it (``check``, ``status``, the page)."""

    healthy: bool
    message: str
    age_s: float | None
    limit_s: float
    #: when the last tick ended (epoch seconds; None: no tick recorded) and the gap before it
    ticked_at: float | None = None
    interval_s: float | None = None

    def as_json(self) -> dict[str, object]:
        """The figures by name, times in ISO 8601 (UTC)."""
        ticked = None if self.ticked_at is None else datetime.fromtimestamp(self.ticked_at, timezone.utc).isoformat()
        return {"healthy": self.healthy, "message": self.message, "age_s": _rounded(self.age_s),
                "limit_s": _rounded(self.limit_s), "last_tick_at": ticked, "interval_s": _rounded(self.interval_s)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def runner_liveness(lakehouse_dir: Path, policies: AlertPolicies, now: float | None = None,
                    store: TableStore | None = None, *, prefer_lakehouse: bool = False,
                    row_lag_s: float = 0.0) -> Liveness:
    """Healthy when the last tick ended less than the limit ago: ``alerts.runner.not_ticking_after``, else
    three of the runner's own intervals plus a minute (60 s intervals when it ticked only once).

    The record of the last tick is this machine's liveness file (a runner on this machine rewrites it every
    tick, no table is read) and, with ``store``, when there is no such file or ``prefer_lakehouse`` (a
    databricks target, whose runner never shares this machine's disk), also the latest rows of
    ``heartbeat_runs`` in the lakehouse, which every runner writes wherever it runs: a job cluster's ticks are
    seen from a laptop or the App. The newer of the two counts; a table that cannot be read leaves the file's
    answer. A loop writes its idle ticks as one row per streak, at most ``row_lag_s`` late
    (``HEARTBEAT_IDLE_FLUSH``): judged from the table, the limit is at least that lag plus two minutes, so an
    idle loop is not called stopped between its rows.
    """
    now = time.time() if now is None else now
    path = liveness_path(lakehouse_dir)
    local = _judged(_liveness(path), policies, now, f"no tick recorded in {lakehouse_dir}", "")
    if store is None or (path.exists() and not prefer_lakehouse):
        return local
    recorded = _recorded_tick(store)
    if recorded is None or (local.ticked_at is not None and local.ticked_at >= recorded[0]):
        return local
    ticked_at, interval, status = recorded
    return _judged((ticked_at, interval), policies, now, "", f" (read from heartbeat_runs; that tick: {status})",
                   min_limit_s=row_lag_s + 120.0)


def _judged(recorded: tuple[float, float | None] | None, policies: AlertPolicies, now: float, none: str,
            where: str, min_limit_s: float = 0.0) -> Liveness:
    """The verdict on a last tick (when it ended, the interval before it); ``none`` says why there is none,
    ``where`` names the record it came from, ``min_limit_s`` is the least limit that record allows."""
    if recorded is None:
        limit = (policies.not_ticking_after or timedelta(seconds=240)).total_seconds()
        return Liveness(False, f"runner not ticking: {none}", None, limit)
    ticked_at, interval = recorded
    limit = max(min_limit_s, policies.not_ticking_after.total_seconds() if policies.not_ticking_after
                else 3 * float(interval or 60.0) + 60.0)
    age = max(0.0, now - ticked_at)
    if age > limit:
        return Liveness(False, f"runner not ticking: the last tick ended {age:.0f} s ago (limit {limit:.0f} s){where}",
                        age, limit, ticked_at, interval)
    return Liveness(True, f"runner ticking: the last tick ended {age:.0f} s ago (limit {limit:.0f} s){where}", age,
                    limit, ticked_at, interval)


def _recorded_tick(store: TableStore) -> tuple[float, float | None, str] | None:
    """The latest tick in ``heartbeat_runs``: when it ended, the gap to the one before (a loop's idle ticks are
    one row per streak, so the gap is the row cadence, and the limit grows with it) and its status. None when
    the table is missing or cannot be read."""
    try:
        if not store.exists(RUNS):
            return None
        rows = store.read(RUNS, order_by=["ended_ts DESC"], limit=2, columns=["ended_ts", "status"])
    except Exception as exc:  # noqa: BLE001 - the health answer falls back to this machine's file
        log.warning("could not read the latest ticks from %s: %s", RUNS, exc)
        return None
    if not rows or rows[0]["ended_ts"] is None:
        return None
    ended = [as_utc(row["ended_ts"]).timestamp() for row in rows if row["ended_ts"] is not None]
    interval = min(ended[0] - ended[1], MAX_INTERVAL_S) if len(ended) > 1 else None
    return ended[0], interval, str(rows[0]["status"])


def watch_runner(lakehouse_dir: Path, policies: AlertPolicies, *, timeout_s: float = 5.0,
                 found: Liveness | None = None) -> Liveness:
    """``check``: the runner's liveness, and its alert raised / resolved at every destination.

    The open "runner not ticking" alert is kept in ``<lakehouse>/alerts/not_ticking.json``, with the
    destinations that accepted it; a destination that refused is tried again at the next ``check``. ``found``:
    the liveness already judged (e.g. with the lakehouse's record), else this machine's liveness file.
    """
    from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets
    from heartbeat_runner.senders.send import DeliveryError, send

    found = runner_liveness(lakehouse_dir, policies) if found is None else found
    path = not_ticking_path(lakehouse_dir)
    state = _not_ticking_state(path)
    if state.get("recorded"):  # a runner ticked, recorded it and sends its resolve: that alert is over here
        path.unlink(missing_ok=True)
        state = {}
    if found.healthy and not state:
        return found
    if not found.healthy and not state:
        since = datetime.now(timezone.utc)
        alert = Alert(AlertKind.RUNNER_NOT_TICKING, f"runner {lakehouse_dir}", found.message, since)
        state = {"notice": _notice(alert, AlertAction.RAISE).as_dict(), "sent": [], "resolved": False}
    if found.healthy:
        state["resolved"] = True
    notice = Notice(**{**state["notice"], "jobs": tuple(state["notice"]["jobs"]),
                       "action": AlertAction.RESOLVE if state["resolved"] else AlertAction.RAISE,
                       "severity": Severity.CRITICAL.value})
    secrets = DatabricksSecrets()  # {secret: scope/key} references, through the SDK's auth chain
    for destination in policies.destinations:
        mark = f"{destination.name}:{notice.action.value}"
        if mark in state["sent"]:
            continue
        try:
            send(destination, [notice], timeout_s, secrets)
            state["sent"].append(mark)
        except DeliveryError as exc:
            log.warning("sending the %s failed: %s", notice.action.value, exc)
    done = state["resolved"] and all(f"{d.name}:resolve" in state["sent"] for d in policies.destinations)
    path.parent.mkdir(parents=True, exist_ok=True)
    if done:
        path.unlink(missing_ok=True)
    else:
        path.write_text(json.dumps(state))
    return found
