"""The one small interface every source type implements.

A source answers a single question for one distinct upstream ("sensing target"):
*is there new data since this cursor, and what is the new cursor?* It never writes
anything; the tick records the answer as an event, so a crash can never advance a
cursor without the event that explains it.

Cursors are opaque JSON strings owned by the source module. ``None`` means the
target was never sensed: the source then returns a *baseline* (the current end of
the upstream, no new data) unless ``ctx.replay_new_sensors`` asks to replay from
the beginning.
"""

from __future__ import annotations

import abc
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from heartbeat_runner.core.records import SensingTarget
from heartbeat_runner.core.secrets import NoSecretScopes, SecretResolver
from heartbeat_runner.core.windows import CUT_POINTS_KEY, EventTimes, SourceWindow, WindowBounds, WindowLimit
from heartbeat_runner.sensing.preprocess import render_preprocess_query

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from heartbeat_runner.engines.engine import Engine
    from heartbeat_runner.sensing.watch import Watch


@dataclass(frozen=True)
class SenseResult:
    """What a source found.

    new_data: whether the jobs fed by this source should see a new event.
    cursor_to: the cursor to store (None = leave it unchanged). A cursor may move
        without new data, e.g. when ``preprocess_query`` filtered every new row out
        or when a new sensor records its baseline.
    window_from / window_to: human-readable bounds of what was consumed, passed to
        jobs and shown in the run report (e.g. Delta versions, key values, offsets).
    """

    new_data: bool
    cursor_to: str | None = None
    window_from: str | None = None
    window_to: str | None = None
    rows: int | None = None
    detail: str | None = None
    #: something the operator should fix although sensing worked (shown in the run report and explain)
    warning: str | None = None
    #: event times of the new rows, for sources read by a job with an event-time window policy
    event_times: EventTimes | None = None
    #: cursors inside the new data where a catch-up run may end, ascending (SAP: after each green
    #: run); none: the event's own end is the only one
    cut_points: tuple[str, ...] = ()

    def payload(self) -> str | None:
        """The NEW_DATA / CURSOR event's payload (JSON): event times and cut points, when there are any."""
        found: dict[str, object] = self.event_times.payload() if self.event_times else {}
        if self.cut_points:
            found[CUT_POINTS_KEY] = list(self.cut_points)
        return json.dumps(found) if found else None


@dataclass
class SenseContext:
    """What a source may use while sensing. Built once per tick, shared by threads."""

    engine: Engine
    trigger_dir: Path
    replay_new_sensors: bool = False
    connections: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: reads ``{secret: scope/key}`` references of the connections (the runner passes the Databricks one)
    secrets: SecretResolver = field(default_factory=NoSecretScopes)
    #: source_key -> bucket (seconds) in which to count event times (sources read by windowed jobs)
    event_time_grains: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def spark(self) -> SparkSession:
        return self.engine.spark

    def count_preprocessed(self, new_rows: DataFrame, target: SensingTarget) -> int:
        """Run the target's ``preprocess_query`` over ``new_rows`` and count its result.

        The query sees the rows as ``sensor_new_data``; ``?upstream_key`` is rendered.
        Each call uses its own temporary view name so parallel sensing cannot clash.
        """
        if not target.preprocess_query:
            return new_rows.count()
        view = f"sensor_new_data_{uuid.uuid4().hex[:12]}"
        new_rows.createOrReplaceTempView(view)
        try:
            sql = render_preprocess_query(target.preprocess_query, target.upstream_key, view)
            return self.engine.sql(sql).count()
        finally:
            self.spark.catalog.dropTempView(view)

    def count_preprocessed_records(self, records: list[dict[str, Any]], target: SensingTarget) -> int:
        """Like :meth:`count_preprocessed` for rows fetched outside Spark (JDBC, Kafka)."""
        if not target.preprocess_query:
            return len(records)
        if not records:
            return 0
        import pandas as pd

        with self._lock:  # createDataFrame from pandas is not thread-safe in Spark Connect
            frame = self.spark.createDataFrame(pd.DataFrame.from_records(records))
        return self.count_preprocessed(frame, target)


