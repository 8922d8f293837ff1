"""Sending alerts: a generic webhook, PagerDuty Events API v2 and email (SMTP + STARTTLS), off the tick's path.

An :class:`Outbox` owns one background thread. The tick hands it notices (a raise or a resolve of one
alert) *after* they are recorded; the thread sends them with bounded timeouts, retries failures with
exponential back-off, and groups a storm: a webhook or email destination gets at most one message
per ``group_interval`` (the first at once, what comes meanwhile as one digest). PagerDuty gets one
event per notice, because its ``dedup_key`` must be the alert's key for a resolve to find its
trigger; the root-cause grouping already makes one alert of a late source's many jobs.

What happened to each attempt comes back through :meth:`Outbox.drain` for the tick to record
(ALERT_SENT / ALERT_DELIVERY_FAILED). Secrets (webhook URLs, routing keys, SMTP passwords) are read
at send time, from the environment or a Databricks secret scope (``core/secrets.py``), for that one
send: never kept, logged or recorded; a failure names the reference, never the value.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import smtplib
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from email.utils import formatdate

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.secrets import SecretError, SecretRef, SecretResolver, resolve
from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets
from heartbeat_runner.policies.alerts import Destination, DestinationKind

log = logging.getLogger(__name__)

#: seconds one attempt may take (connect + send + answer)
DEFAULT_TIMEOUT_S = 5.0
#: back-off after the n-th consecutive failure of a destination: BASE * 2^(n-1), at most MAX
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0
SOURCE = "heartbeat"


class AlertAction(str, enum.Enum):
    RAISE = "raise"
    RESOLVE = "resolve"


class DeliveryError(HeartbeatError):
    """A destination refused a message or did not answer in time (the message is retried)."""


@dataclass(frozen=True)
class Notice:
    """One raise or resolve of one alert, as every destination receives it."""

    key: str
    action: AlertAction
    kind: str
    subject: str
    summary: str
    severity: str
    since: str
    jobs: tuple[str, ...] = ()
    link: str | None = None

    @property
    def text(self) -> str:
        mark = "RESOLVED" if self.action is AlertAction.RESOLVE else self.severity.upper()
        return f"[{mark}] {self.summary}" + (f" <{self.link}>" if self.link else "")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "action": self.action.value, "jobs": list(self.jobs)}


@dataclass(frozen=True)
class Attempt:
    """What one send of ``notices`` to ``destination`` came to (``error`` None: accepted)."""

    destination: str
    notices: tuple[Notice, ...]
    attempt: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def digest_text(notices: list[Notice]) -> str:
    """The text of a message: one notice's own, or a digest with one line per notice."""
    if len(notices) == 1:
        return notices[0].text
    lines = "\n".join(f"• {n.text}" for n in notices)
    return f"Heartbeat: {len(notices)} alert update(s)\n{lines}"


def message_id(notices: list[Notice]) -> str:
    """The Message-ID of an email: derived from the alert key (and action), so a re-send is recognisable."""
    if len(notices) == 1:
        return f"<{notices[0].key}.{notices[0].action.value}@{SOURCE}>"
    joined = ",".join(f"{n.key}.{n.action.value}" for n in notices)
    return f"<digest.{hashlib.sha256(joined.encode()).hexdigest()[:32]}@{SOURCE}>"


def _secret(ref: SecretRef | None, destination: Destination, setting: str, secrets: SecretResolver) -> str:
    """The value of one secret setting, read now; DeliveryError naming the destination, setting and reference."""
    where = f"alerts.destinations.{destination.name}.{setting}"
    if ref is None:
        raise DeliveryError(f"{where}: not configured")
    try:
        value = resolve(ref, where, secrets)
    except SecretError as exc:
        raise DeliveryError(str(exc)) from exc
    if not value:
        raise DeliveryError(f"{where}: {ref} is empty")
    return value


