"""Delivering off the tick's path: the outbox that queues, groups and retries what the senders send.

An :class:`Outbox` owns one background thread and a queue per :class:`Channel` (a destination of alerts,
the OpenLineage transport). The tick hands it items (a raise or a resolve of one alert, a run's lineage
event) *after* they are recorded; the thread sends them with bounded timeouts, retries failures with
exponential back-off, and groups a storm: a grouped channel gets at most one send per ``group_interval``
(the first at once, what comes meanwhile as one batch). For alerts (:func:`alert_outbox`) a webhook or email
destination is grouped: one message, in which the alerts of many jobs overdue for one cause are one line
leading with the cause (``senders/send.py``: ``digest_lines``). PagerDuty gets one event per notice, because
its ``dedup_key`` must be the alert's key for a resolve to find its trigger; the events of one cause carry
one ``group``, and the service's own alert grouping folds them into one incident (docs/alerts.md).
A channel with ``max_batch`` 1 (lineage) gets its items one at a time, in order.

What happened to each attempt comes back through :meth:`Outbox.drain` for the tick to record
(ALERT_SENT / ALERT_DELIVERY_FAILED); an attempt's error is the sender's redacted one line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.metrics import metrics
from heartbeat_runner.core.secrets import SecretResolver
from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets
from heartbeat_runner.senders.destinations import Destination, DestinationKind
from heartbeat_runner.senders.send import DEFAULT_TIMEOUT_S, Attempt, DeliveryError, Notice, send

T = TypeVar("T")

log = logging.getLogger(__name__)

#: back-off after the n-th consecutive failure of a destination (core/backoff.py): BASE * 2^(n-1), at most MAX
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0


class Channel(Protocol[T]):
    """Where an outbox's items go: ``deliver`` sends a batch (all accepted, or DeliveryError: one redacted line)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def grouped(self) -> bool:
        """At most one send per group interval (else the next batch goes as soon as the last is accepted)."""

    @property
    def max_batch(self) -> int | None:
        """The most items one send takes (None: all that wait)."""

    def deliver(self, items: list[T], timeout_s: float) -> None: ...


@dataclass(frozen=True)
class AlertChannel:
    """An alert destination as an outbox channel: its notices go through ``senders/send.py``."""

    destination: Destination
    secrets: SecretResolver
    max_batch: int | None = None

    @property
    def name(self) -> str:
        return self.destination.name

    @property
    def kind(self) -> str:
        return self.destination.kind.value

    @property
    def grouped(self) -> bool:
        return self.destination.kind is not DestinationKind.PAGERDUTY

    def deliver(self, items: list[Notice], timeout_s: float) -> None:
        send(self.destination, items, timeout_s, self.secrets)


