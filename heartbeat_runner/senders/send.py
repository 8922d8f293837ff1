"""Sending alert messages: a generic webhook, PagerDuty Events API v2 and email (SMTP + STARTTLS).

Outbound adapters, beside the jobs backends: they know the wire, not when to send (``runner/alert_delivery.py``
queues, groups and retries). Secrets (webhook URLs, routing keys, SMTP user names and passwords) are read at
send time through the resolver the caller passes, for that one send: never kept, logged or recorded; a failure
names the reference, never the value.

Invariant: a :class:`DeliveryError` is one line that names the destination by its key and holds no secret: no
URL's path or query, no header, routing key, user name or password, whether it came from the environment or a
secret scope. :func:`send` builds it from what went wrong and redacts it (with every value that send resolved)
before anything can log, store or print it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import smtplib
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from email.message import EmailMessage
from email.utils import formatdate
from typing import Generic, TypeVar
from urllib.parse import urlsplit

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.secrets import (
    NoSecretScopes,
    SecretError,
    SecretKind,
    SecretRef,
    SecretResolver,
    redact,
    resolve,
)
from heartbeat_runner.senders.destinations import SECRET_SETTINGS, Destination, DestinationKind, secret_shape_problem

#: seconds one attempt may take (connect + send + answer)
DEFAULT_TIMEOUT_S = 5.0
SOURCE = "heartbeat"


#: what an outbox queues and a sender delivers (alerts: Notice; lineage: a lineage record)
Item = TypeVar("Item")

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
    #: the words after the subject ``job <id>`` that notices about several jobs may share (an overdue job's
    #: deadline and root cause): a message names a shared cause once and lists the jobs (None: not shared)
    cause: str | None = None

    @property
    def mark(self) -> str:
        return "RESOLVED" if self.action is AlertAction.RESOLVE else self.severity.upper()

    @property
    def text(self) -> str:
        return f"[{self.mark}] {self.summary}" + (f" <{self.link}>" if self.link else "")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "action": self.action.value, "jobs": list(self.jobs)}


@dataclass(frozen=True)
class Attempt(Generic[Item]):
    """What one send of ``notices`` (alert notices, lineage records: an outbox's items) to ``destination``
    came to (``error`` None: accepted)."""

    destination: str
    notices: tuple[Item, ...]
    attempt: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def digest_lines(notices: list[Notice]) -> list[str]:
    """One line per notice, except that the notices of one kind and action sharing a ``cause`` (50 jobs overdue
    because one source is late) are one line that leads with the cause and lists the jobs, in the order
    they came: ``[ERROR] 50 jobs overdue since …: waiting on …, which has had no new data since … (jobs: …)``."""
    groups: dict[tuple[str, ...], list[Notice]] = {}
    for index, notice in enumerate(notices):
        shared = (notice.kind, notice.action.value, notice.cause) if notice.cause else (str(index),)
        groups.setdefault(shared, []).append(notice)
    lines = []
    for group in groups.values():
        first = group[0]
        if len(group) == 1 or first.cause is None:
            lines.append(first.text)
            continue
        jobs = [job for notice in group for job in notice.jobs]
        lines.append(f"[{first.mark}] {len(jobs)} jobs {first.cause} (jobs: {', '.join(jobs)})")
    return lines


def digest_text(notices: list[Notice]) -> str:
    """The text of a message: one notice's own, one line for notices sharing a cause, or a digest with one
    line per notice or shared cause (``digest_lines``)."""
    lines = digest_lines(notices)
    if len(lines) == 1:
        return lines[0]
    listed = "\n".join(f"• {line}" for line in lines)
    return f"Heartbeat: {len(notices)} alert update(s)\n{listed}"


def message_id(notices: list[Notice]) -> str:
    """The Message-ID of an email: derived from the alert key (and action), so a re-send is recognisable."""
    if len(notices) == 1:
        return f"<{notices[0].key}.{notices[0].action.value}@{SOURCE}>"
    joined = ",".join(f"{n.key}.{n.action.value}" for n in notices)
    return f"<digest.{hashlib.sha256(joined.encode()).hexdigest()[:32]}@{SOURCE}>"


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
            payload: dict[str, object] = {
                "summary": notice.summary[:1024], "source": SOURCE, "severity": notice.severity,
                "component": notice.subject, "class": notice.kind,
                "custom_details": {"since": notice.since, "jobs": list(notice.jobs)}}
            if notice.cause:  # one value for one cause's alerts: the service's alert grouping can fold on it
                payload["group"] = notice.cause[:255]
            body["payload"] = payload
            if notice.link:
                body["links"] = [{"href": notice.link, "text": "job and run output"}]
        _post_json(destination.url, body, timeout_s)


def send_email(destination: Destination, notices: list[Notice], timeout_s: float, secrets: SecretResolver) -> None:
    """One email over SMTP, upgraded with STARTTLS (unless ``starttls: false``), Message-ID from the alert key."""
    message = EmailMessage()
    first, lines = notices[0], digest_lines(notices)
    message["Subject"] = (f"[heartbeat] {lines[0]}" if len(lines) == 1
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

    ``secrets`` reads ``{secret: scope/key}`` references (the runner passes the workspace of the SDK's auth chain;
    without one, a scope reference is refused and only ``{env: NAME}`` ones are read).
    DeliveryError if refused or broken in any way: one line, ``<kind> destination <key>: <what>``,
    redacted (see the module's invariant); the original error is its cause."""
    remembering = _Remembering(secrets or NoSecretScopes())
    try:
        SENDERS[destination.kind](destination, notices, timeout_s, remembering)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one redacted line; a bug's type is kept
        what = str(exc) if isinstance(exc, DeliveryError) else f"{type(exc).__name__}: {exc}"
        raise DeliveryError(redact(f"{destination.kind.value} destination {destination.name}: {what}",
                                   secrets_of(destination, remembering.values))) from exc
