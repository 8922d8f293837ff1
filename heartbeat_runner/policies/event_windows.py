"""Triggers per finalized event-time window: a job runs once per window of ``size``, when that
window is complete in every hard input.

Each source's **watermark** is the latest event time sensing has seen in it, minus the job's
``lateness``. A window ``[t, t + size)`` is **final** for a job when the smallest watermark over
its hard sources has passed ``t + size`` (soft sources never hold a window back). That rule is
SQL (``heartbeat_job_windows``); this module holds the policy, the planning of final windows into
runs (one run per window with data, oldest first, through the same sequence machinery as bounded
catch-up) and the late-data count. Pure functions and records.

    jobs:
      "hourly_sales": {window: {size: 1h, lateness: 10m, late_data: rerun}}
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from heartbeat_runner.core.durations import DurationError, parse_seconds
from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.core.windows import EventTimes
from heartbeat_runner.policies.run_policy_file import check_section, policy_sections

#: The keys of a job's ``window`` policy.
WINDOW_KEYS = {"size", "lateness", "late_data"}
#: At most this many windows are planned at once (a longer backlog continues at the next plan).
MAX_WINDOWS_PER_PLAN = 500


class LateData(str, enum.Enum):
    """What rows arriving for an already finalized window cause."""

    REPORT = "report"  # counted and shown per source and window
    RERUN = "rerun"    # also: the window runs once more, as a correction run


@dataclass(frozen=True)
class WindowPolicy:
    size_s: int
    lateness_s: int = 0
    late_data: LateData = LateData.REPORT

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> WindowPolicy:
        check_section("window", values, WINDOW_KEYS, "size", "a span such as 1h")
        size = _seconds(values["size"], "size")
        lateness = _seconds(values.get("lateness", "0s"), "lateness", allow_zero=True)
        try:
            late = LateData(str(values.get("late_data", "report")))
        except ValueError:
            raise ValueError(f"window late_data {values.get('late_data')!r}: expected report or rerun") from None
        return cls(size, lateness, late)


def _seconds(value: object, name: str, allow_zero: bool = False) -> int:
    """Whole seconds of a duration with a unit (core/durations.py); ValueError naming the window setting
    otherwise. A bare number other than 0 is refused here, as beside it ``max_window: 10`` is a count."""
    try:
        text = str(value).strip()
        if text.replace(".", "", 1).isdigit() and float(text) != 0:
            raise DurationError(f"{value!r} has no unit")
        seconds = parse_seconds(value, allow_zero=allow_zero)
    except DurationError as exc:
        raise ValueError(f"window {name} {value!r}: expected a span such as 1h, 10m or 1d") from exc
    if seconds != int(seconds) or (seconds < 1 and not allow_zero):
        raise ValueError(f"window {name} {value!r}: expected a whole number of seconds, such as 1h, 10m or 1d")
    return int(seconds)


def window_policies(data: Mapping[str, Any]) -> dict[str, WindowPolicy]:
    """``jobs: {<job id>: {window: {...}}}`` of a run-policy mapping; ValueError for a window under
    ``default`` or a job that also has a catch-up policy."""
    found = policy_sections(data, "window", WindowPolicy.from_mapping)
    if "*" in found:
        raise ValueError("a window belongs to a job, not under 'default'")
    both = sorted(set(found) & set(policy_sections(data, "catch_up", lambda section: section)))
    if both:
        raise ValueError(f"job(s) {', '.join(both)} have both a window and a catch_up policy; a job has one "
                         "or the other")
    return found


def source_grains(policies: Mapping[str, WindowPolicy], sources: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Per source read by a windowed job, the bucket (seconds) sensing counts event times in: the
    smallest window size among the jobs reading it. ConfigError when another size is no multiple of it."""
    sizes: dict[str, set[int]] = {}
    for job_id, source_key in sources:
        if job_id in policies:
            sizes.setdefault(source_key, set()).add(policies[job_id].size_s)
    problems = [f"{key}: window sizes {sorted(found)} s are read from one source, so each must be a multiple "
                f"of the smallest" for key, found in sorted(sizes.items()) if any(s % min(found) for s in found)]
    if problems:
        raise ConfigError(problems)
    return {key: min(found) for key, found in sizes.items()}


@dataclass(frozen=True)
class Window:
    start_s: int
    end_s: int


def final_windows(next_start_s: int, watermark_s: int, size_s: int) -> list[Window]:
    """The windows from ``next_start_s`` whose end the watermark has passed (at most MAX_WINDOWS_PER_PLAN)."""
    windows: list[Window] = []
    start = next_start_s
    while start + size_s <= watermark_s and len(windows) < MAX_WINDOWS_PER_PLAN:
        windows.append(Window(start, start + size_s))
        start += size_s
    return windows


@dataclass(frozen=True)
class LateRows:
    source_key: str
    window_start_s: int
    rows: int


def late_rows(arrivals: Iterable[tuple[datetime, str, EventTimes]], plans: Iterable[tuple[datetime, int]],
              size_s: int) -> list[LateRows]:
    """Rows that arrived (NEW_DATA at ``event_ts``) for a window the job had already planned by then.

    ``plans``: (when, windows planned until) for each plan of the job (a trigger request or a skip).
    """
    ordered = sorted(plans)
    times_planned = [when for when, _ in ordered]
    planned_until = list(itertools.accumulate((until for _, until in ordered), max))  # by then, the furthest plan
    late: dict[tuple[str, int], int] = {}
    for arrived, source_key, times in arrivals:
        earlier = bisect.bisect_left(times_planned, arrived)  # plans strictly before the arrival
        if earlier == 0:
            continue
        until = planned_until[earlier - 1]
        for bucket, n in times.buckets.items():
            if bucket < until:
                start = bucket - bucket % size_s
                late[(source_key, start)] = late.get((source_key, start), 0) + n
    return [LateRows(key, start, n) for (key, start), n in sorted(late.items())]


