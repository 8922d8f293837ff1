"""Trigger shaping: per-job holds on a ready job's start (issue 57), and pools with priorities.

The run-policy file, per job or under ``default:``, and at its top::

    pools:
      warehouse: {max_running: 2}
    jobs:
      "J1":
        trigger:
          min_interval: 15m     # no sooner than this after the job's previous run started
          quiet_for: 2m         # only once its sources had no new data for this long ...
          max_wait: 30m         # ... but never hold data longer than this after its first unconsumed arrival
          at: "0 6 * * * Europe/Berlin"   # only at or after a fire time of this 5-field cron, once per fire
          pool: warehouse       # counts against the pool's max_running
          priority: 10          # higher first when the pool has room; ties: oldest waiting data first

Opt-in: a file without ``trigger:`` and ``pools:`` changes nothing (the tick does not even read the facts
the holds need). Durations use the project's one grammar (core/durations.py).

Where the rule lives: a clearly documented Python step (``hold_decisions``), applied by the triggering step
(runner/triggering.py) to the rows of ``jobs_ready_to_trigger``, not a SQL view, because (1) a cron gate needs the
cron's fire times, which Spark SQL cannot compute; (2) a pool's places go to the highest priorities among the
jobs no *other* hold keeps back, so the pool rule must run after the cron gate, in the same step; (3) the
holds compare times with the runner's clock (an injected ``now``), which a test can set, and which a view
could only read as ``current_timestamp()`` of the engine. The facts the step reads (the job's previous start,
its first and latest unconsumed arrival) come from the control table and the events table, so a held job's
data stays in its rows untouched and the run that the hold releases consumes all of it.

Pure functions and records: the tick is the only place with side effects.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from heartbeat_runner.core.durations import DurationError, parse_seconds

#: the payload key of a trigger request that records why the holds let it start (not sent to the job)
RELEASE_KEY = "_release"
#: the keys of a job's ``trigger`` section and of a pool
TRIGGER_KEYS = {"min_interval", "quiet_for", "max_wait", "at", "pool", "priority"}
POOL_KEYS = {"max_running"}


class HoldKind(str, enum.Enum):
    """What keeps a ready job from starting."""

    MIN_INTERVAL = "min_interval"
    QUIET = "quiet_for"
    AT = "at"
    POOL = "pool"


class ReleaseReason(str, enum.Enum):
    """Why a shaped job was let start (recorded with its trigger request, ``_release``)."""

    INTERVAL_PASSED = "interval passed"
    QUIET = "quiet"
    MAX_WAIT = "max_wait reached"
    FIRE_TIME = "fire time"
    POOL_ROOM = "pool room"
    OPERATOR = "operator's run"


# -- cron ----------------------------------------------------------------------------------------

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
#: how far back or ahead a fire time is looked for (a cron such as "0 0 30 2 *" never fires)
_CRON_SEARCH_DAYS = 366 * 5


def _cron_field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    """The values of one cron field: ``*``, ``n``, ``a-b``, ``*/s``, ``a-b/s``, comma lists. ValueError
    naming the field when a value is out of its range."""
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                first, last = low, high
            elif "-" in body:
                a, b = body.split("-", 1)
                first, last = int(a), int(b)
            else:
                first = last = int(body)
        except ValueError:
            raise ValueError(f"cron {name} {part!r} is not a number, range or step") from None
        if step < 1 or not (low <= first <= high and low <= last <= high) or first > last:
            raise ValueError(f"cron {name} {part!r} is out of range {low}-{high}")
        if step_text and "-" not in body and body != "*":
            last = high  # "5/15": from 5 every 15
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    """A 5-field cron (minute hour day-of-month month day-of-week) in a time zone (UTC unless named, as in
    deadlines). Day of month and day of week combine as in cron: when both are restricted, either matches.

    A small matcher rather than a dependency (croniter is not installed): fire times are found a day at a
    time, so the latest or next one is a few hundred steps at most."""

    text: str
    zone: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday (7 is read as 0)
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, value: object) -> Cron:
        """``"0 6 * * *"`` or ``"0 6 * * 1-5 Europe/Berlin"``; ValueError saying what is wrong."""
        parts = str(value).split()
        if len(parts) not in (5, 6):
            raise ValueError(f"{value!r} is not a 5-field cron (minute hour day-of-month month day-of-week), "
                             "optionally followed by a time zone")
        zone = parts[5] if len(parts) == 6 else "UTC"
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {zone!r}") from None
        sets = [_cron_field(text, name, low, high) for text, (name, low, high) in zip(parts[:5], _FIELDS)]
        weekdays = frozenset(0 if d == 7 else d for d in sets[4])
        return cls(" ".join(parts[:5]), zone, sets[0], sets[1], sets[2], sets[3], weekdays,
                   parts[2] == "*", parts[4] == "*")

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        in_month, in_week = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def _times(self, day: datetime) -> list[datetime]:
        """The fire times of the local ``day`` (UTC), in order."""
        zone = ZoneInfo(self.zone)
        return sorted(datetime(day.year, day.month, day.day, h, m, tzinfo=zone).astimezone(timezone.utc)
                      for h in sorted(self.hours) for m in sorted(self.minutes))

    def latest(self, now: datetime) -> datetime | None:
        """The latest fire time at or before ``now`` (UTC), None when there is none in the search span."""
        local = now.astimezone(ZoneInfo(self.zone))
        for back in range(_CRON_SEARCH_DAYS):
            day = local - timedelta(days=back)
            if self._day_matches(day):
                past = [t for t in self._times(day) if t <= now]
                if past:
                    return past[-1]
        return None

    def next(self, now: datetime) -> datetime | None:
        """The first fire time after ``now`` (UTC)."""
        local = now.astimezone(ZoneInfo(self.zone))
        for ahead in range(_CRON_SEARCH_DAYS):
            day = local + timedelta(days=ahead)
            if self._day_matches(day):
                later = [t for t in self._times(day) if t > now]
                if later:
                    return later[0]
        return None

    def __str__(self) -> str:
        return f"{self.text} {self.zone}"


# -- the sections -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TriggerPolicy:
    min_interval_s: float = 0.0
    quiet_for_s: float = 0.0
    max_wait_s: float | None = None
    at: Cron | None = None
    pool: str | None = None
    priority: int = 0

    @property
    def holds_in_time(self) -> bool:
        return bool(self.min_interval_s or self.quiet_for_s or self.at)


@dataclass(frozen=True)
class TriggerShaping:
    """Every job's trigger policy (``"*"``: the default) and the pools."""

    jobs: Mapping[str, TriggerPolicy] = field(default_factory=dict)
    pools: Mapping[str, int] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.jobs)

    def for_job(self, job_id: str) -> TriggerPolicy | None:
        return self.jobs.get(job_id, self.jobs.get("*"))

    def table_rows(self, job_ids: Iterable[str]) -> dict[str, tuple]:
        """The rows of heartbeat_trigger_policies for ``job_ids`` (the default applied to each job it covers):
        job -> (min_interval_s, quiet_for_s, max_wait_s, at_cron, pool, pool_max_running, priority)."""
        rows: dict[str, tuple] = {}
        for job in sorted(set(job_ids)):
            policy = self.for_job(job)
            if policy is not None:
                rows[job] = (policy.min_interval_s or None, policy.quiet_for_s or None, policy.max_wait_s,
                             str(policy.at) if policy.at else None, policy.pool,
                             self.pools.get(policy.pool) if policy.pool else None, policy.priority)
        return rows


