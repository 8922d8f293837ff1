"""Alert conditions: what is wrong or late, decided from hot state only (the ``alerts:`` run-policy section).

Pure functions of the policies, a :class:`HotState` the runner folds forward from each tick's result,
and the time. Nothing here reads a table or sends anything: the runner records and delivers
(``runner/alerting.py``, ``runner/alert_delivery.py``).

Invariants:
- an alert's *identity* (kind, subject, period) is what a condition is about; its *key* is a digest of the
  identity and the time the condition began, so it is the same on every tick, in every process that
  sees the same facts, and a receiver can de-duplicate on it;
- a source late for many jobs is one alert (naming them); an overdue job is one alert per job and deadline
  period (subject ``job <id>``: the job the on-call must act on), whatever its cause is or becomes;
- an overdue alert's words are recomputed from the current root cause every tick (``Alert.live_words``):
  another source getting data, or a run starting or failing, changes its summary, never its identity;
  the cause is kept apart (``Alert.cause``) so that a message about many jobs overdue for one cause names
  the cause once (``senders/send.py`` groups them);
- a deadline is first checked at its first occurrence after it was configured (or after the job was
  added): never against a day it did not exist.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from heartbeat_runner.core.durations import DurationError
from heartbeat_runner.core.durations import parse_duration as core_duration
from heartbeat_runner.core.errors import InvalidInputError
from heartbeat_runner.core.secrets import SecretKind, SecretRef, parse_reference
from heartbeat_runner.senders.destinations import (
    PAGERDUTY_URL,
    SECRET_SETTINGS,
    Destination,
    DestinationKind,
    is_web_url,
    secret_shape_problem,
)


class AlertKind(str, enum.Enum):
    JOB_FAILED = "JOB_FAILED"
    JOB_REFUSED = "JOB_REFUSED"  # the jobs service refused to run the job (disabled, budget policy): it never ran
    TRIGGER_ERROR = "TRIGGER_ERROR"
    SENSING_ERROR = "SENSING_ERROR"
    RUN_TOO_LONG = "RUN_TOO_LONG"
    SOURCE_LATE = "SOURCE_LATE"
    JOB_OVERDUE = "JOB_OVERDUE"
    RUNNER_NOT_TICKING = "RUNNER_NOT_TICKING"


class Severity(str, enum.Enum):
    """PagerDuty's severities (Events API v2)."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


SEVERITY = {AlertKind.JOB_FAILED: Severity.ERROR, AlertKind.JOB_REFUSED: Severity.ERROR,
            AlertKind.TRIGGER_ERROR: Severity.ERROR,
            AlertKind.SENSING_ERROR: Severity.WARNING, AlertKind.RUN_TOO_LONG: Severity.WARNING,
            AlertKind.SOURCE_LATE: Severity.WARNING, AlertKind.JOB_OVERDUE: Severity.ERROR,
            AlertKind.RUNNER_NOT_TICKING: Severity.CRITICAL}


# -- the section ----------------------------------------------------------------------------------