@dataclass(frozen=True)
class Arrival:
    """One NEW_DATA of a source read by a windowed job: when it was recorded and the event times it saw."""

    event_ts: datetime
    source_key: str
    times: EventTimes


@dataclass(frozen=True)
class WindowLedger:
    """What a windowed job's plans need of its sources' arrivals up to ``through`` (the latest one read),
    carried in the payload of each plan, skip and correction event so that the next plan reads only the
    arrivals after it (the hot log holds them) instead of every arrival since the job began.

    ``sources``: the job's sources it counts (another set of sources needs a new ledger);
    ``until_s``: the end of the furthest window planned (None before the first plan);
    ``ahead``: rows per source and event-time bucket at or after ``until_s`` (the windows still to plan);
    ``pending``: starts of planned windows that got late rows and no correction run yet (``rerun`` jobs).

    Invariant: the ledger after arrivals A then B equals the ledger after A + B, and it equals what
    ``late_rows`` and ``rows_in`` derive from the job's whole history (tests/test_event_windows.py).
    """

    sources: tuple[str, ...] = ()
    through: datetime | None = None
    until_s: int | None = None
    ahead: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    pending: tuple[int, ...] = ()

    def advance(self, arrivals: Iterable[Arrival], size_s: int, track_late: bool) -> WindowLedger:
        """The ledger after ``arrivals`` (recorded after ``through``, none planned since): rows for windows
        already planned are late (their windows pending a correction when ``track_late``), the others ahead."""
        ahead = {key: dict(buckets) for key, buckets in self.ahead.items()}
        pending, through = set(self.pending), self.through
        for arrival in sorted(arrivals, key=lambda a: a.event_ts):
            for bucket, rows in arrival.times.buckets.items():
                if self.until_s is not None and bucket < self.until_s:
                    if track_late:
                        pending.add(bucket - bucket % size_s)
                else:
                    mine = ahead.setdefault(arrival.source_key, {})
                    mine[bucket] = mine.get(bucket, 0) + rows
            through = arrival.event_ts if through is None else max(through, arrival.event_ts)
        return replace(self, through=through, ahead=ahead, pending=tuple(sorted(pending)))

    def rows_in(self, window: Window) -> int:
        """Rows of every source with an event time inside ``window`` (a window not planned yet)."""
        return sum(n for buckets in self.ahead.values() for start, n in buckets.items()
                   if window.start_s <= start < window.end_s)

    def planned(self, until_s: int) -> WindowLedger:
        """After a plan up to ``until_s``: the rows of the planned windows leave ``ahead``."""
        until = until_s if self.until_s is None else max(self.until_s, until_s)
        ahead = {key: {b: n for b, n in buckets.items() if b >= until} for key, buckets in self.ahead.items()}
        return replace(self, until_s=until, ahead={k: v for k, v in ahead.items() if v})

    def corrected(self, window_start_s: int) -> WindowLedger:
        """After the correction run of the window starting at ``window_start_s`` was requested."""
        return replace(self, pending=tuple(p for p in self.pending if p != window_start_s))

    def payload(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "through": self.through.isoformat() if self.through else None,
                "until_s": self.until_s,
                "ahead": {key: {str(b): n for b, n in sorted(buckets.items())} for key, buckets in sorted(self.ahead.items())},
                "pending": list(self.pending)}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> WindowLedger:
        through = data.get("through")
        until = data.get("until_s")
        return cls(tuple(str(k) for k in data.get("sources") or ()),
                   datetime.fromisoformat(through) if through else None, int(until) if until is not None else None,
                   {str(k): {int(b): int(n) for b, n in v.items()} for k, v in (data.get("ahead") or {}).items()},
                   tuple(int(p) for p in data.get("pending") or ()))


def ledger_from_history(sources: Iterable[str], arrivals: Iterable[Arrival], plans: Iterable[tuple[datetime, int]],
                        corrected: set[int], size_s: int, track_late: bool) -> WindowLedger:
    """The ledger of a job replayed from its whole history: every arrival of its ``sources`` and every
    plan (when, planned until) in time order (an arrival at the very time of a plan came before it),
    less the windows whose correction was already requested (their starts: ``corrected``)."""
    ledger = WindowLedger(tuple(sorted(sources)))
    ordered = sorted(arrivals, key=lambda a: a.event_ts)
    times, done = [a.event_ts for a in ordered], 0
    for when, until in sorted(plans):
        cut = bisect.bisect_right(times, when, lo=done)
        ledger = ledger.advance(ordered[done:cut], size_s, track_late).planned(until)
        done = cut
    ledger = ledger.advance(ordered[done:], size_s, track_late)
    return replace(ledger, pending=tuple(p for p in ledger.pending if p not in corrected))


def window_token(job_id: str, window: Window, correction: bool = False) -> str:
    """Idempotency token of the run of ``window`` (or of its one correction run): exactly once per window."""
    kind = "correction" if correction else "window"
    return hashlib.sha256(f"{job_id}\x1f{kind}\x1f{window.start_s}\x1f{window.end_s}".encode()).hexdigest()[:36]