def _where(job: str) -> str:
    return "default.trigger" if job == "*" else f"jobs.{job}.trigger"


def _duration(values: Mapping[str, Any], key: str, where: str) -> float:
    try:
        return parse_seconds(values[key], allow_zero=False)
    except DurationError as exc:
        raise ValueError(f"{where}.{key}: {exc}") from None


def trigger_policy(values: object, where: str, pools: Mapping[str, int]) -> TriggerPolicy:
    """One ``trigger`` section (``where`` names it in errors: ``jobs.J1.trigger``); ValueError naming the field."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: expected a mapping of {', '.join(sorted(TRIGGER_KEYS))}")
    unknown = set(values) - TRIGGER_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(sorted(map(str, unknown)))}")
    min_interval = _duration(values, "min_interval", where) if "min_interval" in values else 0.0
    quiet = _duration(values, "quiet_for", where) if "quiet_for" in values else 0.0
    max_wait = _duration(values, "max_wait", where) if "max_wait" in values else None
    if max_wait is not None and not quiet:
        raise ValueError(f"{where}.max_wait: needs quiet_for (max_wait only ends a quiet period early)")
    at = None
    if "at" in values:
        try:
            at = Cron.parse(values["at"])
        except ValueError as exc:
            raise ValueError(f"{where}.at: {exc}") from None
    pool = values.get("pool")
    if pool is not None and str(pool) not in pools:
        known = ", ".join(sorted(pools)) or "none"
        raise ValueError(f"{where}.pool: unknown pool {pool!r} (pools: {known})")
    try:
        priority = values.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, (int, str)):
            raise ValueError
        priority = int(priority)
    except ValueError:
        raise ValueError(f"{where}.priority: {values.get('priority')!r} is not a whole number") from None
    return TriggerPolicy(min_interval, quiet, max_wait, at, None if pool is None else str(pool), priority)


def _pools(data: Mapping[str, Any]) -> dict[str, int]:
    section = data.get("pools") or {}
    if not isinstance(section, Mapping):
        raise ValueError("pools: expected a mapping of pool names to {max_running: N}")
    pools: dict[str, int] = {}
    for name, values in section.items():
        where = f"pools.{name}"
        if not isinstance(values, Mapping) or "max_running" not in values:
            raise ValueError(f"{where}: expected {{max_running: N}}")
        unknown = set(values) - POOL_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown setting(s) {', '.join(sorted(map(str, unknown)))}")
        value = values["max_running"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}.max_running: {value!r} is not a whole number of at least 1")
        pools[str(name)] = value
    return pools


def trigger_shaping(data: Mapping[str, Any]) -> TriggerShaping:
    """The ``trigger`` sections and ``pools`` of a run-policy mapping; ValueError naming the job and field."""
    pools = _pools(data)
    sections: dict[str, object] = {}
    jobs = data.get("jobs") or {}
    if isinstance(jobs, Mapping):
        sections = {str(job): values["trigger"] for job, values in jobs.items()
                    if isinstance(values, Mapping) and values.get("trigger") is not None}
    default = data.get("default")
    if isinstance(default, Mapping) and default.get("trigger") is not None:
        sections["*"] = default["trigger"]
    return TriggerShaping({job: trigger_policy(values, _where(job), pools) for job, values in sections.items()},
                          pools)


# -- the holds ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A run the tick could request for a job with a trigger policy, and the facts its holds read (UTC).

    ``last_start``: the job's latest trigger request (any kind); ``first_arrival`` / ``last_arrival``: when its
    oldest and newest unconsumed new data were recorded; ``added_at``: its first control row; ``operator``: an
    operator's ``trigger`` or ``retry`` (skips the time holds, counts against the pool)."""

    job_id: str
    last_start: datetime | None = None
    first_arrival: datetime | None = None
    last_arrival: datetime | None = None
    added_at: datetime | None = None
    operator: bool = False
    #: an automatic retry (or another follow-up run): keeps the minimum interval and the pool only
    follow_up: bool = False

    def with_facts(self, facts: Mapping[str, Any]) -> Candidate:
        """This candidate with the facts read for it (a row of heartbeat_job_trigger_facts; absent: none)."""
        return replace(self, last_start=facts.get("last_start"), first_arrival=facts.get("first_arrival"),
                       last_arrival=facts.get("last_arrival"), added_at=facts.get("added_at"))


