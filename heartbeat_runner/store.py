"""The table store: Heartbeat's own Delta tables, created, appended and read here.

Only the runner writes these three tables; the control table and the views are
dbt models (see ``models/``). Every write is one append (one Delta commit).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Sequence

from heartbeat_runner import delta_log
from heartbeat_runner.engine import Engine
from heartbeat_runner.records import Event, RunSummary, SensorEvaluation
from heartbeat_runner.sources.base import SensingTarget

log = logging.getLogger(__name__)

EVENTS = "heartbeat_events"
RUN_REPORT = "heartbeat_run_report"
RUNS = "heartbeat_runs"
CONTROL = "heartbeat_control"
READY_VIEW = "jobs_ready_to_trigger"
DUE_VIEW = "heartbeat_sensors_due"
SKIPPED_VIEW = "heartbeat_sensors_skipped"
SENSOR_STATE = "heartbeat_sensor_state"

_TYPES = {
    "event_ts": "timestamp", "snapshot_ts": "timestamp", "ended_ts": "timestamp",
    "rows": "bigint", "duration_s": "double",
    "sources_sensed": "int", "sources_with_new_data": "int", "sensor_errors": "int", "jobs_triggered": "int",
    "jobs_completed": "int", "jobs_failed": "int", "trigger_errors": "int",
}
TABLE_COLUMNS: dict[str, list[str]] = {
    EVENTS: Event.columns(),
    RUN_REPORT: SensorEvaluation.columns(),
    RUNS: RunSummary.columns(),
}
#: A write that lost a Delta commit race is retried this many times.
WRITE_ATTEMPTS = 5
#: How a Delta commit that lost a race with another writer reads (Sail 0.7, measured with two
#: processes writing one table, e.g. two MERGEs): "Failed to commit transaction: 0" and, on a
#: new table, "Missing commit file: expected version 0, found 7". Sail retries plain appends
#: itself (it logs "The transaction N already exists, will retry!"); the rest are delta-rs' names.
COMMIT_CONFLICTS = ("failed to commit transaction", "transaction failed", "missing commit file",
                    "already exists, will retry", "version already exists", "max commit attempts",
                    "concurrent transaction", "commit conflict", "metadata changed since last commit")


def column_type(name: str) -> str:
    return _TYPES.get(name, "string")


def _struct(columns: Sequence[str]):
    from pyspark.sql.types import (DoubleType, IntegerType, LongType, StringType, StructField, StructType,
                                   TimestampType)

    spark_types = {"timestamp": TimestampType(), "bigint": LongType(), "double": DoubleType(),
                   "int": IntegerType(), "string": StringType()}
    return StructType([StructField(c, spark_types[column_type(c)], True) for c in columns])


@dataclass(frozen=True)
class ReadyRow:
    """A control row consumed by a ready job (from jobs_ready_to_trigger ⋈ heartbeat_control)."""

    trigger_job_id: str
    trigger_job_name: str | None
    consumed_event_ids: str
    sensor_source: str
    sensor_id: str
    source_key: str
    pending_window_from: str | None
    pending_window_to: str | None


@dataclass(frozen=True)
class ControlRow:
    """The operational subset of a control-table row used by reconciliation."""

    trigger_job_id: str
    trigger_job_name: str | None
    status: str | None
    job_run_id: str | None
    last_idempotency_token: str | None
    base_idempotency_token: str | None
    consecutive_failures: int
    job_start_timestamp: datetime | None
    job_end_timestamp: datetime | None
    status_change_timestamp: datetime | None


@dataclass(frozen=True)
class SkippedSource:
    """A source the tick does not sense, and why (from heartbeat_sensors_skipped)."""

    source_key: str
    sensor_source: str
    sensor_id: str
    trigger_job_ids: str
    reason: str


class TableStore:
    """Reads and writes Heartbeat's tables through the engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.spark = engine.spark

    def name(self, table: str) -> str:
        return self.engine.table(table)

    # -- schema -----------------------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Create the runner's tables when missing (idempotent)."""
        for table, columns in TABLE_COLUMNS.items():
            fq = self.name(table)
            if self.engine.table_exists(fq):
                continue
            cols = ", ".join(f"{c} {column_type(c)}" for c in columns)
            location = self.engine.own_location(table)
            where = f" LOCATION '{location}'" if location else ""
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {fq} ({cols}) USING delta{where}")

    def exists(self, table: str) -> bool:
        return self.engine.table_exists(self.name(table))

    # -- writes -----------------------------------------------------------------------------

    def _append(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        if not rows:
            return
        frame = self.spark.createDataFrame(rows, _struct(columns))
        retry_lost_commits(lambda: frame.write.mode("append").insertInto(self.name(table)), f"append to {table}")

    def append_events(self, events: Iterable[Event]) -> None:
        """One atomic append of events (a single Delta commit)."""
        self._append(EVENTS, Event.columns(), [e.as_tuple() for e in events])

    def append_run(self, summary: RunSummary, evaluations: list[SensorEvaluation]) -> None:
        self._append(RUN_REPORT, SensorEvaluation.columns(), [e.as_tuple() for e in evaluations])
        self._append(RUNS, RunSummary.columns(), [summary.as_tuple()])

    # -- reads ------------------------------------------------------------------------------

    def events_version(self) -> int | None:
        """Version of the events table: changes with every append (cheap change detection)."""
        location = self.engine.own_location(EVENTS)
        if location is not None:
            return delta_log.latest_version(location)
        rows = self.spark.sql(f"DESCRIBE HISTORY {self.name(EVENTS)} LIMIT 1").collect()
        return int(rows[0]["version"]) if rows else None

    def sensors_due(self) -> list[tuple[SensingTarget, str]]:
        """Distinct sources to sense now, with the job ids they feed."""
        rows = self.spark.sql(f"SELECT * FROM {self.name(DUE_VIEW)} ORDER BY source_key").collect()
        return [
            (
                SensingTarget(
                    source_key=r["source_key"],
                    sensor_source=r["sensor_source"],
                    sensor_id=r["sensor_id"],
                    upstream_key=r["upstream_key"],
                    preprocess_query=r["preprocess_query"],
                    sensor_read_type=r["sensor_read_type"],
                    cursor=r["cursor"],
                ),
                r["trigger_job_ids"] or "",
            )
            for r in rows
        ]

    def sensors_skipped(self) -> list[SkippedSource]:
        """Sources no eligible row reads now, with the reason (paused, in progress, ...)."""
        rows = self.spark.sql(f"SELECT * FROM {self.name(SKIPPED_VIEW)} ORDER BY source_key").collect()
        return [SkippedSource(**r.asDict()) for r in rows]

    def current_cursors(self) -> dict[str, tuple[str | None, str | None]]:
        """Each due source's cursor now, and the event that set it (the parent of its next NEW_DATA event)."""
        rows = self.spark.sql(f"SELECT source_key, cursor, cursor_event_id FROM {self.name(DUE_VIEW)}").collect()
        return {r["source_key"]: (r["cursor"], r["cursor_event_id"]) for r in rows}

    def ready_rows(self) -> list[ReadyRow]:
        """Rows consumed by the jobs that are ready now (dependency rule: the view)."""
        sql = f"""
            SELECT r.trigger_job_id, r.trigger_job_name, r.consumed_event_ids,
                   c.sensor_source, c.sensor_id, c.source_key, c.pending_window_from, c.pending_window_to
            FROM {self.name(READY_VIEW)} r
            JOIN {self.name(CONTROL)} c
              ON c.trigger_job_id = r.trigger_job_id AND c.is_active AND c.status = 'NEW_EVENT_AVAILABLE'
            ORDER BY r.trigger_job_id, c.sensor_source, c.sensor_id
        """
        return [ReadyRow(**r.asDict()) for r in self.spark.sql(sql).collect()]

    def jobs_with_status(self, *statuses: str) -> list[ControlRow]:
        """One row per job whose active rows are in one of ``statuses``."""
        wanted = ", ".join(f"'{s}'" for s in statuses)
        sql = f"""
            SELECT trigger_job_id, max(trigger_job_name) AS trigger_job_name, max(status) AS status,
                   max(job_run_id) AS job_run_id, max(last_idempotency_token) AS last_idempotency_token,
                   max(base_idempotency_token) AS base_idempotency_token,
                   max(consecutive_failures) AS consecutive_failures,
                   max(job_start_timestamp) AS job_start_timestamp, max(job_end_timestamp) AS job_end_timestamp,
                   max(status_change_timestamp) AS status_change_timestamp
            FROM {self.name(CONTROL)}
            WHERE is_active AND status IN ({wanted})
            GROUP BY trigger_job_id
            ORDER BY trigger_job_id
        """
        return [ControlRow(**_utc(r.asDict())) for r in self.spark.sql(sql).collect()]

    def control_rows(self, job_id: str | None = None, include_retired: bool = False) -> list[dict]:
        where = [] if include_retired else ["is_active"]
        if job_id is not None:
            where.append(f"trigger_job_id = '{_quote(job_id)}'")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT * FROM {self.name(CONTROL)} {clause} ORDER BY trigger_job_id, sensor_source, sensor_id"
        return [_utc(r.asDict()) for r in self.spark.sql(sql).collect()]

    def query(self, sql: str) -> list[dict]:
        return [_utc(r.asDict()) for r in self.spark.sql(sql).collect()]


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def quote_literal(value: str) -> str:
    """A SQL string literal (job ids and sensor ids come from validated config, but be safe)."""
    return f"'{_quote(value)}'"


def _utc(row: dict) -> dict:
    """Spark Connect returns naive datetimes in the session time zone (UTC): make them aware."""
    return {k: (v.replace(tzinfo=timezone.utc) if isinstance(v, datetime) and v.tzinfo is None else v)
            for k, v in row.items()}


def retry_lost_commits(write: Callable[[], object], what: str, also: tuple[str, ...] = ()) -> None:
    """Run ``write``; while it fails because another writer committed first (or with one of the
    ``also`` error texts, for writes that are safe to repeat), run it again."""
    retryable = COMMIT_CONFLICTS + also
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            write()
            return
        except Exception as exc:  # noqa: BLE001 - engine and dbt errors carry no stable type
            text = str(exc)
            if attempt == WRITE_ATTEMPTS or not any(words in text.lower() for words in retryable):
                raise
            log.warning("%s failed (%s); retrying", what, text.strip().splitlines()[-1])
            time.sleep(0.05 * 2**attempt)