def parse_duration(value: object, field_name: str) -> timedelta | None:
    """A duration greater than 0 (core/durations.py: ``90s``, ``15m``, ``1.5h``, ``2d``, ``1w`` or a number of
    seconds); None/``off`` for no limit. ValueError naming ``field_name`` otherwise."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "none", "")):
        return None
    try:
        return core_duration(value, allow_zero=False)
    except DurationError as exc:
        raise ValueError(f"{field_name}: {exc}") from exc


@dataclass(frozen=True)
class Deadline:
    """Completed by ``by`` every day in ``zone``, by a run that ended after ``after`` (the day's start)."""

    by: time
    zone: str = "UTC"
    after: time = time(0, 0)

    @classmethod
    def parse(cls, value: object, field_name: str) -> Deadline:
        """``"06:00 Europe/Berlin"``, ``"06:00"`` (UTC) or ``{by: "06:00", zone: ..., after: "22:00"}``."""
        if isinstance(value, Mapping):
            unknown = set(value) - {"by", "zone", "after"}
            if unknown:
                raise ValueError(f"{field_name}: unknown setting(s) {', '.join(sorted(unknown))}")
            by, zone, after = value.get("by"), str(value.get("zone", "UTC")), value.get("after", "00:00")
        else:
            by, _, zone = str(value).strip().partition(" ")
            zone, after = zone.strip() or "UTC", "00:00"
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{field_name}: unknown time zone {zone!r}") from exc
        return cls(by=_clock_time(by, field_name), zone=zone, after=_clock_time(after, field_name))

    def latest(self, now: datetime) -> tuple[datetime, datetime]:
        """The latest deadline at or before ``now`` and the start of the period it closes (both UTC)."""
        zone = ZoneInfo(self.zone)
        day = now.astimezone(zone).date()
        due = datetime.combine(day, self.by, zone)
        if due > now:
            due = datetime.combine(day - timedelta(days=1), self.by, zone)
        start = datetime.combine(due.date(), self.after, zone)
        if start >= due:
            start = datetime.combine(due.date() - timedelta(days=1), self.after, zone)
        return due.astimezone(timezone.utc), start.astimezone(timezone.utc)

    def __str__(self) -> str:
        return f"{self.by:%H:%M} {self.zone}"


def _clock_time(value: object, field_name: str) -> time:
    try:
        return time.fromisoformat(str(value))
    except ValueError as exc:
        raise ValueError(f"{field_name}: {value!r} is not a time of day HH:MM") from exc


@dataclass(frozen=True)
class JobAlertPolicy:
    failed: bool = True
    trigger_error_after: timedelta | None = timedelta(minutes=10)
    run_longer_than: timedelta | None = None
    deadline: Deadline | None = None


@dataclass(frozen=True)
class SourceAlertPolicy:
    sensing_error_after: timedelta | None = timedelta(minutes=15)
    new_data_every: timedelta | None = None


#: per kind: (required settings, optional settings, secret settings with whether each is required).
#: A secret setting ``s`` is written ``s: {secret: scope/key}``, ``s: {env: NAME}`` or ``s_env: NAME``.
_DESTINATION_FIELDS: dict[DestinationKind, tuple[set[str], set[str], dict[str, bool]]] = {
    DestinationKind.WEBHOOK: (set(), set(), {"url": True}),
    DestinationKind.PAGERDUTY: (set(), {"url"}, {"routing_key": True}),
    DestinationKind.EMAIL: ({"host", "from", "to"}, {"port", "starttls", "ca_file"},
                            {"username": False, "password": False}),
}


@dataclass(frozen=True)
class AlertPolicies:
    """The ``alerts:`` section. ``enabled`` is False when the file has none: then nothing is evaluated."""

    enabled: bool = False
    job_default: JobAlertPolicy = JobAlertPolicy()
    jobs: Mapping[str, JobAlertPolicy] = field(default_factory=dict)
    source_default: SourceAlertPolicy = SourceAlertPolicy()
    sources: Mapping[str, SourceAlertPolicy] = field(default_factory=dict)
    destinations: tuple[Destination, ...] = ()
    #: at most one message per destination per interval; what comes meanwhile goes out as one digest
    group_interval: timedelta = timedelta(minutes=5)
    #: ``check`` raises "runner not ticking" after this long without a tick (None: 3 intervals + 1 minute)
    not_ticking_after: timedelta | None = None

    def for_job(self, job_id: str) -> JobAlertPolicy:
        return self.jobs.get(job_id, self.job_default)

    def for_source(self, source_key: str) -> SourceAlertPolicy:
        """By the source's key, or by ``sensor_source:sensor_id`` (the key without its query hash)."""
        return self.sources.get(source_key) or self.sources.get(source_key.split("#")[0], self.source_default)


_JOB_FIELDS = {"failed", "trigger_error_after", "run_longer_than", "deadline"}
_SOURCE_FIELDS = {"sensing_error_after", "new_data_every"}


def alert_policies(data: Mapping[str, Any]) -> AlertPolicies:
    """The ``alerts:`` section of a run-policy mapping; ValueError naming every bad field (``alerts.jobs.444.deadline``)."""
    section = data.get("alerts")
    if section is None:
        return AlertPolicies()
    if not isinstance(section, Mapping):
        raise ValueError("alerts: must be a mapping")
    problems: list[str] = []
    unknown = set(section) - {"default", "jobs", "sources", "destinations", "group_interval", "runner"}
    if unknown:
        problems.append(f"alerts: unknown setting(s) {', '.join(sorted(map(str, unknown)))}")
    default = _mapping(section.get("default"), "alerts.default", problems)
    job_default = _job_policy(_mapping(default.get("job"), "alerts.default.job", problems), JobAlertPolicy(),
                              "alerts.default.job", problems)
    source_default = _source_policy(_mapping(default.get("source"), "alerts.default.source", problems),
                                    SourceAlertPolicy(), "alerts.default.source", problems)
    jobs = {str(k): _job_policy(_mapping(v, f"alerts.jobs.{k}", problems), job_default, f"alerts.jobs.{k}", problems)
            for k, v in _mapping(section.get("jobs"), "alerts.jobs", problems).items()}
    sources = {str(k): _source_policy(_mapping(v, f"alerts.sources.{k}", problems), source_default,
                                      f"alerts.sources.{k}", problems)
               for k, v in _mapping(section.get("sources"), "alerts.sources", problems).items()}
    destinations = [_destination(str(k), _mapping(v, f"alerts.destinations.{k}", problems), problems)
                    for k, v in _mapping(section.get("destinations"), "alerts.destinations", problems).items()]
    runner = _mapping(section.get("runner"), "alerts.runner", problems)
    group = _checked(problems, lambda: parse_duration(section.get("group_interval", "5m"), "alerts.group_interval"))
    not_ticking = _checked(problems, lambda: parse_duration(runner.get("not_ticking_after"),
                                                            "alerts.runner.not_ticking_after"))
    if set(default) - {"job", "source"}:
        problems.append("alerts.default: expected only 'job' and 'source'")
    if set(runner) - {"not_ticking_after"}:
        problems.append("alerts.runner: expected only 'not_ticking_after'")
    if problems:
        raise ValueError("; ".join(problems))
    return AlertPolicies(enabled=True, job_default=job_default, jobs=jobs, source_default=source_default,
                         sources=sources, destinations=tuple(d for d in destinations if d is not None),
                         group_interval=group or timedelta(0), not_ticking_after=not_ticking)


def _checked(problems: list[str], parse: Any) -> Any:
    try:
        return parse()
    except ValueError as exc:
        problems.append(str(exc))
        return None


def _mapping(value: object, field_name: str, problems: list[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{field_name}: must be a mapping")
        return {}
    return value


def _job_policy(values: Mapping[str, Any], base: JobAlertPolicy, name: str, problems: list[str]) -> JobAlertPolicy:
    _unknown(values, _JOB_FIELDS, name, problems)
    failed = values.get("failed", base.failed)
    if not isinstance(failed, bool):
        problems.append(f"{name}.failed: must be true or false")
        failed = base.failed
    return JobAlertPolicy(
        failed=failed,
        trigger_error_after=_setting(values, "trigger_error_after", base.trigger_error_after, name, problems),
        run_longer_than=_setting(values, "run_longer_than", base.run_longer_than, name, problems),
        deadline=(_checked(problems, lambda: Deadline.parse(values["deadline"], f"{name}.deadline"))
                  if values.get("deadline") else None if "deadline" in values else base.deadline))


def _source_policy(values: Mapping[str, Any], base: SourceAlertPolicy, name: str,
                   problems: list[str]) -> SourceAlertPolicy:
    _unknown(values, _SOURCE_FIELDS, name, problems)
    return SourceAlertPolicy(
        sensing_error_after=_setting(values, "sensing_error_after", base.sensing_error_after, name, problems),
        new_data_every=_setting(values, "new_data_every", base.new_data_every, name, problems))


def _setting(values: Mapping[str, Any], key: str, base: timedelta | None, name: str,
             problems: list[str]) -> timedelta | None:
    if key not in values:
        return base
    return _checked(problems, lambda: parse_duration(values[key], f"{name}.{key}"))


def _unknown(values: Mapping[str, Any], allowed: set[str], name: str, problems: list[str]) -> None:
    unknown = set(values) - allowed
    if unknown:
        problems.append(f"{name}: unknown setting(s) {', '.join(sorted(map(str, unknown)))} "
                        f"(expected {', '.join(sorted(allowed))})")


#: the name of an environment variable (what every ``{env: NAME}`` / ``*_env`` reference holds)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: a Databricks ``scope/key``: a scope of letters, digits, ``-_.@``, a key of letters, digits, ``-_.`` (128 at most)
_SCOPE_KEY = re.compile(r"^[A-Za-z0-9_.@-]{1,128}/[A-Za-z0-9_.-]{1,128}$")
#: an e-mail address: one ``@``, no spaces, a domain (``localhost`` too, for a relay)
_ADDRESS = re.compile(r"^[^@\s<>,;\\\"]+@[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")
def _address_problem(value: object, field_name: str) -> str | None:
    if isinstance(value, str) and _ADDRESS.match(value.strip()):
        return None
    return f"{field_name}: {value!r} is not an e-mail address (name@domain)"


def _destination(name: str, values: Mapping[str, Any], problems: list[str]) -> Destination | None:
    """One destination, checked as far as the file goes (``destination_problems`` checks the environment).

    Invariant: no problem quotes a secret setting (``url``, ``routing_key``, ``username``, ``password``, each
    ``*_env``), a reference's name when it is malformed, or a PagerDuty ``url``: an operator who pasted a
    secret there instead of a reference must not see it printed back."""
    where = f"alerts.destinations.{name}"
    try:
        kind = DestinationKind(str(values.get("type")))
    except ValueError:
        problems.append(f"{where}.type: {values.get('type')!r} is not one of "
                        f"{', '.join(k.value for k in DestinationKind)}")
        return None
    before = len(problems)
    required, optional, secret_settings = _DESTINATION_FIELDS[kind]
    missing = sorted(required - set(values))
    missing += [f"{s}_env or {s}: {{secret: scope/key}}" for s, needed in secret_settings.items()
                if needed and s not in values and f"{s}_env" not in values]
    if missing:
        problems.append(f"{where}: a {kind.value} destination needs {', '.join(missing)}")
    allowed = required | optional | set(secret_settings) | {f"{s}_env" for s in secret_settings}
    _unknown({k: v for k, v in values.items() if k != "type"}, allowed, where, problems)
    secrets = {s: _secret_setting(values, s, where, problems) for s in secret_settings}
    if missing:
        return None
    if kind is DestinationKind.PAGERDUTY and "url" in values and not is_web_url(values["url"]):
        problems.append(f"{where}.url: not an http or https URL with a host (the value is not shown)")
    to = values.get("to", ())
    if kind is DestinationKind.EMAIL:
        host = values.get("host")
        if not isinstance(host, str) or not host.strip() or "/" in host or any(c.isspace() for c in host):
            problems.append(f"{where}.host: {host!r} is not a host name or address")
        problems.extend(p for p in [_address_problem(values.get("from"), f"{where}.from")] if p)
        listed = [to] if isinstance(to, str) else to if isinstance(to, (list, tuple)) else None
        if not listed:
            problems.append(f"{where}.to: must be an e-mail address or a list of them")
        else:
            problems.extend(p for p in (_address_problem(a, f"{where}.to") for a in listed) if p)
        given = {s for s in ("username", "password") if s in values or f"{s}_env" in values}
        if len(given) == 1:
            problems.append(f"{where}: username and password go together (SMTP login needs both; each written "
                            "{secret: scope/key}, {env: NAME} or as username_env / password_env)")
        if "starttls" in values and not isinstance(values["starttls"], bool):
            problems.append(f"{where}.starttls: must be true or false")
    port = values.get("port", 587)
    if isinstance(port, bool) or not isinstance(port, (int, str)) or not str(port).isdigit() \
            or not 0 < int(port) < 65536:
        problems.append(f"{where}.port: {values.get('port')!r} is not a port number (1-65535)")
    if len(problems) > before:
        return None
    port = int(port)
    endpoint = values.get("url", PAGERDUTY_URL) if kind is DestinationKind.PAGERDUTY else PAGERDUTY_URL
    return Destination(name=name, kind=kind, url_secret=secrets.get("url"), url=str(endpoint),
                       routing_key_secret=secrets.get("routing_key"), host=str(values.get("host", "")), port=port,
                       sender=str(values.get("from", "")), to=tuple([to] if isinstance(to, str) else to),
                       username_secret=secrets.get("username"), password_secret=secrets.get("password"),
                       starttls=bool(values.get("starttls", True)), ca_file=values.get("ca_file"))


def _secret_setting(values: Mapping[str, Any], setting: str, where: str, problems: list[str]) -> SecretRef | None:
    """The reference a secret setting is written as (``s_env: NAME`` or ``s: {secret|env: ...}``); None when
    absent or wrong (a problem is added: a secret written in the file itself is one, so is a reference that
    is no variable's name or no ``scope/key``; the problem never quotes what was written)."""
    field_name = f"{where}.{setting}"
    if f"{setting}_env" in values:
        if setting in values:
            problems.append(f"{field_name}: give {setting} or {setting}_env, not both")
            return None
        field_name = f"{where}.{setting}_env"
        values = {setting: {SecretKind.ENV.value: values[f"{setting}_env"]}}
    if setting not in values:
        return None
    try:
        ref = parse_reference(values[setting], field_name)
    except InvalidInputError:
        ref = SecretRef(SecretKind(next(iter(values[setting]))), "")
    if ref is None:
        problems.append(f"{field_name}: a secret is never written in the file: write {setting}: "
                        f"{{secret: scope/key}}, {setting}: {{env: NAME}} or {setting}_env: NAME")
    elif ref.kind is SecretKind.ENV and not _ENV_NAME.match(ref.name):
        problems.append(f"{field_name}: must be the name of an environment variable (letters, digits, _) "
                        "that holds the secret, not the secret itself (the value is not shown)")
        return None
    elif ref.kind is SecretKind.SECRET and not _SCOPE_KEY.match(ref.name):
        problems.append(f"{field_name}: {{secret: ...}} must name a scope and a key: {{secret: scope/key}}, "
                        "each letters, digits, - _ . (the value is not shown)")
        return None
    return ref


def destination_problems(destinations: Iterable[Destination], environ: Mapping[str, str]) -> list[str]:
    """What this machine lacks for ``destinations`` to be sent to, as far as it can tell without a network call:
    every ``{env: NAME}`` reference set, a webhook's URL there an http(s) URL with a host, a PagerDuty routing
    key there of the right shape, an email's CA file present. A ``{secret: scope/key}`` reference was checked
    as written when the file loaded; its value is read, and its shape checked, at send time only.

    Invariant: a problem names the destination's setting and the variable, never the variable's value."""
    problems = []
    for destination in destinations:
        where = f"alerts.destinations.{destination.name}"
        for setting in SECRET_SETTINGS:
            ref: SecretRef | None = getattr(destination, f"{setting}_secret")
            if ref is None or ref.kind is not SecretKind.ENV:
                continue
            value = environ.get(ref.name, "")
            shape = secret_shape_problem(setting, value) if value else None
            if not value:
                problems.append(f"{where}.{setting}: environment variable {ref.name} is not set")
            elif shape:
                problems.append(f"{where}.{setting}: environment variable {ref.name} {shape} "
                                "(its value is a secret and not shown)")
        if destination.ca_file is not None and not Path(destination.ca_file).is_file():
            problems.append(f"{where}.ca_file: {destination.ca_file} is not a file")
    return problems


# -- the hot state and the conditions -----------------------------------------------------------


@dataclass
class SourceFacts:
    """What the runner knows of one source, folded forward from each tick."""

    source_key: str
    jobs: set[str] = field(default_factory=set)
    last_new_data: datetime | None = None
    #: since when it is watched (first seen, or its control row's creation): freshness counts from here
    watched_since: datetime | None = None
    failing_since: datetime | None = None
    last_error: str | None = None


@dataclass
class JobFacts:
    """What the runner knows of one job, folded forward from each tick."""

    job_id: str
    hard_sources: set[str] = field(default_factory=set)
    running_since: datetime | None = None
    run_id: str | None = None
    last_completed: datetime | None = None
    failed_run: str | None = None
    failed_at: datetime | None = None
    failure: str | None = None
    #: the failed run was refused by the jobs service (it never executed): a JOB_REFUSED alert, not JOB_FAILED
    refused: bool = False
    output_link: str | None = None
    trigger_error_since: datetime | None = None
    trigger_error: str | None = None
    #: when the job was added (its first control row) and when its current deadline was first seen by a
    #: runner: a deadline is checked from its first occurrence after the later of the two (None: no bound)
    added_at: datetime | None = None
    deadline_since: datetime | None = None
    #: the trigger hold that kept the job back at the latest tick (its ``Hold.describe()`` line), None when none
    #: did: a deadline missed while a hold keeps a ready job waiting names the hold as its root cause
    held: str | None = None


@dataclass
class HotState:
    sources: dict[str, SourceFacts] = field(default_factory=dict)
    jobs: dict[str, JobFacts] = field(default_factory=dict)

    def source(self, key: str) -> SourceFacts:
        return self.sources.setdefault(key, SourceFacts(key))

    def job(self, job_id: str) -> JobFacts:
        return self.jobs.setdefault(job_id, JobFacts(job_id))


#: the kinds whose words follow the condition's current cause while the alert is open (recorded as
#: ALERT_UPDATED when they change): an overdue job's root cause moves on (data arrives, a run starts or
#: fails) at a few moments in the alert's life. Other kinds keep their words as raised: their identity fixes
#: them (a failed run, a run too long), or they quote an upstream error that may differ at every tick.
LIVE_WORDS = frozenset({AlertKind.JOB_OVERDUE})


@dataclass(frozen=True)
class Alert:
    """One condition that holds now. ``identity`` is what it is about; ``key`` also says since when.

    ``cause`` (None for most kinds): the words of ``summary`` after the subject that alerts about several
    jobs can share (``job 7 overdue since …: waiting on …`` has cause ``overdue since …: waiting on …``)."""

    kind: AlertKind
    subject: str
    summary: str
    since: datetime
    period: str = ""
    jobs: tuple[str, ...] = ()
    link: str | None = None
    cause: str | None = None

    @property
    def identity(self) -> str:
        return f"{self.kind.value}|{self.subject}|{self.period}"

    @property
    def key(self) -> str:
        return alert_key(self.identity, self.since)

    @property
    def severity(self) -> Severity:
        return SEVERITY[self.kind]

    @property
    def live_words(self) -> bool:
        """Whether an open alert's summary is kept current (``LIVE_WORDS``) rather than kept as raised."""
        return self.kind in LIVE_WORDS


def alert_key(identity: str, since: datetime) -> str:
    """The deterministic key of the alert with this identity that began at ``since``."""
    return hashlib.sha256(f"{identity}\x1f{since.astimezone(timezone.utc).isoformat()}".encode()).hexdigest()[:32]


def _when(moment: datetime | None) -> str:
    return f"{moment.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC" if moment else "never"


def evaluate(policies: AlertPolicies, state: HotState, now: datetime) -> list[Alert]:
    """Every alert condition that holds at ``now``."""
    if not policies.enabled:
        return []
    return [*_job_alerts(policies, state, now), *_source_alerts(policies, state, now),
            *_deadline_alerts(policies, state, now)]


def _job_alerts(policies: AlertPolicies, state: HotState, now: datetime) -> Iterable[Alert]:
    for job in state.jobs.values():
        policy = policies.for_job(job.job_id)
        if policy.failed and job.failed_run is not None and job.failed_at is not None:
            kind, verb = (AlertKind.JOB_REFUSED, "was refused") if job.refused else (AlertKind.JOB_FAILED, "failed")
            yield Alert(kind, f"job {job.job_id}",
                        f"job {job.job_id}: run {job.failed_run} {verb}: {job.failure or 'no message'}",
                        job.failed_at, period=job.failed_run, jobs=(job.job_id,), link=job.output_link)
        after = policy.trigger_error_after
        if after is not None and job.trigger_error_since is not None and now - job.trigger_error_since >= after:
            yield Alert(AlertKind.TRIGGER_ERROR, f"job {job.job_id}",
                        f"job {job.job_id}: triggering has failed since {_when(job.trigger_error_since)}: "
                        f"{job.trigger_error}", job.trigger_error_since, jobs=(job.job_id,))
        limit = policy.run_longer_than
        if limit is not None and job.running_since is not None and now - job.running_since >= limit:
            yield Alert(AlertKind.RUN_TOO_LONG, f"job {job.job_id}",
                        f"job {job.job_id}: run {job.run_id or '?'} has been running since {_when(job.running_since)} "
                        f"(limit {limit})", job.running_since, period=job.run_id or "", jobs=(job.job_id,))


def _source_alerts(policies: AlertPolicies, state: HotState, now: datetime) -> Iterable[Alert]:
    for source in state.sources.values():
        policy = policies.for_source(source.source_key)
        after = policy.sensing_error_after
        if after is not None and source.failing_since is not None and now - source.failing_since >= after:
            jobs, named = _fed(source)
            yield Alert(AlertKind.SENSING_ERROR, f"source {source.source_key}",
                        f"source {source.source_key} has failed sensing since {_when(source.failing_since)}: "
                        f"{source.last_error}{named}", source.failing_since, jobs=jobs)
        every, last = policy.new_data_every, source.last_new_data or source.watched_since
        if every is None or last is None or now - last < every:
            continue
        jobs, named = _fed(source)
        yield Alert(AlertKind.SOURCE_LATE, f"source {source.source_key}",
                    f"source {source.source_key} is late: no new data since {_when(source.last_new_data)} "
                    f"(expected every {every}){named}", last + every, jobs=jobs)


def _fed(source: SourceFacts) -> tuple[tuple[str, ...], str]:
    """The jobs a source feeds, and the words that name them."""
    jobs = tuple(sorted(source.jobs))
    return jobs, f" (feeds {len(jobs)} job(s): {', '.join(jobs)})" if jobs else ""


@dataclass(frozen=True)
class Overdue:
    """A job past its deadline, and why: the hard sources without new data in the period (its root cause)."""

    job_id: str
    due: datetime
    deadline: Deadline
    late_sources: tuple[str, ...]
    reason: str


def overdue_jobs(policies: AlertPolicies, state: HotState, now: datetime) -> list[Overdue]:
    """Jobs whose latest deadline passed without a run that completed in its period, with the cause."""
    found = []
    periods: dict[Deadline, tuple[datetime, datetime]] = {}  # jobs share a few deadlines: each computed once
    waiting: dict[tuple[str, ...], str] = {}
    for job in state.jobs.values():
        deadline = policies.for_job(job.job_id).deadline
        if deadline is None:
            continue
        if deadline not in periods:
            periods[deadline] = deadline.latest(now)
        due, start = periods[deadline]
        if job.last_completed is not None and job.last_completed >= start:
            continue
        known = [t for t in (job.added_at, job.deadline_since) if t is not None]
        if known and due < max(known):  # this occurrence came before the deadline (or the job) existed
            continue
        late = tuple(sorted(k for k in job.hard_sources
                            if (f := state.sources.get(k)) is None or f.last_new_data is None or f.last_new_data < start
                            or f.failing_since is not None))
        if late and late not in waiting:  # many jobs wait on one source: its words are made once
            waiting[late] = "; ".join(_waiting_on(state.sources.get(key), key) for key in late)
        found.append(Overdue(job.job_id, due, deadline, late,
                             waiting[late] if late else _overdue_reason(job, start)))
    return found


def _overdue_reason(job: JobFacts, start: datetime) -> str:
    """Why a job whose hard sources all have data in the period is still overdue."""
    if job.running_since is not None:
        return f"run {job.run_id or '?'} running since {_when(job.running_since)}"
    if job.failed_run is not None:
        return f"run {job.failed_run} failed: {job.failure or 'no message'}"
    if job.held is not None:
        return f"every hard source has new data since {_when(start)}, but the job is {job.held}"
    return f"every hard source has new data since {_when(start)}, yet no run completed"


def _waiting_on(facts: SourceFacts | None, key: str) -> str:
    if facts is not None and facts.failing_since is not None:
        return f"waiting on {key}, which has failed sensing since {_when(facts.failing_since)}"
    last = facts.last_new_data if facts else None
    return f"waiting on {key}, which has had no new data since {_when(last)}"


def deadline_period(due: datetime) -> str:
    """The period of a JOB_OVERDUE alert: the deadline it is about."""
    return f"{due:%Y-%m-%dT%H:%M}"


def _deadline_alerts(policies: AlertPolicies, state: HotState, now: datetime) -> Iterable[Alert]:
    """One alert per overdue job and deadline period, subject ``job <id>``, saying its current root cause.
    Its identity is the job and the deadline: it stays one alert whatever the cause becomes, until the job
    completes in the period, its deadline is removed or the next deadline replaces it."""
    heads: dict[tuple[Deadline, datetime], tuple[str, str]] = {}  # jobs share a few deadlines: worded once
    for item in sorted(overdue_jobs(policies, state, now), key=lambda o: o.job_id):
        if (item.deadline, item.due) not in heads:
            heads[(item.deadline, item.due)] = (f"overdue since {item.deadline} ({_when(item.due)}): ",
                                                deadline_period(item.due))
        head, period = heads[(item.deadline, item.due)]
        cause = head + item.reason
        yield Alert(AlertKind.JOB_OVERDUE, f"job {item.job_id}", f"job {item.job_id} {cause}", item.due,
                    period=period, jobs=(item.job_id,), cause=cause)
