"""OpenLineage events of the runs Heartbeat triggers, sent off the tick's path (docs/lineage.md).

The durable records are the tick's own events: a TRIGGERED event (committed by the tick before any lineage is
built) is a run's START, its COMPLETED or FAILED event the run's COMPLETE or FAIL. After each tick the
:class:`LineageMonitor` builds the events of what the tick recorded and queues them on an outbox
(``alert_delivery.Outbox``, one channel, one event at a time, in order, retried with back-off); what the
transport accepted is recorded as LINEAGE_SENT on a later tick (or when the runner stops). A monitor that
starts (and every ``REFRESH_S``) reads the run events of the last ``CATCH_UP`` and queues each one without
its LINEAGE_SENT: a crash before a send loses nothing, and a crash between a send and its record sends that
event once more, with the same run id and event type (which OpenLineage consumers take as the same event).

Cost: a tick that triggered and finished nothing costs a drain of an empty list. A tick with runs reads the
requests' payloads (START: the windows) and which finished runs Heartbeat triggered, one query each; the
records of what was sent are one commit on the next tick. Off (no OpenLineage configuration), none of this
exists (``App.heartbeat`` adds no monitor) and the client is never imported.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.records import Event, EventType, alert_event_id, as_utc, utcnow
from heartbeat_runner.lakehouse.control_table import ControlTable
from heartbeat_runner.lakehouse.store import TableStore
from heartbeat_runner.policies.catch_up import PARAMS_KEY
from heartbeat_runner.runner.alert_delivery import LINEAGE_THREAD, Outbox
from heartbeat_runner.runner.tick_result import TickObserver, TickResult
from heartbeat_runner.senders.lineage import ConsumedInput, LineageKind, LineageRecord, LineageSender
from heartbeat_runner.senders.send import Attempt
from heartbeat_runner.sensing.sources.base import LineageDataset, LineageNaming
from heartbeat_runner.sensing.sources.registry import source_for

log = logging.getLogger(__name__)

#: how far back a starting monitor looks for runs whose events were not sent
CATCH_UP = timedelta(days=7)
#: seconds between two such looks while the loop runs (events written outside ticks: a job's own `complete`)
REFRESH_S = 600.0
#: how much earlier than a run's TRIGGERED event the look for its end recorded elsewhere starts (the `complete`
#: that ends it runs on another machine, whose clock may be behind the runner's)
END_LOOK_MARGIN = timedelta(minutes=10)
#: seconds ``close`` waits for events still queued (a single ``run``)
CLOSE_FLUSH_S = 10.0
#: the outbox's one channel
CHANNEL = "openlineage"
#: how many of the events this process recorded as sent it remembers (newest kept): a run whose end is recorded
#: twice (its job's own `complete`, and the tick that saw its process end) gets one COMPLETE
SENT_MEMORY = 10_000
_KINDS = {EventType.TRIGGERED: LineageKind.START, EventType.COMPLETED: LineageKind.COMPLETE,
          EventType.FAILED: LineageKind.FAIL, EventType.REFUSED: LineageKind.FAIL}  # a refused run ends unsuccessful


@dataclass(frozen=True)
class LineageKey:
    """One event of one run: the job, the jobs backend's run id, START / COMPLETE / FAIL."""

    job_id: str
    job_run_id: str
    kind: LineageKind

    @classmethod
    def of(cls, record: LineageRecord) -> LineageKey:
        return cls(record.job_id, record.job_run_id, record.kind)


@dataclass(frozen=True)
class LineageChannel:
    """The OpenLineage transport as an outbox channel: one event per send, in order."""

    sender: LineageSender
    name: str = CHANNEL
    kind: str = "lineage"
    grouped: bool = False
    max_batch: int | None = 1

    def deliver(self, items: list[LineageRecord], timeout_s: float) -> None:
        for record in items:
            self.sender.emit(record)
            crash_point(FaultPoint.AFTER_LINEAGE_SENT)  # sent, not recorded: the next runner sends it again


