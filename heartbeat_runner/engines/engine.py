"""The Spark engine: embedded Sail (local), any Spark Connect endpoint, or Databricks.

The local target runs Sail in a child process (``sail_process``) and talks to it over Spark
Connect on loopback: Sail leaks native memory per SQL parse, and only ending its process gives
that memory back, so the runner recycles the child between ticks (:meth:`Engine.recycle`).
Sail's catalog lives in memory and is empty at every start, so every table gets a fixed
location under ``<lakehouse>/warehouse/<schema>/<table>`` and is re-registered when the engine
opens or is recycled. dbt-spark's ``session`` method finds the same server through
``SPARK_REMOTE`` and the default session, which is why opening (and recycling) a local engine
sets both.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.errors import first_line
from heartbeat_runner.core.metrics import metrics
from heartbeat_runner.core.names import is_table_name, qualify, sql_string
from heartbeat_runner.core.settings import Settings, Target, validate_identifier
from heartbeat_runner.engines import delta_log, made_by
from heartbeat_runner.engines.engine_errors import (
    CatalogLookError,
    CatalogLookUnavailableError,
    ChangeFeedRangeMissingError,
    EngineUnavailableError,
    NoCatalogLookError,
    is_kind,
)
from heartbeat_runner.engines.sail_process import SailProcess
from heartbeat_runner.engines.spark_local import keep_connect_release_pool, make_default_connect_session

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: the table property that makes Delta record a change data feed
CHANGE_FEED_PROPERTY = "delta.enableChangeDataFeed"
#: change types of the feed whose rows are the table's new rows (inserted, or updated to)
NEW_ROW_CHANGE_TYPES = ("insert", "update_postimage")
#: columns the feed adds to the table's own
CHANGE_FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
#: Spark Connect's createDataFrame is not thread-safe (see SenseContext.count_preprocessed_records)
_UPLOAD_LOCK = threading.Lock()

#: SQL column types a migration may add -> the Delta log's name for each
_DELTA_TYPES = {"string": "string", "timestamp": "timestamp", "int": "integer", "bigint": "long",
                "double": "double", "boolean": "boolean"}


@dataclass(frozen=True)
class Column:
    """A column to add to an existing table: a validated name and one of the SQL types in _DELTA_TYPES."""

    name: str
    sql_type: str

    def __post_init__(self) -> None:
        validate_identifier(self.name, "column")
        if self.sql_type not in _DELTA_TYPES:
            raise ValueError(f"column {self.name}: type {self.sql_type!r} is not one of {sorted(_DELTA_TYPES)}")

    @property
    def delta_type(self) -> str:
        return _DELTA_TYPES[self.sql_type]


#: History rows read beyond the versions a tick asks about (commits made between reading the newest version and
#: reading the history); and the most versions one history read covers (a longer range counts as changed)
HISTORY_SLACK = 8
HISTORY_MAX_ROWS = 1000
_HISTORY_LOCK = threading.Lock()
#: ``information_schema.tables.table_type`` of tables every write of which goes through Unity Catalog, so that
#: ``last_altered`` moves with each: the catalog look vouches for these only. An EXTERNAL table can be written
#: at its path by another engine, unseen by the catalog: it is sensed from its history.
VOUCHED_TABLE_TYPES = frozenset({"MANAGED", "STREAMING_TABLE", "MATERIALIZED_VIEW"})
#: Back-off of a catalog whose look failed: after the n-th failure in a row its tables are sensed from their
#: history for ``first_s * 2^(n-1)`` s (at most ``max_s``), then the look is asked again; a catalog without an
#: information_schema waits ``max_s`` each time. Never switched off for the process.
CATALOG_LOOK_BACKOFF = Backoff(first_s=30.0, max_s=1800.0)
#: tables named in one catalog look query (each name a bound parameter); more are asked in several queries
CATALOG_LOOK_BATCH = 500


@dataclass(frozen=True)
class CatalogEntry:
    """What the catalog look says of one table: when it was last altered (UTC), and whether the catalog can
    vouch for it (``VOUCHED_TABLE_TYPES``)."""

    last_altered: datetime | None
    vouched: bool


@dataclass
class TableOps:
    """How one kind of engine reads a Delta table's version and size and maintains it.

    The default speaks Delta SQL (Databricks, any remote Spark with Delta); the subclasses
    are the embedded engine (files it manages itself) and a classic Spark session, where
    delta-spark's ``DeltaTable`` API is available. This is the one place engines differ
    for table maintenance: callers use the :class:`Engine` methods.
    """

    #: the engine keeps each table at a fixed location under the lakehouse and forgets its
    #: catalog at every start (tables and views are registered again when it opens)
    manages_locations: bool = False
    #: builds of the control model read the events from a cached temporary view (dbt var
    #: heartbeat_stage_events, see macros/heartbeat_helpers.sql): for Apache Spark, whose
    #: optimizer copies the events CTE at each of its references; off where CACHE TABLE is
    #: not offered (Databricks SQL warehouses, serverless)
    stage_events: bool = False
    #: seconds between two checks whether maintenance is due after busy ticks: a check reads the
    #: file count of each of Heartbeat's tables, a query per table here, a file read locally
    maintenance_check_interval_s: float = 600.0
    #: the engine writes tables with a change data feed (Sail refuses to): Heartbeat's sensor state
    #: table records one, for the products that follow it (dbt var heartbeat_change_feed)
    writes_change_feed: bool = True
    #: the engine keeps its tables on this machine's disk (local Apache Spark): a table's version is
    #: read from its ``_delta_log`` folder once its location is known, not with a Spark job
    local_files: bool = False
    #: an incremental model's MERGE source is computed once into parquet files on this machine's disk
    #: and the MERGE reads those (HEARTBEAT_MERGE_STAGE_ROOT, macros/engine_overrides.sql):
    #: engines whose MERGE would otherwise run the source query more than once (Sail three times,
    #: local Apache Spark twice: its control-table MERGE took 6.6 s from the view, 2.0 + 2.0 s staged)
    stages_merge_sources: bool = False
    #: the engine reads the config seed's CSV file itself (HEARTBEAT_SEED_FILE,
    #: macros/engine_overrides.sql): engines on this machine, where the file is; elsewhere dbt sends the rows
    #: as INSERTs of literals (10,000 rows took ~13 s that way on Sail, the text built and then parsed)
    seeds_from_file: bool = False
    #: dbt lists the schema's relations by name (views apart, every table Delta) instead of with
    #: SHOW TABLE EXTENDED, which reads every table's metadata (dbt var heartbeat_list_by_name,
    #: macros/engine_overrides.sql): local Apache Spark, where Heartbeat's schema holds Delta tables only
    lists_relations_by_name: bool = False
    #: rows to write become a DataFrame through an Arrow table (see :meth:`Engine.frame`): on a classic
    #: session PySpark otherwise pickles them and a Python worker unpickles them in the JVM's job (an
    #: append of 10 events 0.70 -> 0.40 s on local Spark, one JVM alternating). Local Spark only: its
    #: PySpark is this package's (4.x takes a pyarrow Table); a Databricks Runtime's may be older
    frames_from_arrow: bool = False
    #: the tick lease (runner/lease.py) is a file on this machine, not a row of the lakehouse: local Apache
    #: Spark, whose tables are on this machine and whose MERGE commits cost seconds (a claim 4-6 s and a
    #: release 2-3 s there, against 0.07 s each on Sail); every other engine keeps it in the lakehouse
    lease_in_files: bool = False

    def location(self, name: str) -> Path | None:
        """Where ``schema.table`` lives on local disk, when the engine manages the files (else None)."""
        return None

    def table_version(self, spark: SparkSession, name: str) -> int | None:
        rows = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()
        self.count_history_rows(1)
        return int(rows[0]["version"]) if rows else None

    def data_changed_between(self, spark: SparkSession, name: str, after: int, up_to: int) -> bool:
        """Whether a commit after version ``after`` up to ``up_to`` changed data, from the table's history (one
        query, :meth:`operations_between`): any operation outside delta_log.NO_DATA_OPERATIONS does; a range the
        history no longer holds whole counts as changed (the safe answer)."""
        operations = self.operations_between(spark, name, after, up_to)
        return operations is None or any(op not in delta_log.NO_DATA_OPERATIONS for op in operations)

    def operations_between(self, spark: SparkSession, name: str, after: int, up_to: int) -> list[str] | None:
        """The operations of the commits after version ``after`` up to ``up_to``, from the table's history (one
        query); None when the history no longer holds the range whole.

        Invariant: the read is bounded by the versions asked for: ``DESCRIBE HISTORY ... LIMIT`` the range plus
        ``HISTORY_SLACK`` (commits made since ``up_to`` was read), never the table's whole history (30 days of a
        streaming table's commits); a range over ``HISTORY_MAX_ROWS`` versions is not read (None)."""
        from pyspark.sql import functions as F

        wanted = int(up_to) - int(after)
        if wanted <= 0:
            return []
        if wanted > HISTORY_MAX_ROWS:
            return None
        # LIMIT takes no parameter marker: an int, built here, never text from outside
        rows = (spark.sql(f"DESCRIBE HISTORY {name} LIMIT {wanted + HISTORY_SLACK:d}")
                .where((F.col("version") > int(after)) & (F.col("version") <= int(up_to)))
                .select("operation").collect())
        self.count_history_rows(wanted + HISTORY_SLACK)
        return [str(row["operation"]) for row in rows] if len(rows) >= wanted else None

    def count_history_rows(self, rows: int) -> None:
        """Add to ``history_rows``: history rows asked for (an upper bound of what the engine read)."""
        with _HISTORY_LOCK:
            self.history_rows += rows

    #: history rows read by this adapter's queries (table_version, data_changed_between): the benchmark's figure
    history_rows: int = 0

    def has_catalog_look(self, spark: SparkSession, catalog: str) -> bool:
        """Whether ``catalog`` has an ``information_schema`` for the catalog look, asked of the catalog without a
        failing query: a query against a missing one makes Spark log an ERROR line before it raises, so a
        scheduled one-shot tick on a Hive metastore catalog would log one at every run. True where the engine
        has no catalog look (tables_altered answers None there)."""
        if self.local_files or self.manages_locations:
            return True
        return bool(spark.catalog.databaseExists(f"{validate_identifier(catalog, 'catalog')}.information_schema"))

    def tables_altered(self, spark: SparkSession, catalog: str,
                       tables: Sequence[tuple[str, str]]) -> dict[tuple[str, str], CatalogEntry] | None:
        """``(schema, table) -> CatalogEntry`` of those of ``tables`` (lower-case ``(schema, table)`` pairs) that
        ``catalog``'s ``information_schema.tables`` (Unity Catalog) lists: one query, asking for those tables
        only (their names bound as parameters, never spliced into the text). None where the engine's tables are
        on this machine (a log listing is cheaper than any catalog).

        Invariant: ``last_altered`` is read as microseconds since the epoch (``unix_micros``), so it is the
        same instant whatever the session's or this process's time zone. CatalogLookError (from the engine's
        error): NoCatalogLookError where the catalog has no information_schema, else CatalogLookUnavailableError."""
        if self.local_files or self.manages_locations:
            return None
        by_schema: dict[str, list[str]] = {}
        for schema, table in tables:
            by_schema.setdefault(schema, []).append(table)
        args: dict[str, object] = {}
        clauses = []
        for i, (schema, names) in enumerate(sorted(by_schema.items())):
            args[f"s{i}"] = schema
            marks = []
            for j, table in enumerate(sorted(set(names))):
                args[f"t{i}_{j}"] = table
                marks.append(f":t{i}_{j}")
            clauses.append(f"(table_schema = :s{i} AND table_name IN ({', '.join(marks)}))")
        if not clauses:
            return {}
        query = (f"SELECT table_schema, table_name, table_type, unix_micros(last_altered) AS altered_us "
                 f"FROM {validate_identifier(catalog, 'catalog')}.information_schema.tables WHERE "
                 + " OR ".join(clauses))
        try:
            rows = spark.sql(query, args=args).collect()
        except Exception as exc:  # noqa: BLE001 - classified below, the cause kept
            if is_kind(exc, EngineUnavailableError):
                raise
            if is_kind(exc, NoCatalogLookError):
                raise NoCatalogLookError(f"{catalog} has no information_schema: {first_line(exc)}") from exc
            raise CatalogLookUnavailableError(f"the catalog look of {catalog} failed: {first_line(exc)}") from exc
        return {(str(r["table_schema"]).lower(), str(r["table_name"]).lower()): CatalogEntry(
                    None if r["altered_us"] is None else datetime.fromtimestamp(r["altered_us"] / 1e6, tz=timezone.utc),
                    str(r["table_type"] or "").upper() in VOUCHED_TABLE_TYPES)
                for r in rows}

    def disk_location(self, spark: SparkSession, name: str) -> Path | None:
        """Where ``name`` keeps its files on this machine (None when not ``local_files``, or not a local
        path): one DESCRIBE DETAIL. Raises what the engine raises for a missing table."""
        if not self.local_files:
            return None
        return local_path(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"])

    def disk_locations(self, spark: SparkSession, schema: str) -> dict[str, Path]:
        """table (lower case) -> where it keeps its files on this machine, for every table of ``schema`` the
        catalog lists with a local location: one ``SHOW TABLE EXTENDED`` (catalog metadata only, no table's log
        is read); {} when not ``local_files``. At 1,000 tables this replaces 1,000 DESCRIBE DETAILs (each loads
        the table's snapshot): a cold first tick on local Spark spent ~100 s in them."""
        if not self.local_files:
            return {}
        rows = spark.sql(f"SHOW TABLE EXTENDED IN {validate_identifier(schema, 'schema')} LIKE '*'").collect()
        out = {}
        for row in rows:
            location = next((line.split(":", 1)[1].strip() for line in str(row["information"] or "").splitlines()
                             if line.startswith("Location:")), None)
            if (found := local_path(location)) is not None:
                out[str(row["tableName"]).lower()] = found
        return out

    def file_count(self, spark: SparkSession, name: str) -> int:
        return int(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["numFiles"])

    def compact(self, spark: SparkSession, name: str) -> None:
        spark.sql(f"OPTIMIZE {name}")

    def vacuum(self, spark: SparkSession, name: str, retention_hours: float) -> None:
        """Databricks refuses a retention below 7 days unless its safety check is off: at least 168 hours."""
        spark.sql(f"VACUUM {name} RETAIN {max(168, int(retention_hours))} HOURS")

    def delete_matched(self, spark: SparkSession, name: str, keys: str, on: str) -> None:
        """Delete the rows of ``name`` (alias ``t``) that ``on`` matches in the table ``keys`` (alias
        ``b``), in one commit. Both names and ``on`` are built by the caller from validated names."""
        spark.sql(f"MERGE INTO {name} t USING {keys} b ON {on} WHEN MATCHED THEN DELETE")

    def add_columns(self, spark: SparkSession, name: str, columns: Sequence[Column]) -> None:
        """Add ``columns`` to ``name``, empty in every row: one commit (names and types validated by the caller)."""
        spark.sql(f"ALTER TABLE {name} ADD COLUMNS ({', '.join(f'{c.name} {c.sql_type}' for c in columns)})")

    def delete_before(self, spark: SparkSession, name: str, column: str, cutoff: datetime) -> None:
        """Delete the rows of ``name`` whose ``column`` is before ``cutoff`` (one commit)."""
        literal = sql_string(cutoff.strftime("%Y-%m-%d %H:%M:%S.%f"))
        spark.sql(f"DELETE FROM {name} WHERE {column} < CAST({literal} AS TIMESTAMP)")

    def changes(self, spark: SparkSession, name: str, start: int, end: int) -> DataFrame | None:
        """The rows versions ``start``..``end`` (inclusive) inserted or updated to, with the table's
        own columns only; None when the table has no readable change data feed for that range.

        Read with Delta's ``readChangeFeed`` option. The read is probed here (one row), so that
        Delta's refusal of a range it did not record (DELTA_MISSING_CHANGE_DATA, e.g. the feed was
        turned on after ``start``) means None, not a failure of the caller's query; Delta may raise
        it only when the scan is planned. Other errors raise.
        """
        if not self._feed_enabled(spark, name):
            return None
        reader = (spark.read.format("delta").option("readChangeFeed", "true")
                  .option("startingVersion", int(start)).option("endingVersion", int(end)))
        path = delta_path(name)
        try:
            feed = reader.load(path) if path is not None else reader.table(name)
            feed.isEmpty()
        except Exception as exc:
            if not is_kind(exc, ChangeFeedRangeMissingError):
                raise
            log.info("%s: no change data feed for versions %d..%d: %s", name, start, end, exc)
            return None
        from pyspark.sql import functions as F

        return feed.where(F.col("_change_type").isin(*NEW_ROW_CHANGE_TYPES)).drop(*CHANGE_FEED_COLUMNS)

    def _feed_enabled(self, spark: SparkSession, name: str) -> bool:
        """Whether the table's current properties turn the change data feed on."""
        properties = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["properties"] or {}
        return str(properties.get(CHANGE_FEED_PROPERTY, "")).lower() == "true"


class DeltaSparkOps(TableOps):
    """A classic Spark session with Delta: delta-spark's ``DeltaTable`` for history, detail and
    maintenance. The local sessions Heartbeat starts turn Delta's retention check off, so the
    policy's retention applies as it does on the embedded engine."""

    def table_version(self, spark: SparkSession, name: str) -> int | None:
        rows = _delta_table(spark, name).history(1).select("version").collect()
        return int(rows[0]["version"]) if rows else None

    def file_count(self, spark: SparkSession, name: str) -> int:
        return int(_delta_table(spark, name).detail().select("numFiles").collect()[0]["numFiles"])

    def compact(self, spark: SparkSession, name: str) -> None:
        _delta_table(spark, name).optimize().executeCompaction()

    def vacuum(self, spark: SparkSession, name: str, retention_hours: float) -> None:
        _delta_table(spark, name).vacuum(max(0.0, retention_hours))

    def delete_matched(self, spark: SparkSession, name: str, keys: str, on: str) -> None:
        (_delta_table(spark, name).alias("t").merge(spark.table(keys).alias("b"), on)
         .whenMatchedDelete().execute())

    def delete_before(self, spark: SparkSession, name: str, column: str, cutoff: datetime) -> None:
        from pyspark.sql import functions as F

        _delta_table(spark, name).delete(F.col(column) < F.lit(cutoff))


def _delta_table(spark: SparkSession, name: str) -> Any:
    """delta-spark's handle on ``schema.table`` or on a path table ``delta.`/path```."""
    from delta.tables import DeltaTable

    path = delta_path(name)
    return DeltaTable.forPath(spark, path) if path is not None else DeltaTable.forName(spark, name)


@dataclass(kw_only=True)
class EmbeddedOps(TableOps):
    """The embedded engine: tables live under ``warehouse_dir``; read and maintained with the
    ``deltalake`` package (Sail has no DESCRIBE HISTORY, OPTIMIZE or VACUUM)."""

    warehouse_dir: Path
    manages_locations: bool = True
    maintenance_check_interval_s: float = 0.0
    writes_change_feed: bool = False
    stages_merge_sources: bool = True
    seeds_from_file: bool = True

    def location(self, name: str) -> Path:
        return self.warehouse_dir.joinpath(*name.split(".")[-2:])

    def table_version(self, spark: SparkSession, name: str) -> int | None:
        return delta_log.latest_version(self.location(name))

    def file_count(self, spark: SparkSession, name: str) -> int:
        from deltalake import DeltaTable

        return len(DeltaTable(str(self.location(name))).file_uris())

    def compact(self, spark: SparkSession, name: str) -> None:
        from deltalake import DeltaTable

        DeltaTable(str(self.location(name))).optimize.compact()
        DeltaTable(str(self.location(name))).create_checkpoint()

    def vacuum(self, spark: SparkSession, name: str, retention_hours: float) -> None:
        from deltalake import DeltaTable

        table = DeltaTable(str(self.location(name)))
        table.vacuum(retention_hours=max(0, int(retention_hours)), enforce_retention_duration=False, dry_run=False)
        table.cleanup_metadata()

    def add_columns(self, spark: SparkSession, name: str, columns: Sequence[Column]) -> None:
        """With the ``deltalake`` package: Sail has no ALTER TABLE ... ADD COLUMNS. The engine, which
        registered the table before, sees the columns in the next statement (tests/test_migrations.py
        restores views that read them right after)."""
        from deltalake import DeltaTable
        from deltalake.schema import Field, PrimitiveType

        DeltaTable(str(self.location(name))).alter.add_columns(
            [Field(c.name, PrimitiveType(c.delta_type), nullable=True) for c in columns])

    def changes(self, spark: SparkSession, name: str, start: int, end: int) -> DataFrame | None:
        """The feed read with the ``deltalake`` package: Sail ignores the ``readChangeFeed`` option
        (it returns the table itself) and has no DESCRIBE DETAIL. The rows go to Spark as Arrow."""
        new_rows = _new_rows_from_feed(delta_path(name) or str(self.location(name)), start, end)
        if new_rows is None:
            return None
        if new_rows.num_rows == 0:  # createDataFrame cannot infer a schema from no rows
            return spark.sql(f"SELECT * FROM {name} VERSION AS OF {int(end)}").limit(0)
        with _UPLOAD_LOCK:
            return spark.createDataFrame(new_rows)


def _new_rows_from_feed(location: str, start: int, end: int) -> pa.Table | None:
    """The inserted and updated-to rows of versions ``start``..``end`` of the Delta table at
    ``location``, typed as the table at ``end``; None when the feed does not cover the range
    (not recorded at one of its versions, or not readable: log or files cleaned up)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        if not _feed_recorded(DeltaTable(location, version=start), start, end):
            return None
        table = DeltaTable(location, version=end)
        changes = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=start, ending_version=end)).read_all()
    except DeltaError as exc:
        log.warning("%s: change data feed for versions %d..%d not readable: %s", location, start, end, exc)
        return None
    # deltalake gives strings as string_view, which neither pyarrow's filter nor Spark can take:
    # cast to the table's own schema (string) first
    is_new = pc.is_in(changes["_change_type"].cast(pa.string()), pa.array(NEW_ROW_CHANGE_TYPES))
    own = pa.schema(table.schema().to_arrow())
    return changes.select(own.names).cast(own).filter(is_new)


def _feed_recorded(table: DeltaTable, start: int, end: int) -> bool:
    """Whether ``table`` (loaded at ``start``) had the change data feed on at every version from
    ``start`` to ``end``. deltalake's ``load_cdf`` does not check it: for commits made without
    the feed it reports the rows of their added files as inserts (one metadata load per version)."""
    for version in range(start, end + 1):
        if version > start:
            table.load_as_version(version)
        if str(table.metadata().configuration.get(CHANGE_FEED_PROPERTY, "")).lower() != "true":
            return False
    return True


def local_path(location: str | None) -> Path | None:
    """A table location (``file:/x``, ``file:///x`` or ``/x``) as a local path; None for other schemes."""
    from urllib.parse import urlparse

    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file") or not parsed.path.startswith("/"):
        return None
    return Path(parsed.path)


def delta_path(name: str) -> str | None:
    """The path of a ``delta.`<path>``` table reference, None for a table name."""
    if name.startswith("delta.`") and name.endswith("`"):
        return name[len("delta.`"):-1]
    return None


@dataclass
class LocalServer:
    """The embedded engine's child process and how to start it again (same port when one was asked
    for, as ``serve`` promises its clients; the same Spark Connect session id)."""

    process: SailProcess
    port: int = 0
    session_id: str | None = None

    @property
    def url(self) -> str:
        return self.process.url + (f"/;session_id={self.session_id}" if self.session_id else "")


@dataclass
class Engine:
    """An open Spark session plus where its tables live.

    ``ops`` is the engine's adapter for table versions and maintenance; ``closer`` stops what
    opening the engine started (an embedded server, a local JVM), None when it owns nothing.
    ``spark`` changes when the engine is recycled or woken: read it from the engine each time, never
    keep it. An embedded engine can be *parked* (its process ended while nothing needs it, see
    :meth:`park`); reading ``spark`` then starts a new process first, so callers never see the gap.
    """

    #: the Spark session as last opened (may point at a parked server: use :attr:`spark`)
    session: SparkSession
    settings: Settings
    ops: TableOps = field(default_factory=TableOps)
    closer: Callable[[], None] | None = None
    #: this process joined an engine another Heartbeat process holds (local Spark), which opened the
    #: lakehouse already: its schema and tables exist, so opening skips those catalog calls
    joined: bool = False
    #: the embedded engine's child process (None: the engine runs elsewhere and cannot be recycled)
    server: LocalServer | None = None
    #: SQL texts sent through :meth:`sql` since the engine opened (each one a parse on the engine)
    sql_count: int = 0
    #: how often the engine's process was recycled, and what the last recycle took (seconds)
    recycles: int = 0
    last_recycle_s: float = 0.0
    #: moves whenever a view's answer may change while no table does (views re-created, engine recycled)
    generation: int = 0
    #: restores what a new engine process does not know (the views): set by the layer that owns them,
    #: called after every recycle and wake, with the engine usable; True when the engine then answers
    #: exactly as before (the same views re-created), False when something was rebuilt
    on_restart: Callable[[], bool] | None = None
    #: the embedded engine's process was ended while idle (:meth:`park`); the next use starts one
    parked: bool = False
    #: how often a parked engine was started again, and what the last start took (seconds)
    wakes: int = 0
    last_wake_s: float = 0.0
    _last_use: float = field(default_factory=time.monotonic, repr=False)
    _waker: int | None = field(default=None, repr=False)
    _registered: set[str] = field(default_factory=set)
    #: re-entrant: a wake runs inside whatever use of the engine asked for it (ensure_registered holds it)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    #: where tables of a ``local_files`` engine live, asked once per table (see delta_log_dir)
    _disk: dict[str, Path] = field(default_factory=dict, repr=False)
    #: catalog -> (failed looks in a row, monotonic time before which it is not asked again): see catalog_look
    _look_failures: dict[str, tuple[int, float]] = field(default_factory=dict, repr=False)
    #: catalogs found to have an information_schema (TableOps.has_catalog_look): not asked again this process
    _look_found: set[str] = field(default_factory=set, repr=False)
    #: tables whose ``last_altered`` was found lagging their history (see delta_table): sensed from their history
    #: for the rest of the process, logged once
    catalog_lagging: set[str] = field(default_factory=set, repr=False)
    #: where the next spot check of a table the catalog rules out begins (delta_table, in turn)
    catalog_spot_turn: int = 0
    #: ``sql(args=...)`` takes a list as one array parameter (Apache Spark 4.0 and the embedded engine); False on
    #: Spark 3.5 (Databricks Runtime 16.4 LTS), which takes literals only: lists then bind one value each
    binds_arrays: bool = True

    @property
    def spark(self) -> SparkSession:
        """The engine's session, started again first when the engine is parked; every read counts as a use."""
        if self.parked:
            self._wake()
        self._last_use = time.monotonic()
        return self.session

    @property
    def idle_s(self) -> float:
        """Seconds since the engine was last used (0.0 while parked: nothing to park)."""
        return 0.0 if self.parked else time.monotonic() - self._last_use

    def touch(self) -> None:
        """Count a use the engine cannot see (dbt talks to the server through its own session)."""
        self.spark  # noqa: B018 - wakes a parked engine and records the use

    def sql(self, text: str, args: dict[str, object] | None = None) -> DataFrame:
        """The engine's SQL entry point: ``spark.sql`` counted in :attr:`sql_count` (Sail's parser
        keeps memory per parse, so idle ticks send as few texts as they can)."""
        self.sql_count += 1
        return self.spark.sql(text, args=args)

    def frame(self, rows: Sequence[tuple], schema: StructType) -> DataFrame:
        """A DataFrame of ``rows``, tuples in the order of ``schema``'s fields (what the writes append)."""
        if not self.ops.frames_from_arrow:
            return self.spark.createDataFrame(list(rows), schema)
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow = to_arrow_schema(schema)
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(arrow)
        return self.spark.createDataFrame(pa.Table.from_arrays(
            [pa.array(values, type=field.type) for values, field in zip(columns, arrow, strict=True)], schema=arrow))

    def tables_fingerprint(self) -> tuple | None:
        """The newest version of every Delta table in Heartbeat's schema, with :attr:`generation`; None
        where versions are not a file listing away (see :meth:`own_tables_dir`).

        Heartbeat's views read only these tables and no clock, so while the fingerprint stays equal a
        view returns the same rows (TableStore caches reads on it: an idle tick then parses no SQL)."""
        base = self.own_tables_dir()
        if base is None:
            return None
        try:
            names = sorted(os.listdir(base))
        except OSError:
            names = []
        return (self.generation, *((name, delta_log.latest_version(base / name)) for name in names))

    def own_tables_dir(self) -> Path | None:
        """The folder on this machine holding a folder per table of Heartbeat's schema, and nothing of
        other schemas: the embedded engine's ``warehouse/<schema>``; on local Apache Spark the folder its
        managed tables share (``<schema>.db``), once the location of one of them was asked and every
        location known so far agrees; None elsewhere (Databricks, remote Spark)."""
        if self.ops.manages_locations:
            return self.settings.warehouse_dir / self.settings.schema
        own = f"{self.settings.schema}."
        parents = {path.parent for name, path in self._disk.items() if name.startswith(own)}
        return parents.pop() if len(parents) == 1 else None

    @property
    def can_recycle(self) -> bool:
        """The engine runs in a child process this one owns, which :meth:`recycle` can replace."""
        return self.server is not None

    def engine_rss_bytes(self) -> int:
        """Resident memory of the engine's own process (0 when it runs in this process or elsewhere, or
        is parked)."""
        return self.server.process.rss_bytes() if self.server is not None and not self.parked else 0

    def recycle(self) -> float:
        """Replace the engine's process with a fresh one, register the tables again and call
        :attr:`on_restart`; return the seconds it took (0.0 when the engine cannot be recycled). Call
        it between ticks: a query running meanwhile fails. A parked engine stays parked."""
        if self.server is None or self.parked:
            return 0.0
        began = time.monotonic()
        with self._lock:
            self._stop_server()
            self._start_server()
        self.recycles += 1
        metrics().engine_recycles.inc()
        self.last_recycle_s = time.monotonic() - began
        return self.last_recycle_s

    def park(self) -> bool:
        """End the embedded engine's process while nothing needs it (the loop's idle stretches): its
        memory goes back to the machine, and the next read of :attr:`spark` starts a new process
        (:meth:`recycle`'s cost, once). Nothing is lost: Heartbeat keeps nothing in the engine. Only
        between ticks. Whether it parked (False where the engine cannot be recycled)."""
        if self.server is None or self.parked:
            return False
        with self._lock:
            self._stop_server()
            self.parked = True
        return True

    def _wake(self) -> None:
        """Start a parked engine again; other threads wait for it, the waking thread's own uses of the
        engine (registering tables, restoring views) pass."""
        with self._lock:
            if not self.parked or self._waker == threading.get_ident():
                return
            assert self.server is not None
            began = time.monotonic()
            self._waker = threading.get_ident()
            try:
                try:
                    self._start_server()
                except BaseException:
                    self.server.process.stop()  # parked still: the next use tries again
                    raise
                self.parked = False
            finally:
                self._waker = None
            self.wakes += 1
            metrics().engine_wakes.inc()
            self.last_wake_s = time.monotonic() - began
            log.info("embedded engine started again after being parked, in %.2f s", self.last_wake_s)

    def _stop_server(self) -> None:
        assert self.server is not None
        _drop_session(self.session)
        self.server.process.stop()

    def _start_server(self) -> None:
        assert self.server is not None
        self.server.process = SailProcess.start(self.server.port)
        self._connect_server()

    def _connect_server(self) -> None:
        """Connect to the (new) server process and tell it what the old one knew. When it then answers
        exactly as the old one did (the same tables, the views re-created from the same SQL: see
        :attr:`on_restart`), :attr:`generation` is put back, so reads cached before stay valid: an idle
        tick after a recycle or a wake still sends no SQL."""
        assert self.server is not None
        generation = self.generation
        try:
            self.session = _connect_local(self.settings, self.server.url)
        except Exception:
            self.server.process.stop()
            raise
        self._registered.clear()
        self.generation += 1
        self.register_schema(self.settings.schema)
        if self.on_restart is None or self.on_restart():
            self.generation = generation

    @property
    def target(self) -> Target:
        return self.settings.target

    @property
    def is_local(self) -> bool:
        """The engine manages table locations under the lakehouse (the embedded one)."""
        return self.ops.manages_locations

    def table(self, name: str) -> str:
        """Fully-qualified name of one of Heartbeat's own tables."""
        prefix = f"{self.settings.catalog}." if self.settings.catalog else ""
        return f"{prefix}{self.settings.schema}.{validate_identifier(name, 'table name')}"

    def upstream_table(self, table_name: str) -> str:
        """An upstream table name as SQL sees it: a bare name goes into the default upstream schema.

        Locally that is ``settings.upstream_schema`` or ``default``; on Spark and Databricks a
        bare name without the setting stays bare, so the session's current schema resolves it.
        """
        fallback = "default" if self.is_local else None
        return qualify(table_name, self.settings.upstream_schema or fallback)

    def local_location(self, table_name: str) -> Path | None:
        """Where a ``schema.table`` lives on local disk, when the engine manages the files."""
        if not is_table_name(table_name) or "." not in table_name:
            return None
        return self.ops.location(table_name)

    def delta_log_dir(self, table_name: str) -> Path | None:
        """The folder holding ``table_name``'s ``_delta_log`` on this machine, so that its version is a
        directory listing, not a Spark job; None when the engine's files are elsewhere (Databricks,
        a remote Spark) or the table is not found. The embedded engine knows it; local Apache Spark is
        asked once per table (one DESCRIBE DETAIL), remembered while that folder holds a Delta log."""
        known = self._known_location(table_name)
        if known is not None or not self.ops.local_files:
            return known
        try:
            found = self.ops.disk_location(self.spark, table_name)
        except Exception as exc:  # noqa: BLE001 - not found or not readable: the caller's Spark path says why
            log.debug("%s: no location (%s)", table_name, exc)
            return None
        return self._remember_location(table_name, found)

    def learn_locations(self, table_names: Sequence[str]) -> None:
        """Ask where the unknown ones of ``table_names`` (``schema.table``) keep their files in one catalog
        listing per schema, before :meth:`delta_log_dir` would ask each alone; remembered as it remembers.
        A schema whose listing fails is left to the per-table path (which says why)."""
        if not self.ops.local_files:
            return
        by_schema: dict[str, dict[str, str]] = {}  # schema -> table -> the name as given (all lower case keys)
        for name in table_names:
            parts = name.lower().split(".")
            if len(parts) == 2 and is_table_name(name) and self._known_location(name) is None:
                by_schema.setdefault(parts[0], {})[parts[1]] = name
        for schema, tables in by_schema.items():
            if len(tables) < 2:
                continue  # one DESCRIBE DETAIL costs no more than the listing
            try:
                listed = self.ops.disk_locations(self.spark, schema)
            except Exception as exc:  # noqa: BLE001 - each table is asked alone then, and its error is kept
                log.debug("could not list the tables of %s: %s", schema, exc)
                continue
            for table, name in tables.items():
                self._remember_location(name, listed.get(table))

    def _known_location(self, table_name: str) -> Path | None:
        """Where ``table_name`` lives, if the engine manages its files or it was found before."""
        return self.local_location(table_name) or self._disk.get(table_name)

    def _remember_location(self, table_name: str, found: Path | None) -> Path | None:
        """Remember ``found`` as ``table_name``'s folder while it holds a Delta log; that folder, else None."""
        if found is not None and (found / "_delta_log").is_dir():
            self._disk[table_name] = found
            return found
        return None

    def forget_location(self, table_name: str) -> None:
        """Ask again next time (the table was dropped or re-created elsewhere)."""
        self._disk.pop(table_name, None)

    def own_location(self, name: str) -> Path | None:
        return self.local_location(f"{self.settings.schema}.{name}")

    def ensure_registered(self, table_name: str) -> None:
        """Make a local ``schema.table`` whose Delta files exist visible to SQL (no-op elsewhere)."""
        location = self.local_location(table_name)
        if location is None or table_name in self._registered:
            return
        with self._lock:
            if table_name in self._registered or not (location / "_delta_log").is_dir():
                return
            schema, table = table_name.split(".")[-2:]
            if schema != self.settings.schema:  # Heartbeat's own schema exists from the start
                self.sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            self.sql(f"CREATE TABLE IF NOT EXISTS {schema}.{table} USING delta LOCATION {sql_string(str(location))}")
            self._registered.add(table_name)

    def create_delta_table(self, table_name: str, columns: str, properties: str = "") -> None:
        """Create ``schema.table`` (and its schema) if missing: at its fixed location when the engine
        manages locations, a managed table elsewhere. ``columns`` / ``properties`` are DDL written by
        the caller (demo and tests), never config."""
        parts = table_name.split(".")
        if len(parts) != 2:
            raise ValueError(f"{table_name!r}: expected schema.table")
        schema, table = (validate_identifier(p, "table name part") for p in parts)
        location = self.local_location(table_name)
        where = f" LOCATION {sql_string(str(location))}" if location else ""
        extra = f" TBLPROPERTIES ({properties})" if properties else ""
        self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {schema}.{table} ({columns}) USING delta{where}{extra}")

    def register_schema(self, schema: str) -> list[str]:
        """Register every Delta table found under ``warehouse/<schema>``; return their names."""
        names = []
        base = self.settings.warehouse_dir / schema
        if base.is_dir():
            for child in sorted(base.iterdir()):
                if (child / "_delta_log").is_dir():
                    name = f"{schema}.{child.name}"
                    self.ensure_registered(name)
                    names.append(name)
        return names

    # -- table maintenance (through the engine's adapter) --------------------------------------

    def table_version(self, name: str) -> int | None:
        """The newest Delta version of ``name`` (``schema.table``), None when it does not exist: from its
        ``_delta_log`` where that is on this machine (see delta_log_dir), else the engine's history."""
        folder = self.delta_log_dir(name)
        if folder is not None:
            version = delta_log.latest_version(folder)
            if version is not None or self.ops.manages_locations:  # the engine's own folder: the answer
                return version
            self.forget_location(name)
        return self.ops.table_version(self.spark, name)

    def data_changed_between(self, name: str, after: int, up_to: int) -> bool:
        """Whether a commit of ``name`` after version ``after`` up to ``up_to`` changed data (its history; the
        engine's adapter, see TableOps.data_changed_between)."""
        return self.ops.data_changed_between(self.spark, name, after, up_to)

    def operations_between(self, name: str, after: int, up_to: int) -> list[str] | None:
        """The operations of the commits of ``name`` after version ``after`` up to ``up_to`` (None: not all of
        them are known any more): from its ``_delta_log`` where that is on this machine, else its history."""
        folder = self.delta_log_dir(name)
        if folder is not None:
            return delta_log.operations_between(folder, after, up_to)
        return self.ops.operations_between(self.spark, name, after, up_to)

    def catalog_look(self, names: Sequence[str]) -> dict[str, CatalogEntry] | None:
        """For each of ``names`` (``catalog.schema.table``, or ``schema.table`` in Heartbeat's catalog) that its
        catalog lists, what the catalog says of it (``CatalogEntry``); one query per catalog, asking for these
        tables only. None when the engine has no such look (local engines). A name not in the answer is not
        vouched for: its caller senses it from its history.

        A failing look (CatalogLookError) is logged as a warning, counted (``heartbeat_catalog_look_failures``)
        and asked again after a back-off (``CATALOG_LOOK_BACKOFF``); meanwhile the catalog answers for none of its
        tables. Never switched off for the process: the first look that works again is used. A catalog without an
        information_schema (a Hive metastore) is found without a failing query (TableOps.has_catalog_look) and
        backed off the same way, with an INFO line instead of a warning: nothing failed."""
        by_catalog: dict[str, dict[tuple[str, str], str]] = {}
        for name in names:
            if not is_table_name(name):
                continue
            parts = name.lower().split(".")
            if len(parts) == 2 and self.settings.catalog:
                parts.insert(0, self.settings.catalog.lower())
            if len(parts) == 3:
                by_catalog.setdefault(parts[0], {})[(parts[1], parts[2])] = name
        out: dict[str, CatalogEntry] = {}
        now = time.monotonic()
        for catalog, wanted in by_catalog.items():
            failures, not_before = self._look_failures.get(catalog, (0, 0.0))
            if now < not_before:
                continue  # backing off: its tables are sensed from their history this tick
            if not self._catalog_has_look(catalog, len(wanted), now):
                continue
            try:
                found = self._look_in_batches(catalog, sorted(wanted))
            except CatalogLookError as exc:
                failures += 1
                terminal = isinstance(exc, NoCatalogLookError)
                wait = CATALOG_LOOK_BACKOFF.max_s if terminal else CATALOG_LOOK_BACKOFF.after(failures)
                self._look_failures[catalog] = (failures, now + wait)
                metrics().catalog_look_failures.labels(kind="terminal" if terminal else "transient").inc()
                log.warning("catalog look of %s failed (%d in a row): %s; its %d table(s) are sensed from their "
                            "history, and the look is asked again in %.0f s", catalog, failures, exc, len(wanted), wait)
                continue
            if found is None:
                return None
            if failures:
                log.warning("catalog look of %s works again after %d failure(s)", catalog, failures)
                self._look_failures.pop(catalog, None)
            out.update({name: entry for key, name in wanted.items() if (entry := found.get(key)) is not None})
        return out

    def _catalog_has_look(self, catalog: str, tables: int, now: float) -> bool:
        """Whether to look in ``catalog`` now: asked of the catalog once per process while it has an
        information_schema, and at each back-off's end while it has none (then its ``tables`` are sensed from
        their history until the next, with one INFO line). A question that fails answers yes: the look's own
        query then fails and is classified and backed off as any failing look is."""
        if catalog in self._look_found:
            return True
        try:
            found = self.ops.has_catalog_look(self.spark, catalog)
        except Exception as exc:  # noqa: BLE001 - the look itself raises the classified error, the cause kept
            log.debug("asking whether %s has an information_schema failed: %s", catalog, first_line(exc))
            return True
        if found:
            self._look_found.add(catalog)
            if not self._look_failures.get(catalog, (0, 0.0))[0]:
                self._look_failures.pop(catalog, None)  # it had none when last asked
            return True
        self._look_failures[catalog] = (0, now + CATALOG_LOOK_BACKOFF.max_s)
        log.info("%s has no information_schema (a Hive metastore or a plain Spark catalog): its %d table(s) are "
                 "sensed from their history; asked again in %.0f s", catalog, tables, CATALOG_LOOK_BACKOFF.max_s)
        return False

    def _look_in_batches(self, catalog: str, tables: list[tuple[str, str]]) -> dict[tuple[str, str], CatalogEntry] | None:
        """``ops.tables_altered`` for ``tables``, CATALOG_LOOK_BATCH names per query (a statement binding
        thousands of parameters meets the SQL endpoint's limits on size and parameters); the answers merged.
        One failing batch fails the look (CatalogLookError): the catalog then answers for none of them."""
        found: dict[tuple[str, str], CatalogEntry] = {}
        for start in range(0, len(tables), CATALOG_LOOK_BATCH):
            batch = self.ops.tables_altered(self.spark, catalog, tables[start:start + CATALOG_LOOK_BATCH])
            if batch is None:
                return None
            found.update(batch)
        return found

    def file_count(self, name: str) -> int:
        """How many data files the current version of ``name`` references."""
        return self.ops.file_count(self.spark, name)

    def compact(self, name: str) -> None:
        """Rewrite small data files into few large ones (a commit without new data), then checkpoint."""
        self.ops.compact(self.spark, name)

    def vacuum(self, name: str, *, retention_hours: float) -> None:
        """Delete data files unreferenced for ``retention_hours`` and log files past their retention."""
        self.ops.vacuum(self.spark, name, retention_hours)

    def delete_matched(self, name: str, keys: str, on: str) -> None:
        """Delete the rows of ``name`` (alias t) matched by ``on`` in ``keys`` (alias b): one commit."""
        self.ops.delete_matched(self.spark, name, keys, on)

    def delete_before(self, name: str, column: str, cutoff: datetime) -> None:
        """Delete the rows of ``name`` whose ``column`` is before ``cutoff``: one commit."""
        self.ops.delete_before(self.spark, name, validate_identifier(column, "column"), cutoff)

    def changes(self, name: str, start: int, end: int) -> DataFrame | None:
        """The rows versions ``start``..``end`` of ``name`` inserted or updated to, read from the
        table's change data feed with the table's own columns; None when no feed covers the range."""
        return self.ops.changes(self.spark, name, start, end)

    def add_columns(self, name: str, columns: Sequence[Column]) -> None:
        """Add ``columns`` to the table ``name``, empty in every row (a table made by an older Heartbeat)."""
        self.ops.add_columns(self.spark, name, columns)

    def columns(self, name: str) -> list[str]:
        """The column names of the table or view ``name``, as the engine sees them now."""
        return list(self.spark.table(name).columns)

    def table_exists(self, name: str) -> bool:
        return bool(self.spark.catalog.tableExists(name))

    def close(self) -> None:
        """Stop what opening the engine started (idempotent); a remote session is left alone."""
        closer, self.closer = self.closer, None
        if closer is not None:
            closer()


def open_engine(settings: Settings, *, port: int = 0, session_id: str | None = None) -> Engine:
    """Open the engine for ``settings.target`` and re-register Heartbeat's tables.

    ``port`` and ``session_id`` (local target) serve other clients: Sail keeps one catalog
    per Spark Connect session, so clients that connect with the same session id see the
    tables registered here (see ``serve``). A lakehouse folder another engine made is refused
    first (made_by.EngineMismatch), before anything starts.
    """
    made_by.check_and_record(settings)
    if settings.target is Target.LOCAL:
        engine = _open_local(settings, port, session_id)
    elif settings.target is Target.SPARK_LOCAL:
        engine = _open_spark_local(settings)
    elif settings.target is Target.SPARK:
        engine = _open_spark_connect(settings)
    else:
        engine = _open_databricks(settings)
    if engine.is_local:
        engine.register_schema(settings.schema)
    return engine


def _open_local(settings: Settings, port: int = 0, session_id: str | None = None) -> Engine:
    """Start the embedded engine's process and connect to it (see ``sail_process``)."""
    # only the child loads Sail's native library (~14 MiB resident per process that imports it)
    if importlib.util.find_spec("pysail") is None:
        raise ValueError("the local target needs the embedded engine: pip install 'heartbeat-runner[local]'")

    settings.warehouse_dir.mkdir(parents=True, exist_ok=True)
    # the client's Spark Connect modules (~0.5-1 s to import) load while the server process starts
    server = LocalServer(SailProcess.start(port, meanwhile=_import_connect_client), port=port, session_id=session_id)
    try:
        spark = _connect_local(settings, server.url)
    except Exception:
        server.process.stop()
        raise
    engine = Engine(session=spark, settings=settings, ops=EmbeddedOps(warehouse_dir=settings.warehouse_dir),
                    server=server)

    def close() -> None:
        if not engine.parked:
            _stop_session(engine.session)
        server.process.stop()

    engine.closer = close
    return engine


def _import_connect_client() -> None:
    """Load what :func:`_connect_local` needs (a cold process spends most of its connect time importing it)."""
    import pyspark.sql.connect.session  # noqa: F401


def _connect_local(settings: Settings, url: str) -> SparkSession:
    """A Spark Connect session on the embedded engine at ``url``, made the process's default (dbt-spark's
    ``session`` method calls ``SparkSession.builder.getOrCreate()`` and finds it through ``SPARK_REMOTE``)."""
    from pyspark.sql import SparkSession

    os.environ["SPARK_REMOTE"] = url
    # create(), not getOrCreate(): the latter returns the process's active session, so two
    # engines would share one. dbt-spark's getOrCreate() must then find *this* session, but
    # create() only becomes the default when none is set yet, so set it explicitly.
    spark = SparkSession.builder.remote(url).create()
    make_default_connect_session(spark)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {settings.schema}")
    return spark


def _stop_session(spark: SparkSession) -> None:
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - shutting down anyway
        pass


def _drop_session(spark: Any) -> None:
    """Leave a Spark Connect session whose server is about to be replaced: release it and close its
    channel. Not ``client.close()``, which ``stop()`` and the session's ``__del__`` call: it also
    shuts PySpark's process-wide pool for ReleaseExecute calls, and when the garbage collector runs
    that ``__del__`` while the same thread is about to submit to the pool, every later query of
    the process fails with "cannot schedule new futures after shutdown" (seen in
    tests/test_memory.py's busy loop). So the dropped client's ``close`` becomes a no-op."""
    client = spark.client
    for step in (client.release_session, client._channel.close):
        try:
            step()
        except Exception:  # noqa: BLE001 - the old server goes anyway
            pass
    client._closed = True
    client.close = lambda: None


def _open_spark_local(settings: Settings) -> Engine:
    """Apache Spark + Delta started on this machine (``spark_local``), shared by the process's engines.

    Closing the engine leaves the JVM running for the next engine of the process (it stops at exit).
    """
    from heartbeat_runner.engines.spark_local import local_spark

    running = local_spark(settings.effective_spark_dir, settings.spark_mode, settings.spark_driver_memory)
    if not running.shared:  # the holder made the schema when it opened the lakehouse
        running.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {settings.schema}")
    local = {"stage_events": True, "local_files": True, "stages_merge_sources": True, "lists_relations_by_name": True,
             "frames_from_arrow": True, "lease_in_files": True, "seeds_from_file": True}
    ops = DeltaSparkOps(**local) if running.delta_table_api else TableOps(**local)
    return Engine(session=running.spark, settings=settings, ops=ops, joined=running.shared)


def _open_spark_connect(settings: Settings) -> Engine:
    from pyspark.sql import SparkSession

    url = os.environ.get("SPARK_REMOTE")
    if not url:
        raise ValueError("target 'spark' needs SPARK_REMOTE (a Spark Connect URL, sc://host:port)")
    keep_connect_release_pool()
    spark = SparkSession.builder.remote(url).getOrCreate()
    return Engine(session=spark, settings=settings, binds_arrays=binds_arrays(spark.version))


def _open_databricks(settings: Settings) -> Engine:
    """On a cluster use the active session; elsewhere Databricks Connect (auth via the SDK chain). dbt runs on
    the same session (the profile's ``databricks`` output is dbt-spark's ``session`` method), so Heartbeat's
    catalog becomes the session's current one."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        try:
            from databricks.connect import DatabricksSession
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ValueError(
                "target 'databricks' runs on a Databricks cluster, or needs databricks-connect installed"
            ) from exc
        spark = DatabricksSession.builder.getOrCreate()
    if settings.catalog:
        # dbt-spark names relations schema.table: they resolve in the session's current catalog
        spark.catalog.setCurrentCatalog(validate_identifier(settings.catalog, "catalog"))
    # timestamps Spark hands back naive are in the session's zone: Heartbeat's are UTC (core/records.as_utc),
    # whatever zone the cluster or a Databricks Connect laptop would give the session
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {settings.schema}")  # a first deploy: the events are written before dbt runs
    return Engine(session=spark, settings=settings, binds_arrays=binds_arrays(spark.version))


def binds_arrays(spark_version: str) -> bool:
    """Whether a Spark of ``spark_version`` binds a list passed to ``sql(args=...)`` as an array parameter: 4.0
    does; 3.5 (Databricks Runtime 16.4 LTS) refuses it (``INVALID_SQL_ARG``: only literals are parameters)."""
    major = spark_version.split(".", 1)[0]
    return not major.isdigit() or int(major) >= 4
