"""``jdbc``: any relational table reachable through a SQLAlchemy URL.

sensor_id is ``<connection>:<table>`` or ``<connection>:<schema>.<table>``; the
connection's URL comes from ``jdbc.<connection>`` in heartbeat_sources.yml (or
``HEARTBEAT_JDBC_<CONNECTION>_URL``). ``upstream_key`` (required) is the column whose
growing values mark new rows, e.g. a load timestamp or an increasing id.

Cursor: ``{"value": {"type": ..., "value": ...}}``, the largest key seen (None while the
table is empty).
"""

from __future__ import annotations

from typing import ClassVar

from heartbeat_runner.errors import SourceError
from heartbeat_runner.sources.base import SenseContext, SenseResult, SensingTarget, dump_cursor, load_cursor
from heartbeat_runner.sources.common import check_connection_name, keyed_result, split_reference
from heartbeat_runner.sources.sql_common import (
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


class JdbcSource:
    source_types: ClassVar[tuple[str, ...]] = ("jdbc",)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        connection, table = split_reference(sensor_id)
        if connection is None:
            return f"{sensor_id!r} must be <connection>:<table> or <connection>:<schema>.<table>"
        if not upstream_key:
            return "upstream_key is required for jdbc: the column whose growing values mark new rows"
        return (check_connection_name(connection, "connection name") or check_table_name(table)
                or check_sql_name(upstream_key, "upstream_key"))

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        import sqlalchemy as sa

        problem = self.check_config(target.sensor_id, target.upstream_key)
        if problem:
            raise SourceError(problem)
        connection, qualified = split_reference(target.sensor_id)
        key_name = target.upstream_key
        if connection is None or not key_name:  # check_config refuses both
            raise SourceError(f"jdbc {target.sensor_id!r} needs a connection and an upstream_key")
        schema, name = split_table(qualified)
        table = table_clause(name, schema, [key_name])
        key = table.c[key_name]
        where = f"jdbc {target.sensor_id!r}"
        cursor = load_cursor(target.cursor)
        with connect(sql_settings(ctx, "jdbc", connection), where) as conn:
            if cursor is None and not ctx.replay_new_sensors:
                top = conn.execute(sa.select(sa.func.max(key))).scalar()
                return SenseResult(new_data=False, cursor_to=dump_cursor({"value": encode_value(top)}),
                                   window_to=f"{key_name} <= {top}",
                                   detail="new sensor: baseline at the current end of the table")
            previous = decode_value((cursor or {}).get("value"))
            after = key > sa.bindparam("previous", previous) if previous is not None else key.is_not(None)
            # tuples(): the same result, typed as (max, count) rather than as a Row of objects
            top, rows = conn.execute(sa.select(sa.func.max(key), sa.func.count()).where(after)).tuples().one()
            if top is None:
                return SenseResult(new_data=False, detail=f"no {key_name} after {previous}")
            if target.preprocess_query:
                new_rows: sa.Select = sa.select(sa.literal_column("*")).select_from(table).where(
                    after, key <= sa.bindparam("top", top))
                rows = count_preprocessed_rows(conn, new_rows, target, ctx)
        return keyed_result(key_name, previous, top, rows, dump_cursor({"value": encode_value(top)}))
