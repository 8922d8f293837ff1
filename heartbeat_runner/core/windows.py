"""Windows of source data: how much one run may cover, and one source's part of a run.

A leaf module: the sources cut their pending data into ``SourceWindow`` pieces no larger
than a ``WindowLimit`` (``Source.split``); the run policies plan runs from the pieces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from heartbeat_runner.core.durations import DurationError, parse_duration


@dataclass(frozen=True)
class WindowLimit:
    """The most one run may cover: a count (Delta versions, Kafka offsets per partition, key units)
    or a time span (a date or timestamp key, SAP load dates)."""

    count: int | None = None
    span: timedelta | None = None

    @classmethod
    def parse(cls, value: object) -> WindowLimit:
        """``10`` (a count) or a duration with a unit, ``7d`` / ``12h`` / ``1.5h`` / ``90s`` / ``2w`` (a span; the
        grammar of core/durations.py, where a plain number is a count here); ValueError otherwise."""
        if isinstance(value, bool):
            raise ValueError(f"max_window {value!r}: expected a count such as 10 or a span such as 7d")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            count = int(value)
            if count < 1:
                raise ValueError(f"max_window {value!r}: a count must be at least 1")
            return cls(count=count)
        try:
            span = parse_duration(value, allow_zero=False)
        except DurationError as exc:
            raise ValueError(f"max_window {value!r}: expected a count such as 10 or a span such as 7d, 12h, 30m") from exc
        if span < timedelta(seconds=1):
            raise ValueError(f"max_window {value!r}: a span must be at least 1s")
        return cls(span=span)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.span}"


#: key of the cut points in a NEW_DATA event's payload (SenseResult.cut_points)
CUT_POINTS_KEY = "cut_points"


@dataclass(frozen=True)
class SourceWindow:
    """One source's part of one run: its bounds as cursors (machine) and as text (the job's parameters)."""

    sensor_source: str
    sensor_id: str
    cursor_from: str | None
    cursor_to: str | None
    window_from: str | None
    window_to: str | None

    #: cursors in (cursor_from, cursor_to] where the source may be cut (a backlog's, for ``split``);
    #: not part of a run's recorded window
    cut_points: tuple[str, ...] = ()

    def parameter(self) -> dict[str, str | None]:
        """As the job receives it in ``heartbeat_windows``."""
        return {"sensor_source": self.sensor_source, "sensor_id": self.sensor_id,
                "from": self.window_from, "to": self.window_to}

    def record(self) -> dict[str, str | None]:
        """As a sequence plan records it (``SourceWindow(**record)`` restores it)."""
        return {"sensor_source": self.sensor_source, "sensor_id": self.sensor_id, "cursor_from": self.cursor_from,
                "cursor_to": self.cursor_to, "window_from": self.window_from, "window_to": self.window_to}


@dataclass(frozen=True)
class WindowBounds:
    """One source's part of a run in the job's terms (the structured job parameter): new data is after
    ``lower`` up to and including ``upper``; ``lower`` None: from the beginning. ``kind`` says what the
    bounds are: ``delta_version`` (ints), ``key`` (values of the upstream key, as text), ``event_time``
    (ISO 8601 UTC), or ``cursor`` (the source's own cursor, a JSON object)."""

    kind: str
    lower: object
    upper: object

    def payload(self) -> dict[str, object]:
        return {"kind": self.kind, "from": self.lower, "until": self.upper}


@dataclass(frozen=True)
class Bucket:
    """The rows whose event time falls in ``[start_s, start_s + grain)``: how many, earliest, latest."""

    start_s: int
    rows: int
    low_s: int
    high_s: int


@dataclass(frozen=True)
class EventTimes:
    """What sensing saw of the event times of a source's new rows (epoch seconds, UTC): the earliest and
    latest, and how many rows fell in each bucket of ``grain`` seconds (keyed by the bucket's start).

    Recorded in the NEW_DATA (or baseline CURSOR) event's payload; the event-time window rule
    (``heartbeat_job_windows``) reads the maximum, the planner and the late-data count the buckets.
    """

    min_s: int | None
    max_s: int | None
    buckets: dict[int, int]

    @classmethod
    def of(cls, seconds: list[int], grain: int) -> EventTimes:
        """One row per event time in ``seconds``."""
        return cls.counted(((second, 1) for second in seconds), grain) or cls(None, None, {})

    @classmethod
    def counted(cls, pairs: Iterable[tuple[int | None, int]], grain: int) -> EventTimes | None:
        """(event time, rows) pairs counted per bucket of ``grain`` s; times that are None are left out."""
        buckets: dict[int, Bucket] = {}
        for second, rows in pairs:
            if second is None:
                continue
            start = second - second % grain
            seen = buckets.get(start)
            buckets[start] = Bucket(start, rows, second, second) if seen is None else \
                Bucket(start, seen.rows + rows, min(seen.low_s, second), max(seen.high_s, second))
        return cls.from_buckets(buckets.values())

    @classmethod
    def from_buckets(cls, rows: Iterable[Bucket]) -> EventTimes | None:
        """Bucket counts as a query returns them; None when there are none (no rows)."""
        found = list(rows)
        if not found:
            return None
        return cls(min(b.low_s for b in found), max(b.high_s for b in found), {b.start_s: b.rows for b in found})

    @classmethod
    def baseline(cls, top: object) -> EventTimes | None:
        """A new sensor's baseline at the latest key ``top``: the watermark starts there (no rows counted);
        None when ``top`` is no date or timestamp."""
        seconds = epoch_seconds(top)
        return None if seconds is None else cls(None, seconds, {})

    def payload(self) -> dict[str, object]:
        return {"event_time_min_s": self.min_s, "event_time_max_s": self.max_s,
                "event_time_buckets": {str(k): v for k, v in sorted(self.buckets.items())}}

    @classmethod
    def from_payload(cls, payload: dict[str, object] | None) -> EventTimes | None:
        if not payload or payload.get("event_time_max_s") is None:
            return None
        raw = payload.get("event_time_buckets") or {}
        buckets = {int(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        low, high = payload.get("event_time_min_s"), payload["event_time_max_s"]
        return cls(int(low) if isinstance(low, (int, str)) else None, int(high) if isinstance(high, (int, str)) else None,
                   buckets)


def epoch_seconds(value: object) -> int | None:
    """A date, datetime (naive = UTC) or ISO text as epoch seconds; None when it is none of those."""
    from datetime import date, datetime, timezone

    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value) if len(value) > 10 else date.fromisoformat(value)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return int((value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp())
    if isinstance(value, date):
        return int(datetime(value.year, value.month, value.day, tzinfo=timezone.utc).timestamp())
    return None


def iso(seconds: int) -> str:
    """Epoch seconds as ISO 8601 UTC (``2026-05-01T10:00:00Z``): how jobs receive window bounds."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
