"""The Spark engine: embedded Sail (local), any Spark Connect endpoint, or Databricks.

The local target runs Sail in-process. Sail's catalog lives in memory and is empty
at every start, so every table gets a fixed location under
``<lakehouse>/warehouse/<schema>/<table>`` and is re-registered when the engine
opens. dbt-spark's ``session`` method finds the same server through
``SPARK_REMOTE``, which is why opening a local engine sets that variable.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from heartbeat_runner import delta_log
from heartbeat_runner.names import is_table_name, qualify, sql_string
from heartbeat_runner.settings import Settings, validate_identifier

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

@dataclass
class Engine:
    """An open Spark session plus where its tables live."""

    spark: SparkSession
    settings: Settings
    _server: Any = None
    _registered: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def target(self) -> str:
        return self.settings.target

    @property
    def is_local(self) -> bool:
        return self._server is not None

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
        if not self.is_local or not is_table_name(table_name) or "." not in table_name:
            return None
        parts = table_name.split(".")
        return self.settings.warehouse_dir.joinpath(*parts[-2:])

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
            self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {schema}.{table} USING delta LOCATION {sql_string(str(location))}")
            self._registered.add(table_name)

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

    # -- table maintenance (the one place where engines differ for it) -------------------------

    def table_version(self, name: str) -> int | None:
        """The newest Delta version of ``name`` (``schema.table``), None when it does not exist."""
        location = self.local_location(name)
        if location is not None:
            return delta_log.latest_version(location)
        rows = self.spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()
        return int(rows[0]["version"]) if rows else None

    def file_count(self, name: str) -> int:
        """How many data files the current version of ``name`` references."""
        location = self.local_location(name)
        if location is not None:
            from deltalake import DeltaTable

            return len(DeltaTable(str(location)).file_uris())
        return int(self.spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["numFiles"])

    def compact(self, name: str) -> None:
        """Rewrite small data files into few large ones (a commit without new data), then checkpoint.

        Locally through the ``deltalake`` package (Sail has no OPTIMIZE); elsewhere Delta's OPTIMIZE.
        """
        location = self.local_location(name)
        if location is None:
            self.spark.sql(f"OPTIMIZE {name}")
            return
        from deltalake import DeltaTable

        DeltaTable(str(location)).optimize.compact()
        DeltaTable(str(location)).create_checkpoint()

    def vacuum(self, name: str, *, retention_hours: float) -> None:
        """Delete data files unreferenced for ``retention_hours`` and log files past their retention.

        Databricks refuses a retention below 7 days unless its safety check is off: at least 168 hours there.
        """
        location = self.local_location(name)
        if location is None:
            self.spark.sql(f"VACUUM {name} RETAIN {max(168, int(retention_hours))} HOURS")
            return
        from deltalake import DeltaTable

        table = DeltaTable(str(location))
        table.vacuum(retention_hours=max(0, int(retention_hours)), enforce_retention_duration=False, dry_run=False)
        table.cleanup_metadata()

    def table_exists(self, name: str) -> bool:
        return bool(self.spark.catalog.tableExists(name))

    def close(self) -> None:
        if self._server is not None:
            try:
                self.spark.stop()
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self._server.stop()
            self._server = None


def open_engine(settings: Settings, *, port: int = 0, session_id: str | None = None) -> Engine:
    """Open the engine for ``settings.target`` and re-register Heartbeat's tables.

    ``port`` and ``session_id`` (local target) serve other clients: Sail keeps one catalog
    per Spark Connect session, so clients that connect with the same session id see the
    tables registered here (see ``serve``).
    """
    if settings.target == "local":
        engine = _open_local(settings, port, session_id)
    elif settings.target == "spark":
        engine = _open_spark_connect(settings)
    else:
        engine = _open_databricks(settings)
    if engine.is_local:
        engine.register_schema(settings.schema)
    return engine


def _open_local(settings: Settings, port: int = 0, session_id: str | None = None) -> Engine:
    logging.getLogger("sail").setLevel(logging.WARNING)
    os.environ.setdefault("RUST_LOG", "error")
    try:
        from pysail.spark import SparkConnectServer
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ValueError("the local target needs the embedded engine: pip install 'heartbeat-runner[local]'") from exc

    settings.warehouse_dir.mkdir(parents=True, exist_ok=True)
    server = SparkConnectServer("127.0.0.1", port)
    server.start(background=True)
    host, port = server.listening_address
    url = f"sc://{host}:{port}" + (f"/;session_id={session_id}" if session_id else "")
    # dbt-spark's session method calls SparkSession.builder.getOrCreate(); this points it here.
    os.environ["SPARK_REMOTE"] = url
    # create(), not getOrCreate(): the latter returns the process's active session, so two
    # engines would share one. dbt-spark's getOrCreate() must then find *this* session, but
    # create() only becomes the default when none is set yet, so set it explicitly.
    spark = SparkSession.builder.remote(url).create()
    _make_default_session(spark)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {settings.schema}")
    return Engine(spark=spark, settings=settings, _server=server)


def _make_default_session(spark: SparkSession) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # builder.remote(url).create() returns a Spark Connect session that pyspark types (by its own cast) as classic.
    session = cast(ConnectSession, spark)
    with ConnectSession._lock:
        ConnectSession._default_session = session
    ConnectSession._active_session.session = session


def _open_spark_connect(settings: Settings) -> Engine:
    from pyspark.sql import SparkSession

    url = os.environ.get("SPARK_REMOTE")
    if not url:
        raise ValueError("target 'spark' needs SPARK_REMOTE (a Spark Connect URL, sc://host:port)")
    spark = SparkSession.builder.remote(url).getOrCreate()
    return Engine(spark=spark, settings=settings)


def _open_databricks(settings: Settings) -> Engine:
    """On a cluster use the active session; elsewhere Databricks Connect (auth via the SDK chain)."""
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
    return Engine(spark=spark, settings=settings)