@dataclass(frozen=True)
class RunEventRow:
    """A TRIGGERED, COMPLETED or FAILED event as lineage reads it (from a tick's result or from the table)."""

    event_type: EventType
    job_id: str
    job_run_id: str
    idempotency_token: str | None
    event_ts: datetime
    message: str | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> RunEventRow:
        return cls(EventType(row["event_type"]), row["trigger_job_id"], str(row["job_run_id"]), row.get("idempotency_token"),
                   as_utc(row["event_ts"]), row.get("message"))

    @property
    def key(self) -> LineageKey:
        return LineageKey(self.job_id, self.job_run_id, _KINDS[self.event_type])


@dataclass
class LineageMonitor(TickObserver):
    """Builds, queues and records the OpenLineage events of the runs each tick started and saw end."""

    store: TableStore
    control: ControlTable
    outbox: Outbox[LineageRecord]
    naming: LineageNaming
    job_namespace: str = "heartbeat"
    backend: str | None = None
    #: keys queued by this process and not yet recorded as sent (a look back skips them)
    _queued: set[LineageKey] = field(default_factory=set)
    _looked_at: float | None = None
    _datasets: dict[tuple[str, str], LineageDataset] = field(default_factory=dict)
    #: runs whose TRIGGERED this process saw and whose end it has not: (job id, job run id) -> when triggered
    _open: dict[tuple[str, str], datetime] = field(default_factory=dict)
    #: the events table's version at the last look for ends recorded elsewhere (an idle tick reads nothing again)
    _seen_version: int | None = None
    #: keys this process recorded as sent, oldest first, at most SENT_MEMORY: never queued again
    _sent: dict[LineageKey, None] = field(default_factory=dict)

    def observe(self, result: TickResult) -> None:
        """Record what was sent, queue what the tick recorded (and, when due, what earlier ones left). Never raises.

        Invariant: a run's end is sent by the first tick that observes it, whoever recorded it. The tick's own
        events hold the ends it reconciled; while a run this process saw start is still open after them, the tick
        also reads the ends recorded since that run started (a job's own `complete`, another process), so their
        COMPLETE or FAIL does not wait for the next look back (REFRESH_S)."""
        try:
            self._record_sent(self.outbox.drain(), result.run_id)
        except Exception:  # noqa: BLE001 - recorded by a later tick (the attempts were handed back)
            log.exception("OpenLineage events: recording the deliveries failed")
        try:
            rows = [RunEventRow.of(_as_row(e)) for e in result.run_events if e.job_run_id]
            if self._looked_at is None or time.monotonic() - self._looked_at >= REFRESH_S:
                rows = self._look_back() + rows
                cutoff = utcnow() - CATCH_UP  # a run never seen ending (reset, lost) is not looked for for ever
                self._open = {key: ts for key, ts in self._open.items() if ts >= cutoff}
            else:
                self._follow(rows)
                if self._open:
                    rows = self._ends_recorded_elsewhere() + rows
            self._follow(rows)
            self._queue(rows)
        except Exception:  # noqa: BLE001 - lineage must never fail the tick; it tries again next tick
            log.exception("OpenLineage events: building them failed (a later look back sends them)")

    def _follow(self, rows: list[RunEventRow]) -> None:
        """Keep :attr:`_open` current: a TRIGGERED opens its run, a COMPLETED or FAILED closes it."""
        for row in sorted(rows, key=lambda r: r.event_type is not EventType.TRIGGERED):
            key = (row.job_id, row.job_run_id)
            if row.event_type is EventType.TRIGGERED:
                self._open.setdefault(key, row.event_ts)
            else:
                self._open.pop(key, None)

    def _ends_recorded_elsewhere(self) -> list[RunEventRow]:
        """The unsent ends of the open runs, recorded by another process since the oldest of them started (none
        when the read fails: the look back sends them)."""
        try:
            version = self.store.events_version()
            if version is not None and version == self._seen_version:
                return []  # nothing was committed since the last look
            found = self._unsent(since=min(self._open.values()) - END_LOOK_MARGIN)
            self._seen_version = version
        except Exception:  # noqa: BLE001 - this tick's own events are still queued
            log.exception("OpenLineage events: looking for runs ended elsewhere failed")
            return []
        return [r for r in found if r.event_type is not EventType.TRIGGERED and (r.job_id, r.job_run_id) in self._open]

    def close(self) -> None:
        """Send what is queued (bounded), record it, stop the outbox."""
        try:
            self.outbox.close(CLOSE_FLUSH_S)
            self._record_sent(self.outbox.drain(), "close")
        except Exception:  # noqa: BLE001 - closing must not hide the command's own outcome
            log.exception("recording the last OpenLineage deliveries failed")

    # -- queueing -------------------------------------------------------------------------------

    def _look_back(self) -> list[RunEventRow]:
        """The unsent run events of the last ``CATCH_UP`` (none when the read fails: the next tick looks again)."""
        try:
            found = self._unsent(since=utcnow() - CATCH_UP)
        except Exception:  # noqa: BLE001 - this tick's own events are still queued
            log.exception("OpenLineage events: looking back for unsent ones failed")
            return []
        self._looked_at = time.monotonic()
        return found

    def _queue(self, rows: list[RunEventRow]) -> None:
        """The records of ``rows`` not queued yet, built in two reads at most, queued in order."""
        rows = [r for r in _distinct(rows) if r.key not in self._queued and r.key not in self._sent]
        if not rows:
            return
        ended = [r for r in rows if r.event_type is not EventType.TRIGGERED]
        ours = self.store.triggered_runs([r.job_run_id for r in ended]) if ended else set()
        rows = [r for r in rows if r.event_type is EventType.TRIGGERED or (r.job_id, r.job_run_id) in ours]
        payloads = self.store.trigger_payloads(sorted({r.idempotency_token for r in rows
                                                       if r.event_type is EventType.TRIGGERED
                                                       and r.idempotency_token}))
        records = [self._record(r, payloads) for r in rows]
        self._queued.update(LineageKey.of(r) for r in records)
        self.outbox.submit(CHANNEL, records)

    def _record(self, row: RunEventRow, payloads: Mapping[str, Mapping[str, str]]) -> LineageRecord:
        kind = _KINDS[row.event_type]
        inputs = self._inputs(payloads.get(row.idempotency_token or "", {})) if kind is LineageKind.START else ()
        return LineageRecord(kind, self.job_namespace, row.job_id, row.job_run_id, row.event_ts, inputs,
                             message=row.message if kind is LineageKind.FAIL else None, backend=self.backend)

    def _inputs(self, parameters: Mapping[str, str]) -> tuple[ConsumedInput, ...]:
        """The sources of a request's ``heartbeat_params`` with the window of each (README, "Job parameters")."""
        try:
            params = json.loads(parameters.get(PARAMS_KEY) or "{}")
        except ValueError:
            return ()
        window = params.get("window")
        inputs = []
        for source in params.get("sources") or []:
            dataset = self._dataset(source["sensor_source"], source["sensor_id"])
            inputs.append(ConsumedInput(dataset.namespace, dataset.name, source["sensor_source"], source["sensor_id"],
                                        _window_facet(source, window)))
        return tuple(inputs)

    def _dataset(self, sensor_source: str, sensor_id: str) -> LineageDataset:
        """The source's own name for the dataset (kept: a process names a few hundred upstreams at most)."""
        key = (sensor_source, sensor_id)
        if key not in self._datasets:
            try:
                self._datasets[key] = source_for(sensor_source).lineage_dataset(sensor_source, sensor_id, self.naming)
            except Exception:  # noqa: BLE001 - a plugin that cannot name it: the default name
                log.warning("source %s could not name %s as a dataset; using its sensor id", sensor_source, sensor_id)
                self._datasets[key] = LineageDataset(f"heartbeat://{sensor_source}", sensor_id)
        return self._datasets[key]

    # -- what was sent -------------------------------------------------------------------------

    def _record_sent(self, attempts: list[Attempt[LineageRecord]], run_id: str) -> None:
        """LINEAGE_SENT for every accepted event, in one commit (a failure is only logged: it is retried)."""
        sent = [record for attempt in attempts if attempt.ok for record in attempt.notices]
        if not sent:
            return
        try:
            self.control.append_beside([_sent_event(record, run_id) for record in sent])
        except Exception:
            self.outbox.requeue_results(attempts)
            raise
        keys = [LineageKey.of(r) for r in sent]
        self._queued.difference_update(keys)
        self._sent.update(dict.fromkeys(keys))
        while len(self._sent) > SENT_MEMORY:
            del self._sent[next(iter(self._sent))]  # the oldest

    def _unsent(self, since: datetime) -> list[RunEventRow]:
        """The run events since ``since`` without their LINEAGE_SENT, oldest first."""
        found = self.store.lineage_backlog(since)
        sent = set()
        for row in found:
            if row["event_type"] == EventType.LINEAGE_SENT.value and row.get("payload"):
                payload = json.loads(row["payload"])
                sent.add(LineageKey(payload["job_id"], payload["job_run_id"], LineageKind(payload["event_type"])))
        rows = [RunEventRow.of(row) for row in found
                if EventType(row["event_type"]) in _KINDS and row.get("job_run_id") and row.get("trigger_job_id")]
        return sorted((r for r in rows if r.key not in sent), key=lambda r: r.event_ts)


