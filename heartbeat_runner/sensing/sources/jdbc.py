"""``jdbc``: any relational table, read through SQLAlchemy or through Spark's own JDBC source.

sensor_id is ``<connection>:<table>`` or ``<connection>:<schema>.<table>``; the
connection's settings come from ``jdbc.<connection>`` in heartbeat_sources.yml (or
``HEARTBEAT_JDBC_<CONNECTION>_<SETTING>``). Their ``reader`` chooses how the table is read:
``sqlalchemy`` (the default: a SQLAlchemy ``url``, the runner connects itself) or ``spark``
(a ``jdbc_url``, the engine reads with ``spark.read.format("jdbc")``, see ``spark_jdbc``).
``upstream_key`` (required) is the column whose growing values mark new rows, e.g. a load
timestamp or an increasing id.

Cursor: ``{"value": {"type": ..., "value": ...}}``, the largest key seen (None while the
table is empty). Both readers write and read the same cursor, so a connection can switch
readers without losing its place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.windows import Bucket, EventTimes, SourceWindow, WindowBounds, WindowLimit, epoch_seconds
from heartbeat_runner.sensing.connections import env_name, resolve_secrets
from heartbeat_runner.sensing.sources.base import (
    LineageDataset,
    LineageNaming,
    SenseContext,
    SenseResult,
    SensingTarget,
    Source,
    database_dataset,
    dump_cursor,
    load_cursor,
)
from heartbeat_runner.sensing.sources.common import check_connection_name, keyed_result, split_key_span, split_reference
from heartbeat_runner.sensing.sources.spark_jdbc import SparkJdbcReader
from heartbeat_runner.sensing.sources.sql_common import (
    check_sql_name,
    check_table_name,
    connect,
    count_preprocessed_rows,
    decode_value,
    encode_value,
    split_table,
    sql_settings,
    table_clause,
)

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

DEFAULT_READER = "sqlalchemy"


class KeyedTable(Protocol):
    """What the source asks a table during one sense; each reader answers it its own way."""

    def max_key(self) -> Any:
        """The largest key (None for an empty table)."""
        ...

    def after(self, previous: Any) -> tuple[Any, int]:
        """Largest key and number of rows with a key after ``previous`` (any non-null key when None)."""
        ...

    def count_preprocessed(self, previous: Any, top: Any, target: SensingTarget, ctx: SenseContext) -> int:
        """How many rows with a key in (``previous``, ``top``] the target's preprocess_query keeps."""
        ...

    def event_times(self, previous: Any, top: Any, grain: int) -> EventTimes | None:
        """The keys in (``previous``, ``top``] (dates or timestamps) as event times, counted per ``grain`` s."""
        ...


class JdbcReader(Protocol):
    def open(self, ctx: SenseContext, schema: str | None, name: str, key: str,
             where: str) -> contextlib.AbstractContextManager[KeyedTable]:
        """The table for one sense; failures inside the block become SourceError naming ``where``."""
        ...


class SqlAlchemyReader:
    """``reader: sqlalchemy``: one connection per sense from the runner (``sql_common``)."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings

    @classmethod
    def for_connection(cls, ctx: SenseContext, name: str) -> SqlAlchemyReader:
        return cls(sql_settings(ctx, "jdbc", name, ("reader",)))

    @contextlib.contextmanager
    def open(self, ctx: SenseContext, schema: str | None, name: str, key: str,
             where: str) -> Iterator[SqlKeyedTable]:
        table = table_clause(name, schema, [key])
        with connect(self.settings, where) as conn:
            yield SqlKeyedTable(conn, table, key)


@dataclass
class SqlKeyedTable:
    conn: sa.Connection
    table: sa.TableClause
    key: str

    def max_key(self) -> Any:
        import sqlalchemy as sa

        return self.conn.execute(sa.select(sa.func.max(self.table.c[self.key]))).scalar()

    def after(self, previous: Any) -> tuple[Any, int]:
        import sqlalchemy as sa

        query = sa.select(sa.func.max(self.table.c[self.key]), sa.func.count()).where(self._after(previous))
        row = self.conn.execute(query).one()
        return row[0], int(row[1])

    def count_preprocessed(self, previous: Any, top: Any, target: SensingTarget, ctx: SenseContext) -> int:
        import sqlalchemy as sa

        new_rows: sa.Select = sa.select(sa.literal_column("*")).select_from(self.table).where(
            *self._between(previous, top))
        return count_preprocessed_rows(self.conn, new_rows, target, ctx)

    def event_times(self, previous: Any, top: Any, grain: int) -> EventTimes | None:
        """Counted in the database where the dialect has an epoch function (EPOCH_SECONDS), else per
        distinct key here."""
        import sqlalchemy as sa

        key = self.table.c[self.key]
        new_rows = self._between(previous, top)
        epoch = EPOCH_SECONDS.get(self.conn.dialect.name)
        if epoch is None:
            keys: list[Any] = list(self.conn.execute(sa.select(key, sa.func.count()).where(*new_rows).group_by(key)))
            return EventTimes.counted(((epoch_seconds(value), int(n)) for value, n in keys), grain)
        times = sa.select(epoch(key).label("t")).where(*new_rows).subquery()
        buckets = sa.select((sa.func.floor(times.c.t / grain) * grain).label("bucket"), times.c.t).subquery()
        query = sa.select(buckets.c.bucket, sa.func.count(), sa.func.min(buckets.c.t), sa.func.max(buckets.c.t)) \
            .group_by(buckets.c.bucket)
        found: list[Any] = list(self.conn.execute(query))
        return EventTimes.from_buckets(Bucket(int(b), int(n), int(lo), int(hi)) for b, n, lo, hi in found if b is not None)

    def _after(self, previous: Any) -> sa.ColumnElement[bool]:
        import sqlalchemy as sa

        key = self.table.c[self.key]
        return key > sa.bindparam("previous", previous) if previous is not None else key.is_not(None)

    def _between(self, previous: Any, top: Any) -> list[sa.ColumnElement[bool]]:
        """The new rows: a key in (``previous``, ``top``]."""
        import sqlalchemy as sa

        return [self._after(previous), self.table.c[self.key] <= sa.bindparam("top", top)]


def _postgresql_epoch(key: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    import sqlalchemy as sa

    return sa.extract("epoch", key)  # a timestamp without time zone counts as UTC


def _sqlite_epoch(key: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    import sqlalchemy as sa

    return sa.cast(sa.func.strftime("%s", key), sa.Integer)


#: SQLAlchemy dialect name -> a key's epoch seconds in that dialect, to count event times in the
#: database (other dialects send one row per distinct key)
EPOCH_SECONDS: dict[str, Callable[[sa.ColumnElement[Any]], sa.ColumnElement[Any]]] = {
    "postgresql": _postgresql_epoch,
    "sqlite": _sqlite_epoch,
}


#: ``reader`` setting -> how to build that reader for a connection
READERS: dict[str, Callable[[SenseContext, str], JdbcReader]] = {
    "sqlalchemy": SqlAlchemyReader.for_connection,
    "spark": SparkJdbcReader.for_connection,
}


def jdbc_reader(ctx: SenseContext, connection: str) -> JdbcReader:
    """The reader the connection's ``reader`` setting names (file entry, else ``HEARTBEAT_JDBC_<NAME>_READER``)."""
    where = f"jdbc.{connection}"
    entry = ctx.connections.get("jdbc", {}).get(connection)
    if isinstance(entry, dict) and "reader" in entry:
        kind = resolve_secrets({"reader": entry["reader"]}, where, ctx.secrets)["reader"]
    else:
        kind = os.environ.get(f"HEARTBEAT_JDBC_{env_name(connection)}_READER", DEFAULT_READER)
    if kind not in READERS:
        raise SourceError(f"{where}: reader {kind!r} is not one of {', '.join(READERS)}")
    return READERS[kind](ctx, connection)


class JdbcSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("jdbc",)
    reports_event_times: ClassVar[bool] = True

    def split(self, window: SourceWindow, limit: WindowLimit, upstream_key: str | None) -> list[SourceWindow]:
        """Spans of the key column: ``7d`` for a date or timestamp key, a count for a numeric one."""
        before = (load_cursor(window.cursor_from) or {}).get("value") or {}
        after = (load_cursor(window.cursor_to) or {}).get("value") or {}
        kind = after.get("type", "str")
        return split_key_span(window, limit, upstream_key or "key", before.get("value"), after.get("value"),
                              lambda top: dump_cursor({"value": {"type": kind, "value": top}}))

    def bounds(self, cursor_from: str | None, cursor_to: str | None) -> WindowBounds:
        """Values of the key column (as text); from None: from the beginning."""
        before = (load_cursor(cursor_from) or {}).get("value") or {}
        after = (load_cursor(cursor_to) or {}).get("value") or {}
        return WindowBounds("key", before.get("value"), after.get("value"))

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """The database of the connection's ``url`` (or ``jdbc_url``): ``postgres://host:5432`` /
        ``db.schema.table``; ``jdbc://<connection>`` / the table when the URL is a reference."""
        connection, table = split_reference(sensor_id)
        settings = naming.connections.get("jdbc", {}).get(connection or "", {})
        return database_dataset(settings.get("url") or settings.get("jdbc_url"), f"jdbc://{connection}", table)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        connection, table = split_reference(sensor_id)
        if connection is None:
            return f"{sensor_id!r} must be <connection>:<table> or <connection>:<schema>.<table>"
        if not upstream_key:
            return "upstream_key is required for jdbc: the column whose growing values mark new rows"
        return (check_connection_name(connection, "connection name") or check_table_name(table)
                or check_sql_name(upstream_key, "upstream_key"))

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        problem = self.check_config(target.sensor_id, target.upstream_key)
        if problem:
            raise SourceError(problem)
        connection, qualified = split_reference(target.sensor_id)
        key_name = target.upstream_key
        if connection is None or not key_name:  # check_config refuses both
            raise SourceError(f"jdbc {target.sensor_id!r} needs a connection and an upstream_key")
        schema, name = split_table(qualified)
        cursor = load_cursor(target.cursor)
        with jdbc_reader(ctx, connection).open(ctx, schema, name, key_name, f"jdbc {target.sensor_id!r}") as table:
            grain = ctx.event_time_grains.get(target.source_key)
            if cursor is None and not ctx.replay_new_sensors:
                top = table.max_key()
                return SenseResult(new_data=False, cursor_to=dump_cursor({"value": encode_value(top)}),
                                   window_to=f"{key_name} <= {top}",
                                   detail="new sensor: baseline at the current end of the table",
                                   event_times=EventTimes.baseline(top) if grain else None)
            previous = decode_value((cursor or {}).get("value"))
            top, rows = table.after(previous)
            if top is None:
                return SenseResult(new_data=False, detail=f"no {key_name} after {previous}")
            if target.preprocess_query:
                rows = table.count_preprocessed(previous, top, target, ctx)
            times = table.event_times(previous, top, grain) if grain and epoch_seconds(top) is not None else None
        result = keyed_result(key_name, previous, top, rows, dump_cursor({"value": encode_value(top)}))
        return replace(result, event_times=times)