@dataclass(frozen=True)
class LineageDataset:
    """A source's upstream as OpenLineage names a dataset: ``namespace`` (the data source, ``scheme://authority``)
    and ``name`` (the dataset in it), per OpenLineage's naming conventions (docs/lineage.md has the table)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class LineageNaming:
    """What a source may use to name its dataset: the connections file (settings as written: references are
    never resolved for a name), the trigger folder, and the namespace of bare table names (the Databricks
    workspace, ``databricks://<host>``, or the local catalog)."""

    connections: dict[str, dict[str, Any]] = field(default_factory=dict)
    trigger_dir: Path = Path(".")
    table_namespace: str = "spark_catalog"


def location_dataset(location: str) -> LineageDataset:
    """A dataset by location: a URL (``s3://bucket/key``, ``abfss://c@a.dfs.core.windows.net/p``, ``dbfs:/p``)
    is split into its scheme and authority (namespace) and its path, without the leading ``/`` (name: the object
    key); a local path is ``file`` + the absolute path."""
    scheme, sep, rest = location.partition("://")
    if sep and scheme:
        authority, _, path = rest.partition("/")
        return LineageDataset(f"{scheme}://{authority}", path or "/")
    if location.startswith("dbfs:"):
        return LineageDataset("dbfs", location[len("dbfs:"):])
    return LineageDataset("file", location)


def table_dataset(reference: str, naming: LineageNaming) -> LineageDataset:
    """A Delta table by path or URL (:func:`location_dataset`), or by name in the catalog's namespace."""
    if reference.startswith("/") or "://" in reference or reference.startswith("dbfs:"):
        return location_dataset(reference)
    return LineageDataset(naming.table_namespace, reference)


#: a database URL's scheme (SQLAlchemy's dialect, or JDBC's sub-protocol) -> OpenLineage's scheme and default port
_DATABASES = {"postgresql": ("postgres", 5432), "postgres": ("postgres", 5432), "mysql": ("mysql", 3306),
              "mariadb": ("mysql", 3306), "mssql": ("sqlserver", 1433), "sqlserver": ("sqlserver", 1433),
              "oracle": ("oracle", 1521), "db2": ("db2", 50000), "teradata": ("teradata", 1025),
              "trino": ("trino", 8080), "redshift": ("redshift", 5439), "snowflake": ("snowflake", 443)}


def database_dataset(url: object, fallback: str, schema_and_table: str) -> LineageDataset:
    """A table of the database a SQLAlchemy or JDBC ``url`` names: ``<scheme>://<host>:<port>`` and
    ``<database>.<schema>.<table>`` (OpenLineage's naming of relational tables; user and password never kept).
    A URL that is a reference or cannot be read: ``fallback`` (``<section>://<connection>``) and the table."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url:
        return LineageDataset(fallback, schema_and_table)
    text, *properties = (url[len("jdbc:"):] if url.startswith("jdbc:") else url).split(";")  # SQL Server's ;k=v
    named = dict(p.split("=", 1) for p in properties if "=" in p)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return LineageDataset(fallback, schema_and_table)
    dialect = parts.scheme.split("+")[0].lower()
    if dialect == "sqlite":
        return LineageDataset(f"sqlite://{parts.path[1:]}", schema_and_table)  # the database file, the table
    scheme, default_port = _DATABASES.get(dialect, (dialect, None))
    if not parts.hostname or not scheme:
        return LineageDataset(fallback, schema_and_table)
    database = parts.path.strip("/").split("/")[0] or named.get("databaseName") or named.get("database", "")
    authority = parts.hostname + (f":{port or default_port}" if (port or default_port) else "")
    return LineageDataset(f"{scheme}://{authority}", f"{database}.{schema_and_table}" if database else schema_and_table)


def dump_cursor(value: dict[str, Any]) -> str:
    """Serialise a cursor deterministically (sorted keys) so equal cursors compare equal."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def load_cursor(cursor: str | None) -> dict[str, Any] | None:
    return None if cursor is None else json.loads(cursor)


class Source(abc.ABC):
    """A source type: the plugin API (docs/plugins.md). Built-ins are listed in ``sources.registry``;
    an installed package adds one through the entry-point group ``heartbeat.sources``.

    Subclass it; the constructor takes no argument (one instance senses every target of its
    types, from several threads at once: keep per-target state in the cursor, not on ``self``).
    ``check_config`` and ``sense`` are required; the capabilities below have defaults.
    """

    #: the ``sensor_source`` values this class senses (documentation: the registry names them)
    source_types: ClassVar[tuple[str, ...]] = ()
    #: capability: ``sense`` reports ``SenseResult.event_times`` for the targets in
    #: ``ctx.event_time_grains`` (sources read by jobs with an event-time window policy)
    reports_event_times: ClassVar[bool] = False

    @abc.abstractmethod
    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        """Return a problem with this row's ``sensor_id``/``upstream_key``, or None. No I/O."""

    @abc.abstractmethod
    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        """Answer: is there new data after ``target.cursor``? Raise SourceError on failure."""

    def unchanged(self, targets: Sequence[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        """Capability: the targets known to have nothing after their cursor without sensing each one (a
        bulk look, e.g. one catalog query for many tables), by ``source_key``, with what the run report
        says of them. Called once per tick with every due target of this class; sensing skips the ones
        returned. Only a look that cannot miss a change may rule a target out: when in doubt, leave it in.
        The default rules nothing out."""
        return {}

    def watch(self, targets: Sequence[SensingTarget], ctx: SenseContext,
              wake: Callable[[str], None]) -> Watch | None:
        """Capability: start notifications that call ``wake(target.source_key)`` soon after one of
        ``targets`` may have new data (file-system events, a consumer's long poll, a callback from the
        upstream), so ``run --loop`` senses it at once instead of at its next poll. A wake-up only makes
        the loop sense earlier: a missed one costs one interval, a spurious one one cheap sense. Called from
        the loop's thread with every due target of this class whenever that set changes; the previous
        watch is closed first. ``wake`` is thread-safe and may be called from any thread. The default
        starts nothing (the targets are polled)."""
        return None

    def split(self, window: SourceWindow, limit: WindowLimit, upstream_key: str | None) -> list[SourceWindow]:
        """Cut pending data (``window``, from the earliest pending cursor to the latest) into consecutive
        pieces no larger than ``limit``, oldest first, in the source's own terms (bounded catch-up).

        No I/O: only the cursors. SourceError when ``limit`` does not fit the source (a span for
        Delta versions). The default cannot cut: the whole backlog is one piece.
        """
        return [window]

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """Capability: the upstream of a target as an OpenLineage dataset (docs/lineage.md). No I/O, no secret
        read. The default names it ``heartbeat://<sensor_source>`` / ``<sensor_id>``."""
        return LineageDataset(f"heartbeat://{sensor_source}", sensor_id)

    def bounds(self, cursor_from: str | None, cursor_to: str | None) -> WindowBounds:
        """The window after ``cursor_from`` up to ``cursor_to`` in the job's terms (the structured job
        parameter ``heartbeat_params``). No I/O. The default gives the cursors themselves (kind ``cursor``)."""
        return WindowBounds("cursor", load_cursor(cursor_from), load_cursor(cursor_to))