def _as_row(event: Event) -> dict[str, Any]:
    return {"event_type": event.event_type, "trigger_job_id": event.trigger_job_id,
            "job_run_id": event.job_run_id, "idempotency_token": event.idempotency_token,
            "event_ts": event.event_ts, "message": event.message}


def _distinct(rows: Iterable[RunEventRow]) -> list[RunEventRow]:
    seen: dict[LineageKey, RunEventRow] = {}
    for row in rows:
        seen.setdefault(row.key, row)
    return list(seen.values())


def _window_facet(source: Mapping[str, Any], window: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``heartbeatWindow`` facet's fields of one source of a request (senders/lineage_facets.py)."""
    return {"windowFrom": source.get("from_text"), "windowUntil": source.get("until_text"),
            "boundsKind": source.get("kind"), "boundsFrom": source.get("from"), "boundsUntil": source.get("until"),
            "rows": source.get("rows"), "eventTimeWindow": dict(window) if window else None}


def _sent_event(record: LineageRecord, run_id: str) -> Event:
    """LINEAGE_SENT of one event: no job column (the control table derives nothing from it), a deterministic id
    (recorded twice, one event)."""
    kind = record.kind.value
    payload = {"job_id": record.job_id, "job_run_id": record.job_run_id, "event_type": kind,
               "run_uuid": record.run_id, "job_namespace": record.job_namespace}
    return Event(event_type=EventType.LINEAGE_SENT, run_id=run_id, snapshot_ts=utcnow(),
                 event_id=alert_event_id(EventType.LINEAGE_SENT, record.job_id, record.job_run_id, kind),
                 message=kind, payload=json.dumps(payload, sort_keys=True))


def lineage_monitor(store: TableStore, control: ControlTable, naming: LineageNaming, *, job_namespace: str,
                    backend: str | None) -> LineageMonitor:
    """A monitor with its outbox over the client's configured transport (call only when lineage is configured)."""
    outbox: Outbox[LineageRecord] = Outbox([LineageChannel(LineageSender())], group_interval_s=0.0,
                                           thread_name=LINEAGE_THREAD)
    return LineageMonitor(store, control, outbox, naming, job_namespace=job_namespace, backend=backend)

