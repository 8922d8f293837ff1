"""``delta_upstream_sensor_table``: another data product's sensor state table.

sensor_id is ``<table or path>`` or ``<table or path>#<name>``: the Delta table (a
``schema.table`` name or an absolute path/URL) and, optionally, which upstream
sensor to follow: a row matches when its ``sensor_id`` equals ``name`` or its
``assets`` contain it (everything after the first ``#``; upstream sensor ids may hold
``#`` themselves). Without a name every row of the table counts.

New data: a matching row reached ``PROCESSED_NEW_DATA`` with a
``status_change_timestamp`` after the cursor. ``preprocess_query`` sees those rows as
``sensor_new_data``.

Cursor: ``{"version": Delta version read, "timestamp": latest status_change_timestamp}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from heartbeat_runner.errors import SourceError
from heartbeat_runner.sources.base import SenseContext, SenseResult, SensingTarget, dump_cursor, load_cursor
from heartbeat_runner.sources.common import check_upstream_key, keyed_result
from heartbeat_runner.sources.delta_table import DeltaRef

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

PROCESSED = "PROCESSED_NEW_DATA"
COLUMNS = ("sensor_id", "assets", "status", "status_change_timestamp", "checkpoint_location",
           "upstream_key", "upstream_value")


def split_sensor_id(sensor_id: str) -> tuple[str, str | None]:
    table, hash_sign, name = sensor_id.partition("#")
    return table.strip(), (name.strip() if hash_sign else None)


class UpstreamSensorTableSource:
    source_types: ClassVar[tuple[str, ...]] = ("delta_upstream_sensor_table",)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        from heartbeat_runner.config import check_table_reference

        table, name = split_sensor_id(sensor_id)
        if name == "":
            return f"{sensor_id!r}: nothing after '#'; name an upstream sensor id or asset, or drop the '#'"
        return check_table_reference(table) or check_upstream_key(upstream_key, COLUMNS, "upstream sensor table")

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        problem = self.check_config(target.sensor_id, target.upstream_key)
        if problem:
            raise SourceError(problem)
        table_name, name = split_sensor_id(target.sensor_id)
        table = DeltaRef.resolve(table_name, ctx.engine)
        version = table.latest_version()
        if version is None:
            raise SourceError(f"upstream sensor table {table_name!r} not found")
        cursor = load_cursor(target.cursor)
        if cursor is not None and cursor.get("version") == version:
            return SenseResult(new_data=False, detail=f"sensor table unchanged (version {version})")
        processed = _processed_rows(table.read(version), name)
        if cursor is None and not ctx.replay_new_sensors:
            top = _latest(processed)
            return SenseResult(new_data=False, cursor_to=dump_cursor({"version": version, "timestamp": top}),
                               window_to=f"status_change_timestamp <= {top}",
                               detail="new sensor: baseline at the last processed upstream change")
        previous = (cursor or {}).get("timestamp")
        new_rows = processed
        if previous is not None:
            from pyspark.sql import functions as F

            new_rows = processed.where(F.col("status_change_timestamp").cast("timestamp")
                                       > F.lit(previous).cast("timestamp"))
        top = _latest(new_rows)
        if top is None:
            return SenseResult(new_data=False, cursor_to=dump_cursor({"version": version, "timestamp": previous}),
                               detail=f"no upstream change processed after {previous}")
        rows = ctx.count_preprocessed(new_rows, target)
        return keyed_result("status_change_timestamp", previous, top, rows,
                            dump_cursor({"version": version, "timestamp": top}))


def _processed_rows(frame: "DataFrame", name: str | None) -> "DataFrame":
    from pyspark.sql import functions as F

    missing = [c for c in ("sensor_id", "assets", "status", "status_change_timestamp") if c not in frame.columns]
    if missing:
        raise SourceError(f"not a sensor state table: column(s) {', '.join(missing)} missing")
    rows = frame.where(F.col("status") == F.lit(PROCESSED))
    if name is not None:
        rows = rows.where((F.col("sensor_id") == F.lit(name)) | F.array_contains("assets", name))
    return rows


def _latest(frame: "DataFrame") -> str | None:
    """Latest status_change_timestamp as text in the session time zone (UTC)."""
    from pyspark.sql import functions as F

    return frame.agg(F.max(F.col("status_change_timestamp").cast("timestamp")).cast("string")).collect()[0][0]