@dataclass(frozen=True)
class Hold:
    job_id: str
    kind: HoldKind
    until: datetime | None  # None: until a running job of the pool ends
    detail: str

    def describe(self) -> str:
        when = f" until {self.until.isoformat(timespec='seconds')}" if self.until else ""
        return f"held by {self.kind.value}{when}: {self.detail}"


@dataclass(frozen=True)
class Decisions:
    """The candidates let start now, each with its release reasons, and the others with their first hold."""

    released: dict[str, tuple[ReleaseReason, ...]] = field(default_factory=dict)
    held: dict[str, Hold] = field(default_factory=dict)


#: a cron gate's latest and next fire time around the tick's ``now`` (the same for every job it gates), by the
#: gate's text and zone (``str(cron)``: each job's policy holds its own parsed copy)
FireTimes = Mapping[str, tuple[datetime | None, datetime | None]]


def _time_hold(policy: TriggerPolicy, c: Candidate, now: datetime,
               fires: FireTimes) -> tuple[Hold | None, list[ReleaseReason]]:
    """The first time hold of ``c`` (minimum interval, quiet period, cron gate), or the reasons they allow it.
    ``fires``: each cron gate's fire times around ``now``."""
    reasons: list[ReleaseReason] = []
    if c.operator:
        return None, [ReleaseReason.OPERATOR]
    if policy.min_interval_s:
        if c.last_start is not None:
            until = c.last_start + timedelta(seconds=policy.min_interval_s)
            if now < until:
                return Hold(c.job_id, HoldKind.MIN_INTERVAL, until,
                            f"previous run started {c.last_start.isoformat(timespec='seconds')}, "
                            f"min_interval {policy.min_interval_s:g}s"), reasons
        reasons.append(ReleaseReason.INTERVAL_PASSED)
    if c.follow_up:
        return None, reasons
    if policy.quiet_for_s and c.last_arrival is not None:
        quiet_until = c.last_arrival + timedelta(seconds=policy.quiet_for_s)
        cap = (c.first_arrival + timedelta(seconds=policy.max_wait_s)
               if policy.max_wait_s is not None and c.first_arrival is not None else None)
        if now < quiet_until and (cap is None or now < cap):
            until = quiet_until if cap is None else min(quiet_until, cap)
            return Hold(c.job_id, HoldKind.QUIET, until,
                        f"new data at {c.last_arrival.isoformat(timespec='seconds')}, quiet_for "
                        f"{policy.quiet_for_s:g}s" + (f", max_wait {policy.max_wait_s:g}s" if cap else "")), reasons
        reasons.append(ReleaseReason.QUIET if now >= quiet_until else ReleaseReason.MAX_WAIT)
    if policy.at is not None:
        fired, upcoming = fires[str(policy.at)]
        since = c.last_start or c.added_at
        if fired is None or (since is not None and fired <= since):
            return Hold(c.job_id, HoldKind.AT, upcoming,
                        f"no fire time of '{policy.at}' since " + (since.isoformat(timespec='seconds')
                                                                 if since else "ever")), reasons
        reasons.append(ReleaseReason.FIRE_TIME)
    return None, reasons