def _post_json(url: str, body: dict[str, object], timeout_s: float, headers: dict[str, str] | None = None) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - the operator's URL
            answer.read()
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}") from exc
    except (OSError, TimeoutError) as exc:
        raise DeliveryError(f"no answer: {exc}") from exc


def send_webhook(destination: Destination, notices: list[Notice], timeout_s: float, secrets: SecretResolver) -> None:
    """A JSON POST whose ``text`` Slack and Microsoft Teams incoming webhooks show; ``alerts`` has each notice."""
    url = _secret(destination.url_secret, destination, "url", secrets)
    keys = ",".join(f"{n.key}.{n.action.value}" for n in notices)
    _post_json(url, {"text": digest_text(notices), "alerts": [n.as_dict() for n in notices]}, timeout_s,
               {"Idempotency-Key": hashlib.sha256(keys.encode()).hexdigest()[:32]})


def send_pagerduty(destination: Destination, notices: list[Notice], timeout_s: float, secrets: SecretResolver) -> None:
    """PagerDuty Events API v2: a trigger or resolve per notice, ``dedup_key`` = the alert's key."""
    routing_key = _secret(destination.routing_key_secret, destination, "routing_key", secrets)
    for notice in notices:
        body: dict[str, object] = {"routing_key": routing_key, "dedup_key": notice.key,
                                   "event_action": "trigger" if notice.action is AlertAction.RAISE else "resolve"}
        if notice.action is AlertAction.RAISE:
            body["payload"] = {"summary": notice.summary[:1024], "source": SOURCE, "severity": notice.severity,
                               "component": notice.subject, "class": notice.kind,
                               "custom_details": {"since": notice.since, "jobs": list(notice.jobs)}}
            if notice.link:
                body["links"] = [{"href": notice.link, "text": "run output"}]
        _post_json(destination.url, body, timeout_s)


def send_email(destination: Destination, notices: list[Notice], timeout_s: float, secrets: SecretResolver) -> None:
    """One email over SMTP, upgraded with STARTTLS (unless ``starttls: false``), Message-ID from the alert key."""
    message = EmailMessage()
    first = notices[0]
    message["Subject"] = (f"[heartbeat] {first.text}" if len(notices) == 1
                          else f"[heartbeat] {len(notices)} alert update(s)")[:200]
    message["From"] = destination.sender
    message["To"] = ", ".join(destination.to)
    message["Date"] = formatdate(localtime=False)
    message["Message-ID"] = message_id(notices)
    if len(notices) == 1 and first.action is AlertAction.RESOLVE:
        message["In-Reply-To"] = message["References"] = f"<{first.key}.{AlertAction.RAISE.value}@{SOURCE}>"
    message.set_content(digest_text(notices) + "\n\nAlert keys:\n" + "".join(f"{n.key}\n" for n in notices))
    login = None
    if destination.username_secret:
        login = (_secret(destination.username_secret, destination, "username", secrets),
                 _secret(destination.password_secret, destination, "password", secrets))
    try:
        with smtplib.SMTP(destination.host, destination.port, timeout=timeout_s) as smtp:
            if destination.starttls:
                smtp.starttls(context=ssl.create_default_context(cafile=destination.ca_file))
            if login:
                smtp.login(*login)
            smtp.send_message(message)
    except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        raise DeliveryError(f"SMTP: {exc}") from exc


SENDERS: dict[DestinationKind, Callable[[Destination, list[Notice], float, SecretResolver], None]] = {
    DestinationKind.WEBHOOK: send_webhook, DestinationKind.PAGERDUTY: send_pagerduty, DestinationKind.EMAIL: send_email,
}


def send(destination: Destination, notices: list[Notice], timeout_s: float = DEFAULT_TIMEOUT_S,
         secrets: SecretResolver | None = None) -> None:
    """Send ``notices`` to ``destination`` now (one message, or one PagerDuty event each); DeliveryError if refused.

    ``secrets`` reads ``{secret: scope/key}`` references (default: the workspace of the SDK's auth chain)."""
    SENDERS[destination.kind](destination, notices, timeout_s, secrets or DatabricksSecrets())


