"""``delta_upstream_sensor_table``: another data product's sensor state table.

sensor_id is ``<table or path>`` or ``<table or path>#<follow key>``: the Delta table
(a table name or an absolute path/URL) and, optionally, which upstream sensor to
follow (everything after the first ``#``; upstream sensor ids may hold ``#``
themselves). A state row matches the follow key when it is

- its ``sensor_id`` (``delta_table:sales.orders``),
- the upstream object that sensor reads (``sales.orders``: the sensor id without its
  ``<source>:`` prefix and ``#<hash>`` suffix), or
- one of its ``assets`` (Heartbeat lists the object and its asset description there).

Without a follow key every row of the table counts. A follow key that matches no row
at all is reported as a warning in the run report (and so in ``explain``) every tick.

New data: a matching row reached ``PROCESSED_NEW_DATA`` with a
``status_change_timestamp`` after the cursor. ``preprocess_query`` sees those rows as
``sensor_new_data``.

Cursor: ``{"version": Delta version read, "timestamp": latest status_change_timestamp}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.names import check_table_reference
from heartbeat_runner.core.records import SensorStatus
from heartbeat_runner.sensing.sources.base import (
    LineageDataset,
    LineageNaming,
    SenseContext,
    SenseResult,
    SensingTarget,
    Source,
    dump_cursor,
    load_cursor,
    table_dataset,
)
from heartbeat_runner.sensing.sources.common import check_upstream_key, keyed_result
from heartbeat_runner.sensing.sources.delta_table import DeltaRef

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

#: ``delta_table:`` in ``delta_table:sales.orders``, and a ``#0123456789`` hash of keyed sensors
_SOURCE_PREFIX = "^[a-z_]+:"
_HASH_SUFFIX = "#[0-9a-f]{10}$"
COLUMNS = ("sensor_id", "assets", "status", "status_change_timestamp", "checkpoint_location",
           "upstream_key", "upstream_value")


def split_sensor_id(sensor_id: str) -> tuple[str, str | None]:
    table, hash_sign, name = sensor_id.partition("#")
    return table.strip(), (name.strip() if hash_sign else None)


class UpstreamSensorTableSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("delta_upstream_sensor_table",)

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """The state table followed (the follow key is no part of the dataset)."""
        return table_dataset(sensor_id.partition("#")[0], naming)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        table, name = split_sensor_id(sensor_id)
        if name == "":
            return f"{sensor_id!r}: nothing after '#'; name an upstream sensor id or asset, or drop the '#'"
        return check_table_reference(table) or check_upstream_key(upstream_key, COLUMNS, "upstream sensor table")

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        from pyspark.sql import functions as F

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
        followed = _followed_rows(table.read(version), name)
        warning = _unmatched_warning(followed, name, table_name)
        processed = followed.where(F.col("status") == F.lit(SensorStatus.PROCESSED_NEW_DATA.value))
        if cursor is None and not ctx.replay_new_sensors:
            top = _latest(processed)
            return SenseResult(new_data=False, cursor_to=dump_cursor({"version": version, "timestamp": top}),
                               window_to=f"status_change_timestamp <= {top}", warning=warning,
                               detail="new sensor: baseline at the last processed upstream change")
        previous = (cursor or {}).get("timestamp")
        new_rows = processed
        if previous is not None:
            new_rows = processed.where(F.col("status_change_timestamp").cast("timestamp")
                                       > F.lit(previous).cast("timestamp"))
        top = _latest(new_rows)
        if top is None:
            return SenseResult(new_data=False, cursor_to=dump_cursor({"version": version, "timestamp": previous}),
                               detail=f"no upstream change processed after {previous}", warning=warning)
        rows = ctx.count_preprocessed(new_rows, target)
        return keyed_result("status_change_timestamp", previous, top, rows,
                            dump_cursor({"version": version, "timestamp": top}))


def _followed_rows(frame: DataFrame, name: str | None) -> DataFrame:
    """The state rows the follow key ``name`` matches (every row without one)."""
    from pyspark.sql import functions as F

    missing = [c for c in ("sensor_id", "assets", "status", "status_change_timestamp") if c not in frame.columns]
    if missing:
        raise SourceError(f"not a sensor state table: column(s) {', '.join(missing)} missing")
    if name is None:
        return frame
    followed = F.lit(name)
    upstream_object = F.regexp_replace(F.regexp_replace("sensor_id", _SOURCE_PREFIX, ""), _HASH_SUFFIX, "")
    return frame.where((F.col("sensor_id") == followed) | (upstream_object == followed)
                       | F.array_contains("assets", name))


def _unmatched_warning(followed: DataFrame, name: str | None, table_name: str) -> str | None:
    """A warning when the follow key matches no row of the table at all (a typo never triggers)."""
    if name is None or followed.limit(1).count() > 0:
        return None
    return (f"follow key {name!r} matches no row of {table_name} (by sensor_id, upstream object or asset); "
            "this source never reports new data until it does")


def _latest(frame: DataFrame) -> str | None:
    """Latest status_change_timestamp as text in the session time zone (UTC)."""
    from pyspark.sql import functions as F

    return frame.agg(F.max(F.col("status_change_timestamp").cast("timestamp")).cast("string")).collect()[0][0]