def hold_decisions(shaping: TriggerShaping, candidates: Sequence[Candidate], running: Iterable[str],
                   now: datetime) -> Decisions:
    """Which ``candidates`` start now. ``running``: the jobs IN_PROGRESS (they fill their pools).

    The rule: a candidate starts when every hold allows it — its minimum interval has passed, its data has
    been quiet for ``quiet_for`` or waited ``max_wait``, a fire time of ``at`` has come since its previous
    start (or since it was added), and its pool has room. An operator's run skips the first three; an automatic
    retry keeps the minimum interval and the pool. A pool's
    room goes to the candidates no time hold keeps back, highest priority first, then oldest waiting data,
    then job id. A candidate without a policy is released with no reason (the tick leaves it as it was).

    Cost: one pass over the candidates and a sort per pool; each cron gate's fire times are found once per call,
    not once per job (benchmarks/trigger_shaping.py: 10,000 jobs against a 50 ms target)."""
    decisions = Decisions()
    by_pool: dict[str, list[tuple[Candidate, TriggerPolicy, list[ReleaseReason]]]] = {}
    crons = {str(policy.at): policy.at for policy in shaping.jobs.values() if policy.at is not None}
    fires = {text: (cron.latest(now), cron.next(now)) for text, cron in crons.items()}
    default = shaping.for_job("*")
    for c in candidates:
        policy = shaping.jobs.get(c.job_id, default)  # shaping.for_job, its default looked up once
        if policy is None:
            decisions.released[c.job_id] = ()
            continue
        hold, reasons = _time_hold(policy, c, now, fires)
        if hold is not None:
            decisions.held[c.job_id] = hold
        elif policy.pool is None:
            decisions.released[c.job_id] = tuple(reasons)
        else:
            by_pool.setdefault(policy.pool, []).append((c, policy, reasons))
    if by_pool:
        in_pool: dict[str, list[str]] = {}
        for job in running:
            policy = shaping.for_job(job)
            if policy is not None and policy.pool is not None:
                in_pool.setdefault(policy.pool, []).append(job)
        far = datetime.max.replace(tzinfo=timezone.utc)
        for pool, waiting in sorted(by_pool.items()):
            busy = sorted(in_pool.get(pool, []))
            room = shaping.pools[pool] - len(busy)
            waiting.sort(key=lambda w: (-w[1].priority, w[0].first_arrival or far, w[0].job_id))
            ahead = [w[0].job_id for w in waiting[:max(room, 0)]]
            full = f"pool {pool} full ({shaping.pools[pool]} running at most): running {', '.join(busy + ahead) or 'none'}"
            for rank, (c, _, reasons) in enumerate(waiting):
                if rank < room:
                    decisions.released[c.job_id] = (*reasons, ReleaseReason.POOL_ROOM)
                else:
                    decisions.held[c.job_id] = Hold(c.job_id, HoldKind.POOL, None, full)
    return decisions