@dataclass
class _Queue:
    """One destination's waiting notices and when it may be sent to next."""

    destination: Destination
    waiting: list[Notice] = field(default_factory=list)
    failures: int = 0
    not_before: float = 0.0


class Outbox:
    """Sends notices from a background thread: bounded timeouts, back-off, one message per interval per destination.

    Invariant: a notice stays queued until its destination accepted it (or the outbox is closed: then
    the event log still says it was not sent, and the next runner sends it).
    """

    def __init__(self, destinations: Iterable[Destination], *, group_interval_s: float,
                 timeout_s: float = DEFAULT_TIMEOUT_S, backoff_base_s: float = BACKOFF_BASE_S,
                 backoff_max_s: float = BACKOFF_MAX_S, secrets: SecretResolver | None = None):
        """``secrets`` reads ``{secret: scope/key}`` references at each send (default: the SDK's auth chain)."""
        self._queues = {d.name: _Queue(d) for d in destinations}
        self.secrets: SecretResolver = secrets or DatabricksSecrets()
        self.group_interval_s = group_interval_s
        self.timeout_s = timeout_s
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self._done: list[Attempt] = []
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def destinations(self) -> list[str]:
        return list(self._queues)

    def submit(self, destination: str, notices: Iterable[Notice]) -> None:
        """Queue ``notices`` (already recorded) for ``destination``; an unknown name is ignored."""
        with self._lock:
            queue = self._queues.get(destination)
            if queue is None:
                return
            queue.waiting.extend(n for n in notices if n not in queue.waiting)
            self._start()
            self._lock.notify_all()

    def drain(self) -> list[Attempt]:
        """The attempts finished since the last drain (the tick records them)."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def requeue_results(self, attempts: list[Attempt]) -> None:
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
            self._thread = threading.Thread(target=self._run, name="heartbeat-alerts", daemon=True)
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

    def _next_batch(self) -> tuple[_Queue, list[Notice]] | None:
        now = time.monotonic()
        for queue in self._queues.values():
            if queue.waiting and now >= queue.not_before:
                return queue, list(queue.waiting)
        return None

    def _wait_s(self) -> float:
        now = time.monotonic()
        due = [q.not_before - now for q in self._queues.values() if q.waiting]
        return max(0.01, min(due)) if due else 1.0

    def _send(self, queue: _Queue, notices: list[Notice]) -> Attempt:
        number = queue.failures + 1
        try:
            send(queue.destination, notices, self.timeout_s, self.secrets)
        except DeliveryError as exc:
            log.warning("alert delivery to %s failed (attempt %d): %s", queue.destination.name, number, exc)
            return Attempt(queue.destination.name, tuple(notices), number, str(exc))
        except Exception as exc:  # noqa: BLE001 - a sender bug must not end the thread; the notice stays queued
            log.exception("alert delivery to %s failed unexpectedly", queue.destination.name)
            return Attempt(queue.destination.name, tuple(notices), number, f"{type(exc).__name__}: {exc}")
        return Attempt(queue.destination.name, tuple(notices), number)

    def _settle(self, queue: _Queue, notices: list[Notice], attempt: Attempt) -> None:
        now = time.monotonic()
        self._done.append(attempt)
        if attempt.ok:
            queue.waiting = [n for n in queue.waiting if n not in notices]
            queue.failures = 0
            grouped = queue.destination.kind is not DestinationKind.PAGERDUTY
            queue.not_before = now + (self.group_interval_s if grouped else 0.0)
        else:
            queue.failures += 1
            queue.not_before = now + min(self.backoff_max_s, self.backoff_base_s * 2 ** (queue.failures - 1))
        self._lock.notify_all()
