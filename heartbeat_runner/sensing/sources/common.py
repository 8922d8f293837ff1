"""Naming rules shared by the sources that reach external systems (Kafka, SAP, JDBC, sensor tables)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.windows import Bucket, EventTimes, SourceWindow, WindowLimit
from heartbeat_runner.sensing.sources.base import SenseResult

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

_CONNECTION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def split_reference(sensor_id: str) -> tuple[str | None, str]:
    """``name: object`` -> (``name``, ``object``); without a colon (None, ``sensor_id``).

    Blanks around the colon are ignored (the spec writes ``my_product: my.topic``).
    """
    name, colon, rest = sensor_id.partition(":")
    if not colon:
        return None, sensor_id.strip()
    return name.strip(), rest.strip()


def check_connection_name(name: str | None, what: str) -> str | None:
    if name is None or not _CONNECTION_NAME.match(name):
        return f"{what} {name or ''!r} must be letters, digits, '_', '.' or '-'"
    return None


def check_upstream_key(upstream_key: str | None, columns: tuple[str, ...], source: str) -> str | None:
    """``upstream_key``, when set, must name a column of ``sensor_new_data`` (it is what ``?upstream_key`` renders)."""
    if upstream_key is None or upstream_key.lower() in (c.lower() for c in columns):
        return None
    return (f"upstream_key {upstream_key!r} is not a column {source} sources offer to preprocess_query; "
            f"use one of {', '.join(columns)} or leave it empty")


def keyed_result(key: str, previous: Any, top: Any, rows: int, cursor_to: str) -> SenseResult:
    """The answer of a source that found rows with ``key`` in (``previous``, ``top``]; new data when any was kept."""
    return SenseResult(
        new_data=rows > 0,
        cursor_to=cursor_to,
        window_from=f"{key} > {previous}" if previous is not None else "beginning",
        window_to=f"{key} <= {top}",
        rows=rows,
    )


def split_key_span(window: SourceWindow, limit: WindowLimit, key: str, low: Any, high: Any,
                   cursor_of: Callable[[str], str]) -> list[SourceWindow]:
    """Pieces ``key > lo`` .. ``key <= hi`` of at most ``limit`` between the key values ``low`` and
    ``high`` (texts of dates, timestamps or numbers, as the cursors hold them)."""
    if low is None:
        raise SourceError(f"{window.sensor_source}:{window.sensor_id}: the backlog has no lower {key} bound "
                          "(a sensor replayed from the beginning) to cut into windows of " + str(limit))
    lo, hi = _key_value(low, limit, key), _key_value(high, limit, key)
    step = limit.span if limit.span is not None else limit.count
    pieces = []
    while lo < hi:
        top = min(lo + step, hi)
        pieces.append(replace(window, cursor_to=cursor_of(_key_text(top)),
                              window_from=f"{key} > {_key_text(lo)}", window_to=f"{key} <= {_key_text(top)}"))
        lo = top
    return pieces or [window]


def _key_value(text: Any, limit: WindowLimit, key: str) -> Any:
    """A key bound as a date/datetime (span limits) or a number (count limits)."""
    raw = str(text)
    try:
        if limit.span is not None:
            if len(raw) == 10:
                return datetime.combine(date.fromisoformat(raw), datetime.min.time())
            return datetime.fromisoformat(raw)
        return int(raw) if raw.lstrip("-").isdigit() else float(raw)
    except ValueError:
        kind = "a date or timestamp" if limit.span is not None else "a number"
        raise SourceError(f"max_window {limit} needs {kind} in {key}, which holds {raw!r}") from None


def _key_text(value: Any) -> str:
    if isinstance(value, datetime) and value.time() == datetime.min.time() and value.tzinfo is None:
        return value.date().isoformat()
    return str(value)


def frame_event_times(rows: DataFrame, key: str, grain: int) -> EventTimes | None:
    """Event times of ``rows`` by ``key`` (a date or timestamp column), counted per bucket of ``grain`` s;
    None when there are no rows."""
    from pyspark.sql import functions as F

    seconds = F.unix_timestamp(F.col(key).cast("timestamp"))
    found = (rows.select(seconds.alias("t")).where(F.col("t").isNotNull())
             .groupBy((F.floor(F.col("t") / grain) * grain).cast("long").alias("bucket"))
             .agg(F.count(F.lit(1)).alias("n"), F.min("t").alias("lo"), F.max("t").alias("hi")).collect())
    return EventTimes.from_buckets(Bucket(int(r["bucket"]), int(r["n"]), int(r["lo"]), int(r["hi"])) for r in found)
