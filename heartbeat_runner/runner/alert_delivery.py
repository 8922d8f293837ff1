"""Sending alerts: a generic webhook, PagerDuty Events API v2 and email (SMTP + STARTTLS), off the tick's path.

An :class:`Outbox` owns one background thread. The tick hands it notices (a raise or a resolve of one
alert) *after* they are recorded; the thread sends them with bounded timeouts, retries failures with
exponential back-off, and groups a storm: a webhook or email destination gets at most one message
per ``group_interval`` (the first at once, what comes meanwhile as one digest). PagerDuty gets one
event per notice, because its ``dedup_key`` must be the alert's key for a resolve to find its
trigger; the root-cause grouping already makes one alert of a late source's many jobs.

What happened to each attempt comes back through :meth:`Outbox.drain` for the tick to record
(ALERT_SENT / ALERT_DELIVERY_FAILED). Secrets (webhook URLs, routing keys, SMTP user names and
passwords) are read at send time, from the environment or a Databricks secret scope
(``core/secrets.py``), for that one send: never kept, logged or recorded; a failure names the
reference, never the value.

Invariant: a :class:`DeliveryError` is one line that names the destination by its key and holds no
secret: no URL's path or query, no header, routing key, user name or password, whether it came from
the environment or a secret scope. :func:`send` builds it from what went wrong and redacts it (with
every value that send resolved) before anything can log, store or print it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import re
import smtplib
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from email.utils import formatdate
from urllib.parse import urlsplit

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.secrets import SecretError, SecretKind, SecretRef, SecretResolver, resolve
from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets
from heartbeat_runner.policies.alerts import SECRET_SETTINGS, Destination, DestinationKind, secret_shape_problem

log = logging.getLogger(__name__)

#: seconds one attempt may take (connect + send + answer)
DEFAULT_TIMEOUT_S = 5.0
#: back-off after the n-th consecutive failure of a destination (core/backoff.py): BASE * 2^(n-1), at most MAX
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


#: a URL in a message: its scheme and host are kept, the rest (path, query, user info) is not
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)(?:[^\s/@'\"<>]*@)?([^\s/?#'\"<>]*)[^\s'\"<>]*")
REDACTED = "***"


class _Remembering:
    """A resolver that keeps the values it read for one send (``scope/key`` -> value), so that send's error can
    be redacted of them too; dropped with the send."""

    def __init__(self, inner: SecretResolver):
        self.inner = inner
        self.values: dict[str, str] = {}

    def secret(self, scope: str, key: str) -> str:
        value = self.inner.secret(scope, key)
        self.values[f"{scope}/{key}"] = value
        return value


def _secret(ref: SecretRef | None, destination: Destination, setting: str, secrets: SecretResolver) -> str:
    """The value of one secret setting, read now; DeliveryError naming the destination, setting and reference
    (never the value) when it cannot be read or its shape is wrong (``secret_shape_problem``)."""
    where = f"alerts.destinations.{destination.name}.{setting}"
    if ref is None:
        raise DeliveryError(f"{where}: not configured")
    try:
        value = resolve(ref, where, secrets)
    except SecretError as exc:
        raise DeliveryError(str(exc)) from exc
    if not value:
        raise DeliveryError(f"{where}: {ref} is empty")
    shape = secret_shape_problem(setting, value)
    if shape:
        raise DeliveryError(f"{where}: {ref} {shape} (its value is a secret and not shown)")
    return value


def secrets_of(destination: Destination, resolved: Mapping[str, str] | None = None) -> list[str]:
    """The secret values ``destination`` is sent with now (and a webhook URL's path and query on their own):
    ``{env: NAME}`` references read from the environment, ``{secret: scope/key}`` ones from ``resolved``
    (``scope/key`` -> the value a send read; never read here: that would be a network call)."""
    found = []
    for setting in SECRET_SETTINGS:
        ref: SecretRef | None = getattr(destination, f"{setting}_secret")
        if ref is None:
            continue
        value = os.environ.get(ref.name, "") if ref.kind is SecretKind.ENV else (resolved or {}).get(ref.name, "")
        if value:
            found.append(value)
            if setting == "url":
                parts = urlsplit(value if "://" in value else f"//{value}")  # no scheme: host, then the path
                found += [p for p in (parts.path, parts.query, parts.fragment) if len(p) > 1]
    return found


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` on one line with every secret replaced and every URL cut to its scheme and host."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL.sub(lambda m: f"{m.group(1)}{m.group(2)}" + ("/" + REDACTED if len(m.group(0)) > len(
        m.group(1) + m.group(2)) else ""), text)
    return " ".join(text.split())


def _where(url: str) -> str:
    """A URL as a message may show it: scheme and host only."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}" if parts.scheme and parts.netloc else "the URL"


def _post_json(url: str, body: dict[str, object], timeout_s: float, headers: dict[str, str] | None = None) -> None:
    """POST ``body``; DeliveryError naming the URL by scheme and host only (its path and query may be a secret)."""
    where = _where(url)
    try:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - the operator's URL
            answer.read()
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"{where} answered HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise DeliveryError(f"no answer from {where}: {exc.reason}") from exc
    except (OSError, TimeoutError) as exc:
        raise DeliveryError(f"no answer from {where}: {type(exc).__name__}: {exc}") from exc
    except ValueError as exc:  # urllib's "unknown url type", http.client's InvalidURL: the text quotes the URL
        raise DeliveryError(f"{where} is not a URL this can send to (http or https with a host)") from exc


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
        raise DeliveryError(f"SMTP {destination.host}:{destination.port}: {type(exc).__name__}: {exc}") from exc


SENDERS: dict[DestinationKind, Callable[[Destination, list[Notice], float, SecretResolver], None]] = {
    DestinationKind.WEBHOOK: send_webhook, DestinationKind.PAGERDUTY: send_pagerduty, DestinationKind.EMAIL: send_email,
}


def send(destination: Destination, notices: list[Notice], timeout_s: float = DEFAULT_TIMEOUT_S,
         secrets: SecretResolver | None = None) -> None:
    """Send ``notices`` to ``destination`` now (one message, or one PagerDuty event each).

    ``secrets`` reads ``{secret: scope/key}`` references (default: the workspace of the SDK's auth chain).
    DeliveryError if refused or broken in any way: one line, ``<kind> destination <key>: <what>``,
    redacted (see the module's invariant); the original error is its cause."""
    remembering = _Remembering(secrets or DatabricksSecrets())
    try:
        SENDERS[destination.kind](destination, notices, timeout_s, remembering)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one redacted line; a bug's type is kept
        what = str(exc) if isinstance(exc, DeliveryError) else f"{type(exc).__name__}: {exc}"
        raise DeliveryError(redact(f"{destination.kind.value} destination {destination.name}: {what}",
                                   secrets_of(destination, remembering.values))) from exc


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
        self.backoff = Backoff(backoff_base_s, backoff_max_s)
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
        except DeliveryError as exc:  # already one redacted line naming the destination
            log.warning("alert delivery failed (attempt %d, retried): %s", number, exc)
            return Attempt(queue.destination.name, tuple(notices), number, str(exc))
        except Exception as exc:  # noqa: BLE001 - never reached (send wraps all); the thread must not end
            message = f"{queue.destination.kind.value} destination {queue.destination.name}: {type(exc).__name__}"
            log.warning("alert delivery failed (attempt %d, retried): %s", number, message)
            return Attempt(queue.destination.name, tuple(notices), number, message)
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
            queue.not_before = now + self.backoff.after(queue.failures)
        self._lock.notify_all()