def alert_outbox(destinations: Iterable[Destination], *, group_interval_s: float,
                 secrets: SecretResolver | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Outbox[Notice]:
    """The outbox of alert notices; ``secrets`` reads ``{secret: scope/key}`` references at each send (default:
    the SDK's auth chain)."""
    resolver: SecretResolver = secrets or DatabricksSecrets()
    return Outbox([AlertChannel(d, resolver) for d in destinations], group_interval_s=group_interval_s,
                  timeout_s=timeout_s)


#: the delivery threads' names (one per outbox; tests check none outlives its runner)
ALERT_THREAD = "heartbeat-alerts"
LINEAGE_THREAD = "heartbeat-lineage"


@dataclass
class _Queue(Generic[T]):
    """One channel's waiting items and when it may be sent to next."""

    channel: Channel[T]
    waiting: list[T] = field(default_factory=list)
    failures: int = 0
    not_before: float = 0.0


class Outbox(Generic[T]):
    """Sends items from a background thread: bounded timeouts, back-off, one send per interval per grouped channel.

    Invariant: an item stays queued until its channel accepted it (or the outbox is closed: then the event
    log still says it was not sent, and the next runner sends it).
    """

    def __init__(self, channels: Iterable[Channel[T]], *, group_interval_s: float,
                 timeout_s: float = DEFAULT_TIMEOUT_S, backoff_base_s: float = BACKOFF_BASE_S,
                 backoff_max_s: float = BACKOFF_MAX_S, thread_name: str = ALERT_THREAD):
        self._queues: dict[str, _Queue[T]] = {c.name: _Queue(c) for c in channels}
        self.thread_name = thread_name
        self.group_interval_s = group_interval_s
        self.timeout_s = timeout_s
        self.backoff = Backoff(backoff_base_s, backoff_max_s)
        self._done: list[Attempt[T]] = []
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def destinations(self) -> list[str]:
        return list(self._queues)

    def submit(self, destination: str, notices: Iterable[T]) -> None:
        """Queue ``notices`` (already recorded) for channel ``destination``, each once; an unknown name is ignored."""
        with self._lock:
            queue = self._queues.get(destination)
            if queue is None:
                return
            queue.waiting.extend(n for n in notices if n not in queue.waiting)
            self._start()
            self._lock.notify_all()

    def drain(self) -> list[Attempt[T]]:
        """The attempts finished since the last drain (the tick records them)."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def requeue_results(self, attempts: list[Attempt[T]]) -> None:
        """Give back drained attempts that could not be recorded (the next drain returns them again)."""
        with self._lock:
            self._done[:0] = attempts

    def pending(self) -> int:
        with self._lock:
            return sum(len(q.waiting) for q in self._queues.values())

    def close(self, flush_s: float = 0.0) -> None:
        """Stop the thread; first, for up to ``flush_s``, send what is waiting (ignoring the group interval)."""
        deadline = time.monotonic() + flush_s
        with self._lock:
            for queue in self._queues.values():
                if not queue.failures:
                    queue.not_before = 0.0
            self._lock.notify_all()
            while flush_s > 0 and any(q.waiting for q in self._queues.values()) and time.monotonic() < deadline:
                self._lock.wait(0.05)
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                batch = self._next_batch()
                while batch is None and not self._stopping:
                    self._lock.wait(self._wait_s())
                    batch = self._next_batch()
                if batch is None:
                    return
            queue, notices = batch
            attempt = self._send(queue, notices)
            with self._lock:
                self._settle(queue, notices, attempt)

    def _next_batch(self) -> tuple[_Queue[T], list[T]] | None:
        now = time.monotonic()
        for queue in self._queues.values():
            if queue.waiting and now >= queue.not_before:
                return queue, queue.waiting[:queue.channel.max_batch]
        return None

    def _wait_s(self) -> float:
        now = time.monotonic()
        due = [q.not_before - now for q in self._queues.values() if q.waiting]
        return max(0.01, min(due)) if due else 1.0

    def _send(self, queue: _Queue[T], notices: list[T]) -> Attempt[T]:
        number, channel = queue.failures + 1, queue.channel
        try:
            channel.deliver(notices, self.timeout_s)
        except DeliveryError as exc:  # already one redacted line naming the destination
            log.warning("%s delivery failed (attempt %d, retried): %s", channel.kind, number, exc)
            return Attempt(channel.name, tuple(notices), number, str(exc))
        except Exception as exc:  # noqa: BLE001 - never reached (senders wrap all); the thread must not end
            message = f"{channel.kind} destination {channel.name}: {type(exc).__name__}"
            log.warning("%s delivery failed (attempt %d, retried): %s", channel.kind, number, message)
            return Attempt(channel.name, tuple(notices), number, message)
        return Attempt(channel.name, tuple(notices), number)

    def _settle(self, queue: _Queue[T], notices: list[T], attempt: Attempt[T]) -> None:
        now = time.monotonic()
        self._done.append(attempt)
        _count(queue.channel, attempt.ok, len(notices))
        if attempt.ok:
            queue.waiting = [n for n in queue.waiting if n not in notices]
            queue.failures = 0
            queue.not_before = now + (self.group_interval_s if queue.channel.grouped else 0.0)
        else:
            queue.failures += 1
            queue.not_before = now + self.backoff.after(queue.failures)
        self._lock.notify_all()


def _count(channel: Channel[Any], ok: bool, sent: int) -> None:
    """An attempt in this process's metrics: alert messages by destination kind, OpenLineage events."""
    if isinstance(channel, AlertChannel):
        (metrics().alert_deliveries if ok else metrics().alert_failures).labels(destination=channel.kind).inc()
    else:
        (metrics().lineage_events if ok else metrics().lineage_failures).inc(sent)
