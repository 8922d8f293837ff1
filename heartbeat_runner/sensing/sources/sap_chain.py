"""``sap_bw`` and ``sap_b4``: a green run of an SAP BW or BW/4HANA process chain.

sensor_id is the process chain id, optionally prefixed by the SAP system:
``MY_CHAIN`` (system ``default``) or ``bw_prod:MY_CHAIN``. The system's settings
come from ``sap.<system>`` in heartbeat_sources.yml (or ``HEARTBEAT_SAP_<SYSTEM>_URL``):
a SQLAlchemy ``url`` and, when they differ from SAP's, where the chain log lives
(``schema``, ``table`` and ``columns``, see ``ChainLog``).

A run counts when its status is green and its LOAD_DATE (the log's date ``DATUM``
followed by its time ``ZEIT``, as ``YYYYMMDDHHMMSS``) is after the cursor.
``preprocess_query`` sees the runs as ``sensor_new_data`` (CHAIN_ID, LOAD_DATE as a
timestamp, ANALYZED_STATUS).

Cursor: ``{"load_date": "YYYYMMDDHHMMSS"}`` (None before the first green run). The cursor
after each new green run is a cut point (``SenseResult.cut_points``): bounded catch-up cuts
a backlog into runs of at most N chain runs there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, time
from typing import TYPE_CHECKING, Any, ClassVar

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.windows import EventTimes, SourceWindow, WindowBounds, WindowLimit, epoch_seconds
from heartbeat_runner.sensing.sources.base import (
    LineageDataset,
    LineageNaming,
    SenseContext,
    SenseResult,
    SensingTarget,
    Source,
    dump_cursor,
    load_cursor,
)
from heartbeat_runner.sensing.sources.common import (
    check_connection_name,
    check_upstream_key,
    keyed_result,
    split_reference,
)
from heartbeat_runner.sensing.sources.sql_common import connect, split_table, sql_settings, table_clause

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

DEFAULT_SYSTEM = "default"
NEW_DATA_COLUMNS = ("CHAIN_ID", "LOAD_DATE", "ANALYZED_STATUS")
_MAX_CHAIN_ID = 64


@dataclass(frozen=True)
class ChainLog:
    """Where an SAP system logs chain runs; the defaults are SAP's RSPCLOGCHAIN."""

    table: str = "RSPCLOGCHAIN"
    schema: str | None = None
    chain_id: str = "CHAIN_ID"
    date: str = "DATUM"
    time: str = "ZEIT"
    status: str = "ANALYZED_STATUS"
    green: str = "G"

    SETTINGS: ClassVar[tuple[str, ...]] = ("schema", "table", "columns", "green_status")

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ChainLog:
        columns = settings.get("columns") or {}
        unknown = set(columns) - {"chain_id", "date", "time", "status"}
        if unknown:
            raise SourceError(f"sap connection: unknown columns setting(s) {', '.join(sorted(unknown))}")
        schema, table = split_table(str(settings.get("table", cls.table)))
        return cls(table=table, schema=settings.get("schema", schema), green=str(settings.get("green_status", "G")),
                   **{k: str(v) for k, v in columns.items()})

    def clause(self) -> sa.TableClause:
        return table_clause(self.table, self.schema, [self.chain_id, self.date, self.time, self.status])


class SapChainSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("sap_bw", "sap_b4")
    reports_event_times: ClassVar[bool] = True

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """``<sap_bw|sap_b4>://<system>`` / ``<chain id>`` (OpenLineage names no SAP datasets; the system is
        the data source, the chain its dataset)."""
        system, chain_id = split_reference(sensor_id)
        return LineageDataset(f"{sensor_source}://{system or DEFAULT_SYSTEM}", chain_id)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        system, chain_id = split_reference(sensor_id)
        if system is not None:
            problem = check_connection_name(system, "SAP system")
            if problem:
                return problem
        if not chain_id or len(chain_id) > _MAX_CHAIN_ID or any(ch.isspace() for ch in chain_id):
            return f"{sensor_id!r} must be a process chain id (no blanks), optionally prefixed by <system>:"
        return check_upstream_key(upstream_key, NEW_DATA_COLUMNS, "SAP chain")

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        problem = self.check_config(target.sensor_id, target.upstream_key)
        if problem:
            raise SourceError(problem)
        system, chain_id = split_reference(target.sensor_id)
        system = system or DEFAULT_SYSTEM
        settings = sql_settings(ctx, "sap", system, ChainLog.SETTINGS)
        log = ChainLog.from_settings(settings)
        cursor = load_cursor(target.cursor)
        with connect(settings, f"{target.sensor_source} chain {chain_id!r} on SAP system {system!r}") as conn:
            if cursor is None and not ctx.replay_new_sensors:
                runs = _green_runs(conn, log, chain_id, since=_last_green_day(conn, log, chain_id))
                top = max((r["LOAD_DATE"] for r in runs), default=None)
                return SenseResult(new_data=False, cursor_to=dump_cursor({"load_date": _text(top)}),
                                   window_to=f"LOAD_DATE <= {_text(top)}",
                                   detail="new sensor: baseline at the last green run",
                                   event_times=_event_times([top] if top else [], target, ctx, baseline=True))
            previous = (cursor or {}).get("load_date")
            runs = _green_runs(conn, log, chain_id, since=previous[:8] if previous else None)
        new_runs = [r for r in runs if previous is None or _text(r["LOAD_DATE"]) > previous]
        if not new_runs:
            return SenseResult(new_data=False, detail=f"no green run after {previous}")
        top = _text(max(r["LOAD_DATE"] for r in new_runs))
        rows = ctx.count_preprocessed_records(new_runs, target)
        result = keyed_result("LOAD_DATE", previous, top, rows, dump_cursor({"load_date": top}))
        ends = sorted({r["LOAD_DATE"] for r in new_runs})
        return replace(result, event_times=_event_times([r["LOAD_DATE"] for r in new_runs], target, ctx),
                       cut_points=tuple(dump_cursor({"load_date": _text(end)}) for end in ends))

    def bounds(self, cursor_from: str | None, cursor_to: str | None) -> WindowBounds:
        """The chain runs' LOAD_DATE (``YYYYMMDDHHMMSS``); from None: from the first green run."""
        return WindowBounds("key", (load_cursor(cursor_from) or {}).get("load_date"),
                            (load_cursor(cursor_to) or {}).get("load_date"))

    def split(self, window: SourceWindow, limit: WindowLimit, upstream_key: str | None) -> list[SourceWindow]:
        """Runs of at most ``limit`` green chain runs, cut after the runs sensing saw (``cut_points``)."""
        if limit.count is None:
            raise SourceError(f"max_window {limit} is a time span, but the windows of SAP chain {window.sensor_id} "
                              "are its green runs: give a number of runs (e.g. 1)")
        points: list[str | None] = list(window.cut_points) or [window.cursor_to]
        ends = points[limit.count - 1::limit.count]
        if not ends or ends[-1] != points[-1]:
            ends.append(points[-1])
        pieces, low = [], window.cursor_from
        for end in ends[:-1] + [window.cursor_to]:
            pieces.append(SourceWindow(window.sensor_source, window.sensor_id, low, end,
                                       _bound("LOAD_DATE >", low) or "beginning", _bound("LOAD_DATE <=", end)))
            low = end
        return pieces


def _event_times(load_dates: list[datetime], target: SensingTarget, ctx: SenseContext,
                 baseline: bool = False) -> EventTimes | None:
    """The runs' LOAD_DATE as event times, when a job with an event-time window policy reads the chain
    (a baseline records only the latest: the watermark starts there)."""
    grain = ctx.event_time_grains.get(target.source_key)
    if not grain or not load_dates:
        return None
    if baseline:
        return EventTimes.baseline(max(load_dates))
    return EventTimes.counted(((epoch_seconds(d), 1) for d in load_dates), grain)


def _last_green_day(conn: sa.Connection, log: ChainLog, chain_id: str) -> str | None:
    import sqlalchemy as sa

    table = log.clause()
    day = conn.execute(sa.select(sa.func.max(table.c[log.date])).where(*_green(table, log, chain_id))).scalar()
    return None if day is None else _day(day)


def _green_runs(conn: sa.Connection, log: ChainLog, chain_id: str, since: str | None) -> list[dict[str, Any]]:
    """Green runs of the chain on or after day ``since`` (YYYYMMDD), as sensor_new_data rows."""
    import sqlalchemy as sa

    table = log.clause()
    columns = [table.c[log.chain_id], table.c[log.date], table.c[log.time], table.c[log.status]]
    query = sa.select(*columns).where(*_green(table, log, chain_id))
    if since is not None:
        query = query.where(table.c[log.date] >= sa.bindparam("since", since))
    return [{"CHAIN_ID": chain, "LOAD_DATE": _load_date(day, clock), "ANALYZED_STATUS": status}
            for chain, day, clock, status in conn.execute(query)]


def _green(table: sa.TableClause, log: ChainLog, chain_id: str) -> list[sa.ColumnElement[bool]]:
    import sqlalchemy as sa

    return [table.c[log.chain_id] == sa.bindparam("chain_id", chain_id),
            table.c[log.status] == sa.bindparam("green", log.green)]


def _day(value: object) -> str:
    """SAP DATS (``YYYYMMDD``) from a date, or from a value whose text is a DATS/ISO string."""
    return value.strftime("%Y%m%d") if isinstance(value, date) else str(value).strip().replace("-", "")


def _load_date(day: object, clock: object) -> datetime:
    """A run's timestamp from the DATS day and TIMS clock values as the driver returns them (any type)."""
    if isinstance(clock, time):
        hhmmss = clock.strftime("%H%M%S")
    else:
        hhmmss = str(clock or "").strip().replace(":", "").zfill(6)
    try:
        return datetime.strptime(_day(day) + hhmmss, "%Y%m%d%H%M%S")
    except ValueError:
        raise SourceError(f"chain log has a run with an unreadable date/time {day!r} {clock!r}") from None


def _bound(prefix: str, cursor: str | None) -> str | None:
    """``LOAD_DATE > 20260102061500`` for a cursor, None when it has no load date."""
    load_date = (load_cursor(cursor) or {}).get("load_date")
    return None if load_date is None else f"{prefix} {load_date}"


def _text(value: datetime | None) -> str | None:
    return None if value is None else value.strftime("%Y%m%d%H%M%S")
