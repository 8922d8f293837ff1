"""The table store: Heartbeat's own Delta tables, created, appended and read here.

Only the runner writes these three tables; the control table and the views are
dbt models (see ``models/``). Every write is one append (one Delta commit).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar, cast

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.names import sql_string
from heartbeat_runner.core.processes import pid_alive
from heartbeat_runner.core.records import (
    Event,
    EventType,
    JobStatus,
    RunSummary,
    SensingTarget,
    SensorEvaluation,
    TickStatus,
    as_utc,
    job_parameters,
    stamped_after,
)
from heartbeat_runner.core.settings import validate_identifier
from heartbeat_runner.engines import delta_log
from heartbeat_runner.engines.engine import Engine
from heartbeat_runner.engines.engine_errors import CommitConflictError, is_kind

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

EVENTS = "heartbeat_events"
RUN_REPORT = "heartbeat_run_report"
RUNS = "heartbeat_runs"
#: where maintenance moves what the hot tables no longer need (same columns)
EVENTS_ARCHIVE = "heartbeat_events_archive"
RUN_REPORT_ARCHIVE = "heartbeat_run_report_archive"
RUNS_ARCHIVE = "heartbeat_runs_archive"
#: the keys one archiving step moves (staged so that the copy and the delete agree)
ARCHIVE_BATCH = "heartbeat_archive_batch"
LIVE_EVENTS_VIEW = "heartbeat_events_live"
CONTROL = "heartbeat_control"
READY_VIEW = "jobs_ready_to_trigger"
READY_ROWS_VIEW = "jobs_ready_to_trigger_rows"
JOB_STATUS_VIEW = "heartbeat_job_status"
TRIGGER_REQUESTS_VIEW = "heartbeat_trigger_requests"
RETRY_ASKS_VIEW = "heartbeat_retry_asks"
TRIGGER_ASKS_VIEW = "heartbeat_trigger_asks"
SENSOR_PLAN_VIEW = "heartbeat_sensor_plan"
SENSING_ERRORS_VIEW = "heartbeat_sensing_errors"
EXPLANATION_VIEW = "jobs_trigger_explanation"
SENSOR_STATE = "heartbeat_sensor_state"
#: the config seed (dbt seed of the config CSV)
SENSOR_CONFIG = "heartbeat_sensor_config"
SEQUENCES_VIEW = "heartbeat_job_sequences"
#: what the trigger holds read (policies/trigger_shaping.py)
TRIGGER_FACTS_VIEW = "heartbeat_job_trigger_facts"
WINDOWS_VIEW = "heartbeat_job_windows"
#: the event-time window policies, copied from the run-policy file for the SQL rule
WINDOW_POLICIES = "heartbeat_window_policies"
#: the trigger policies of the run-policy file (policies/trigger_shaping.py), one row per job, for the SQL that reads
#: them (a job with a quiet period keeps sensing while its data waits: heartbeat_sensor_plan)
TRIGGER_POLICIES = "heartbeat_trigger_policies"
#: the tick lease (runner/lease.py): one row per lease name, changed only by a compare-and-swap MERGE
LEASE = "heartbeat_lease"
#: since when each job's data deadline is configured (runner/alerting.py): in the lakehouse, so that a runner
#: on a new machine at every tick (a scheduled Databricks job) knows it as a loop does
DEADLINES = "heartbeat_deadlines"

_TYPES = {
    "event_ts": "timestamp", "snapshot_ts": "timestamp", "ended_ts": "timestamp",
    "rows": "bigint", "duration_s": "double",
    "sources_sensed": "int", "sources_with_new_data": "int", "sensor_errors": "int", "jobs_triggered": "int",
    "jobs_completed": "int", "jobs_failed": "int", "trigger_errors": "int",
    "size_s": "bigint", "lateness_s": "bigint",
    "min_interval_s": "double", "quiet_for_s": "double", "max_wait_s": "double", "pool_max_running": "bigint",
    "priority": "bigint",
    "pid": "bigint", "acquired_at": "double", "expires_at": "double", "wanted_at": "double",
    "seen_expires_at": "double",
}
TABLE_COLUMNS: dict[str, list[str]] = {
    EVENTS: Event.columns(),
    RUN_REPORT: SensorEvaluation.columns(),
    RUNS: RunSummary.columns(),
    EVENTS_ARCHIVE: Event.columns(),
    RUN_REPORT_ARCHIVE: SensorEvaluation.columns(),
    RUNS_ARCHIVE: RunSummary.columns(),
    ARCHIVE_BATCH: ["archive_key"],
    WINDOW_POLICIES: ["trigger_job_id", "size_s", "lateness_s", "late_data"],
    TRIGGER_POLICIES: ["trigger_job_id", "min_interval_s", "quiet_for_s", "max_wait_s", "at_cron", "pool",
                       "pool_max_running", "priority"],
    LEASE: ["lease_name", "owner", "host", "pid", "acquired_at", "expires_at", "wanted_by", "wanted_at"],
    DEADLINES: ["trigger_job_id", "deadline", "since"],
}
#: the tables maintenance compacts: the runner's own and the control table (a MERGE per build)
OWN_TABLES = (EVENTS, RUN_REPORT, RUNS, EVENTS_ARCHIVE, RUN_REPORT_ARCHIVE, RUNS_ARCHIVE, CONTROL)
#: dbt-built tables that stay a few files: only vacuumed (the sensor state's MERGE rewrites the files it
#: changes, the seed is replaced whole; either leaves old files for vacuum)
REBUILT_TABLES = (SENSOR_STATE, SENSOR_CONFIG, LEASE, DEADLINES)
#: how a row of each archived table is identified (an SQL expression over its columns)
ARCHIVE_KEYS = {EVENTS: "event_id", RUNS: "run_id", RUN_REPORT: "concat_ws('|', run_id, source_key)"}
#: A write that lost a Delta commit race is retried this many times.
WRITE_ATTEMPTS = 5
#: the wait before writing again after the n-th lost commit race: 0.1 s, 0.2 s, 0.4 s, 0.8 s
LOST_COMMIT_BACKOFF = Backoff(first_s=0.1, max_s=1.0)


def column_type(name: str) -> str:
    return _TYPES.get(name, "string")


def _struct(columns: Sequence[str]):
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

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
    upstream_key: str | None
    pending_window_from: str | None
    pending_window_to: str | None


@dataclass(frozen=True)
class ControlRow:
    """The operational subset of a control-table row used by reconciliation."""

    trigger_job_id: str
    trigger_job_name: str | None
    status: JobStatus
    job_run_id: str | None
    last_idempotency_token: str | None
    base_idempotency_token: str | None
    consecutive_failures: int
    job_start_timestamp: datetime | None
    job_end_timestamp: datetime | None
    status_change_timestamp: datetime | None


def in_job_order(found: dict[JobStatus, list[ControlRow]], statuses: Iterable[JobStatus]) -> list[ControlRow]:
    """The rows of ``found`` (TableStore.jobs_by_status) in ``statuses``, as one list in job id order."""
    return sorted((row for status in statuses for row in found[status]), key=lambda row: row.trigger_job_id)


@dataclass(frozen=True)
class RetryAsk:
    """An operator's ask to re-run a failed job, waiting for the next tick (heartbeat_retry_asks)."""

    trigger_job_id: str
    asked_ts: datetime
    by: str
    reason: str | None
    asks: int


@dataclass(frozen=True)
class TriggerAsk:
    """An operator's ask to run a job now, waiting for the next tick (heartbeat_trigger_asks)."""

    trigger_job_id: str
    asked_ts: datetime
    ask_event_id: str
    by: str
    reason: str | None
    asks: int


@dataclass(frozen=True)
class ManualRun:
    """What a manual run of a job consumes: its rows with pending data (none: a run over nothing new)."""

    trigger_job_id: str
    trigger_job_name: str | None
    rows: list[ReadyRow]

    @property
    def consumed_event_ids(self) -> list[str]:
        return sorted({i for row in self.rows for i in row.consumed_event_ids.split(",") if i})


@dataclass(frozen=True)
class SkippedSource:
    """A source the tick does not sense, and why (heartbeat_sensor_plan's rows not due)."""

    source_key: str
    sensor_source: str
    sensor_id: str
    trigger_job_ids: str
    reason: str


#: the events of a windowed job's plans (sequences.valid_plans): requests and skips, and what voids or restarts them
#: The tick lease's SQL (runner/lease.py). ``{table}`` is ``heartbeat_lease``'s validated name, ``{source}`` a
#: temporary view of one row holding every value (Sail takes no bound parameters in a command). The seed adds
#: the lease's free row when it has none; the swap changes the row only when it still holds what the caller
#: read (owner and expiry): a compare-and-swap, so of two writers that read the same row at most one changes
#: it, and a commit that lost the Delta race may be run again as it is.
#: the latest event time recorded: every append is stamped after it (TableStore.append_events)
LATEST_EVENT_SQL = "SELECT max(event_ts) AS latest FROM {table}"


@dataclass(frozen=True)
class _LatestEvent:
    """The latest event time found in the events table as of one of its versions (TableStore.latest_event_ts)."""

    version: int
    latest: datetime | None


def _stat_time(text: str) -> datetime:
    """A timestamp as the Delta log's statistics write it (UTC, to the millisecond), moved to the end of its
    millisecond: the time it stands for may be up to 999 microseconds later."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return as_utc(value).replace(microsecond=value.microsecond // 1000 * 1000 + 999)
LEASE_SEED_SQL = """MERGE INTO {table} t USING {source} s ON t.lease_name = s.lease_name
WHEN NOT MATCHED THEN INSERT (lease_name, owner, host, pid, acquired_at, expires_at, wanted_by, wanted_at)
VALUES (s.lease_name, s.owner, s.host, s.pid, s.acquired_at, s.expires_at, s.wanted_by, s.wanted_at)"""
LEASE_SWAP_SQL = """MERGE INTO {table} t USING {source} s ON t.lease_name = s.lease_name
WHEN MATCHED AND t.owner = s.seen_owner AND t.expires_at = s.seen_expires_at
THEN UPDATE SET owner = s.owner, host = s.host, pid = s.pid, acquired_at = s.acquired_at,
expires_at = s.expires_at, wanted_by = s.wanted_by, wanted_at = s.wanted_at"""
LEASE_READ_SQL = """SELECT owner, host, pid, acquired_at, expires_at, wanted_by, wanted_at FROM {table}
WHERE lease_name = :lease_name ORDER BY expires_at DESC, owner"""
#: the columns of the swap's one-row source: the lease's row, and the owner and expiry the caller read
LEASE_SOURCE_COLUMNS = [*TABLE_COLUMNS[LEASE], "seen_owner", "seen_expires_at"]


@dataclass(frozen=True)
class LeaseInfo:
    """One lease's row: who holds it (``owner`` names host and process; ``""`` is nobody) and until when
    (seconds since the epoch), and who asked for it while it was held (``wanted_by``, ``""`` nobody)."""

    owner: str
    acquired_at: float
    expires_at: float
    host: str = ""
    pid: int = 0
    wanted_by: str = ""
    wanted_at: float = 0.0

    def stale(self, now: float) -> bool:
        """Free, expired, or its holder was a process of this machine that is gone."""
        return (not self.owner or now >= self.expires_at
                or (self.host == socket.gethostname() and not pid_alive(self.pid)))

    def describe(self) -> str:
        until = datetime.fromtimestamp(self.expires_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{self.owner} (until {until})"


#: the row of a lease nobody holds
FREE_LEASE = LeaseInfo(owner="", acquired_at=0.0, expires_at=0.0)


PLAN_EVENT_TYPES = [EventType.TRIGGER_REQUESTED.value, EventType.WINDOW_SKIPPED.value, EventType.TRIGGER_ERROR.value,
                    EventType.RESET.value]
PLAN_COLUMNS = ["event_id", "event_ts", "event_type", "idempotency_token", "payload"]


class TableStore:
    """Reads and writes Heartbeat's tables through the engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._reads = ReadCache()
        #: the latest event time as of a version of the events table (None: not read yet, or its log is remote)
        self._latest_event: _LatestEvent | None = None

    @property
    def spark(self):
        """The engine's current session (a new one after the engine is recycled)."""
        return self.engine.spark

    def name(self, table: str) -> str:
        return self.engine.table(table)

    # -- schema -----------------------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Create the runner's tables when missing (idempotent; two processes creating one table at
        once: the one that lost the commit race finds it made)."""
        for table in TABLE_COLUMNS:
            self._ensure_table(table)

    def _ensure_table(self, table: str) -> None:
        fq = self.name(table)
        if self.engine.table_exists(fq):
            return
        cols = ", ".join(f"{c} {column_type(c)}" for c in TABLE_COLUMNS[table])
        location = self.engine.own_location(table)
        where = f" LOCATION {sql_string(str(location))}" if location else ""
        retry_lost_commits(lambda: self.engine.sql(f"CREATE TABLE IF NOT EXISTS {fq} ({cols}) USING delta{where}"),
                           f"creating {table}")

    def exists(self, table: str) -> bool:
        return self.engine.table_exists(self.name(table))

    # -- writes -----------------------------------------------------------------------------

    def _append(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        if not rows:
            return
        frame = self.engine.frame(rows, _struct(columns))
        retry_lost_commits(lambda: frame.write.mode("append").insertInto(self.name(table)), f"append to {table}")

    def append_events(self, events: Iterable[Event]) -> list[Event]:
        """One atomic append of events (a single Delta commit); the events as recorded.

        Invariant (commits, not clocks): each event is stamped later than every event the table held when this
        writer read it just before appending (:func:`stamped_after`), whatever this machine's clock says, so an
        event that consumes data (a trigger request, a reset) is recorded after the data it saw, and an end after
        its run's request. Only a writer racing this one within the read-to-commit gap can be ordered either way."""
        events = list(events)
        if not events:
            return events
        events = stamped_after(events, self.latest_event_ts())
        self._append(EVENTS, Event.columns(), [e.as_tuple() for e in events])
        return events

    def latest_event_ts(self) -> datetime | None:
        """The latest event time the events table holds, or a time at most a millisecond later (None: it holds no
        event). Where the table's log is on this machine, the commits since the previous answer are read from it
        (each added file's statistics, kept to the millisecond: one small file per commit); else, and the first
        time, the engine is asked."""
        folder = self.engine.delta_log_dir(self.name(EVENTS))
        version = delta_log.latest_version(folder) if folder is not None else None
        known = self._latest_event
        if folder is not None and known is not None and version is not None and version >= known.version:
            found, complete = delta_log.max_added_value(folder, known.version, version, "event_ts")
            if complete:
                later = _stat_time(found) if found is not None else None
                latest = max(filter(None, (known.latest, later)), default=None)
                self._latest_event = _LatestEvent(version, latest)
                return latest
        rows = self.engine.sql(LATEST_EVENT_SQL.format(table=self.name(EVENTS))).collect()
        latest = as_utc(rows[0]["latest"]) if rows and rows[0]["latest"] is not None else None
        # the version read before the query: a commit between the two is read again next time (max is idempotent)
        self._latest_event = _LatestEvent(version, latest) if version is not None else None
        return latest

    def append_run(self, summary: RunSummary, evaluations: list[SensorEvaluation]) -> None:
        self.append_runs([summary], evaluations)

    def append_runs(self, summaries: list[RunSummary], evaluations: list[SensorEvaluation]) -> None:
        """The per-source rows, then the summaries (a run summary means its report rows are complete)."""
        self._append(RUN_REPORT, SensorEvaluation.columns(), [e.as_tuple() for e in evaluations])
        self._append(RUNS, RunSummary.columns(), [s.as_tuple() for s in summaries])

    # -- the tick lease (runner/lease.py) ----------------------------------------------------

    def ensure_lease(self, lease_name: str) -> None:
        """The lease table and the lease's row exist (a free row when it had none). Two processes seeding
        at once may both insert a free row; the swap changes every row that matches, so they stay alike."""
        self._ensure_table(LEASE)
        self._merge_lease(LEASE_SEED_SQL, lease_name, FREE_LEASE, FREE_LEASE, "seeding the lease")

    def lease_version(self) -> int | None:
        """The lease table's Delta version from its log on this machine (a file listing, no engine call: a
        parked engine stays parked); None where its files are elsewhere."""
        folder = self.engine.delta_log_dir(self.name(LEASE))
        return delta_log.latest_version(folder) if folder is not None else None

    def lease_row(self, lease_name: str) -> LeaseInfo | None:
        """The lease's row as last committed (read past every cache), None when it has none."""
        rows = self.engine.sql(LEASE_READ_SQL.format(table=self.name(LEASE)),
                               args={"lease_name": lease_name}).collect()
        if not rows:
            return None
        r = rows[0]
        return LeaseInfo(owner=str(r["owner"] or ""), acquired_at=float(r["acquired_at"] or 0.0),
                         expires_at=float(r["expires_at"] or 0.0), host=str(r["host"] or ""), pid=int(r["pid"] or 0),
                         wanted_by=str(r["wanted_by"] or ""), wanted_at=float(r["wanted_at"] or 0.0))

    def swap_lease(self, lease_name: str, seen: LeaseInfo, new: LeaseInfo) -> None:
        """Write ``new`` into the lease's row if the row still has ``seen``'s owner and expiry (one Delta
        commit, or none when it changed meanwhile). The caller reads the row back to learn the outcome."""
        self._merge_lease(LEASE_SWAP_SQL, lease_name, seen, new, "writing the lease")

    def _merge_lease(self, statement: str, lease_name: str, seen: LeaseInfo, new: LeaseInfo, what: str) -> None:
        row = (lease_name, new.owner, new.host, int(new.pid), float(new.acquired_at), float(new.expires_at),
               new.wanted_by, float(new.wanted_at), seen.owner, float(seen.expires_at))
        self.merge_rows(lambda view: statement.format(table=self.name(LEASE), source=view),
                        LEASE_SOURCE_COLUMNS, [row], what)

    def merge_rows(self, statement: Callable[[str], str], columns: Sequence[str], rows: Sequence[tuple],
                   what: str, *, view: str | None = None) -> None:
        """Run the write ``statement(view)`` over ``rows`` (tuples of ``columns``), given to it as a temporary
        view (``view``, else one named for this call): values reach SQL as data, never as text. Retried when it
        loses a commit race. A named ``view`` is for SQL rendered with that name; one caller at a time uses it."""
        view = view or f"heartbeat_rows_{uuid.uuid4().hex}"
        self.engine.frame(rows, _struct(columns)).createOrReplaceTempView(view)
        try:
            retry_lost_commits(lambda: self.engine.sql(statement(view)).collect(), what)
        finally:
            self.spark.catalog.dropTempView(view)

    # -- reads ------------------------------------------------------------------------------

    def events_version(self) -> int | None:
        """Version of the events table: changes with every append (cheap change detection)."""
        return self.engine.table_version(self.name(EVENTS))

    def read(self, relation: str, *where: Cond, order_by: Sequence[str] = (),
             limit: int | None = None, columns: Sequence[str] = ("*",)) -> list[dict]:
        """Rows of one of Heartbeat's tables or views; filter values are bound, never pasted into SQL.

        ``relation``, ``columns`` and ``order_by`` are identifiers (validated); every value
        travels as a named parameter.
        """
        select = ", ".join(c if c == "*" else validate_identifier(c, "column") for c in columns)
        sql = f"SELECT {select} FROM {self.name(relation)}"
        args: dict[str, object] = {}
        if where:
            bound = [cond.bind(f"p{i}", arrays=self.engine.binds_arrays) for i, cond in enumerate(where)]
            sql += " WHERE " + " AND ".join(text for text, _ in bound)
            args = {name: value for _, values in bound for name, value in values.items()}
        if order_by:
            sql += " ORDER BY " + ", ".join(_order_term(term) for term in order_by)
        if limit is not None:
            sql += " LIMIT :limit"
            args["limit"] = int(limit)
        return self._reads.get(self.engine.tables_fingerprint(), sql, args, lambda: [
            _utc(r.asDict()) for r in self.engine.sql(sql, args=args or None).collect()])

    # -- archiving (see maintenance.py) -------------------------------------------------------

    def stage_keys(self, keys: DataFrame) -> int:
        """Replace the archive batch with ``keys`` (one string column); return how many."""
        staged = keys.toDF("archive_key")
        retry_lost_commits(lambda: staged.write.mode("overwrite").insertInto(self.name(ARCHIVE_BATCH)),
                           "staging an archive batch")
        return self.count(ARCHIVE_BATCH)

    def copy_staged(self, table: str, archive: str) -> None:
        """Append the rows of ``table`` whose key is staged to ``archive`` (one commit)."""
        from pyspark.sql import functions as F

        rows = self.spark.table(self.name(table))
        staged = self.spark.table(self.name(ARCHIVE_BATCH))
        keyed = rows.withColumn("archive_key", F.expr(ARCHIVE_KEYS[table]))
        chosen = keyed.join(staged, "archive_key", "left_semi").select(*TABLE_COLUMNS[table])
        retry_lost_commits(lambda: chosen.write.mode("append").insertInto(self.name(archive)), f"copy to {archive}")

    def delete_staged(self, table: str) -> None:
        """Delete the rows of ``table`` whose key is staged (one commit; rows appended meanwhile stay)."""
        key = ARCHIVE_KEYS[table]
        self.engine.delete_matched(self.name(table), self.name(ARCHIVE_BATCH), f"{_prefixed(key, 't')} = b.archive_key")

    def delete_older_than(self, table: str, column: str, cutoff: datetime) -> int:
        """Delete rows of ``table`` with ``column`` before ``cutoff`` (retention); return how many."""
        from pyspark.sql import functions as F

        old = self.spark.table(self.name(table)).where(F.col(validate_identifier(column, "column")) < F.lit(cutoff))
        count = old.count()
        if count:
            self.engine.delete_before(self.name(table), column, cutoff)
        return count

    def probe(self, relation: str) -> None:
        """Read one row of a table or view: raises when its files are gone or unreadable."""
        self.spark.table(self.name(relation)).limit(1).collect()

    def count(self, relation: str) -> int:
        """Rows in one of Heartbeat's tables or views."""
        return int(self.spark.table(self.name(relation)).count())

    def sensors_due(self) -> list[tuple[SensingTarget, str]]:
        """Distinct sources to sense now, with the job ids they feed."""
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
                    cursor_ts=r.get("cursor_ts"),
                ),
                r["trigger_job_ids"] or "",
            )
            for r in self._due_rows()
        ]

    def _due_rows(self) -> list[dict]:
        """The sources due now, shared by sensing and the check after it (current_cursors)."""
        return [r for r in self._plan_rows() if r["is_due"]]

    def _plan_rows(self) -> list[dict]:
        """Every active source, due or skipped (heartbeat_sensor_plan): one read per table fingerprint for
        the whole plan, so a tick's sensing, its skipped sources and the cursor check after sensing read
        again only when a table changed since."""
        return self.read(SENSOR_PLAN_VIEW, order_by=["source_key"])

    def sensors_skipped(self) -> list[SkippedSource]:
        """Sources no eligible row reads now, with the reason (paused, in progress, ...)."""
        return [SkippedSource(r["source_key"], r["sensor_source"], r["sensor_id"], r["trigger_job_ids"], r["reason"])
                for r in self._plan_rows() if not r["is_due"]]

    def sensing_failures(self) -> list[dict]:
        """Active control rows whose source's latest recorded sensing failed: ``trigger_job_id``,
        ``source_key``, the error (``sensing_error``) and since when the source fails (``failing_since``)."""
        return self.read(SENSING_ERRORS_VIEW, columns=["trigger_job_id", "source_key", "sensing_error",
                                                       "failing_since"])

    def current_cursors(self) -> dict[str, tuple[str | None, str | None]]:
        """Each due source's cursor now, and the event that set it (the parent of its next NEW_DATA event)."""
        return {r["source_key"]: (r["cursor"], r["cursor_event_id"]) for r in self._due_rows()}

    def ready_rows(self) -> list[ReadyRow]:
        """Rows consumed by the jobs that are ready now (dependency rule: the view)."""
        rows = self.read(READY_ROWS_VIEW, order_by=["trigger_job_id", "sensor_source", "sensor_id"])
        return [ReadyRow(**r) for r in rows]

    def jobs_with_status(self, *statuses: JobStatus) -> list[ControlRow]:
        """One row per job and status whose active rows are in one of ``statuses`` (by job id)."""
        return in_job_order(self.jobs_by_status(*statuses), statuses)

    def jobs_by_status(self, *statuses: JobStatus) -> dict[JobStatus, list[ControlRow]]:
        """For each of ``statuses``, one row per job whose active rows are in it: one query for all."""
        rows = self.read(JOB_STATUS_VIEW, Cond("status", [status.value for status in statuses], "in"),
                         order_by=["trigger_job_id"])
        found: dict[JobStatus, list[ControlRow]] = {status: [] for status in statuses}
        for r in rows:
            status = JobStatus(r["status"])
            found[status].append(ControlRow(**{**r, "status": status}))
        return found

    def retry_asks(self) -> dict[str, RetryAsk]:
        """Failed jobs an operator asked to re-run since they failed (job id -> the latest ask)."""
        asks = {}
        for row in self.read(RETRY_ASKS_VIEW):
            audit = json.loads(row["payload"] or "{}")
            asks[row["trigger_job_id"]] = RetryAsk(row["trigger_job_id"], row["asked_ts"], audit.get("by", "?"),
                                                   audit.get("reason"), row["asks"])
        return asks

    def trigger_asks(self) -> dict[str, TriggerAsk]:
        """Jobs an operator asked to run now, not run since (job id -> the latest ask)."""
        asks = {}
        for row in self.read(TRIGGER_ASKS_VIEW):
            audit = json.loads(row["payload"] or "{}")
            asks[row["trigger_job_id"]] = TriggerAsk(row["trigger_job_id"], row["asked_ts"], row["ask_event_id"],
                                                     audit.get("by", "?"), audit.get("reason"), row["asks"])
        return asks

    def manual_runs(self, job_ids: Sequence[str]) -> list[ManualRun]:
        """For each of ``job_ids`` (active in the control table), the rows a run now would consume."""
        if not job_ids:
            return []
        rows = self.read(CONTROL, Cond("is_active", True), Cond("trigger_job_id", list(job_ids), "in"),
                         order_by=["trigger_job_id", "sensor_source", "sensor_id"])
        runs = []
        for job_id in sorted({r["trigger_job_id"] for r in rows}):
            mine = [r for r in rows if r["trigger_job_id"] == job_id]
            pending = [ReadyRow(job_id, r["trigger_job_name"], r["pending_event_ids"] or "", r["sensor_source"],
                                r["sensor_id"], r["source_key"], r["upstream_key"], r["pending_window_from"],
                                r["pending_window_to"])
                       for r in mine if r["status"] == JobStatus.NEW_EVENT_AVAILABLE.value]
            runs.append(ManualRun(job_id, mine[0]["trigger_job_name"], pending))
        return runs

    def trigger_facts(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """What the trigger holds of ``job_ids`` read (heartbeat_job_trigger_facts): job -> ``last_start``,
        ``first_arrival``, ``last_arrival``, ``added_at``. Asked only when the run-policy file shapes triggers."""
        if not job_ids:
            return {}
        rows = self.read(TRIGGER_FACTS_VIEW, Cond("trigger_job_id", sorted(set(job_ids)), "in"))
        return {row["trigger_job_id"]: row for row in rows}

    def control_rows(self, job_id: str | None = None, include_retired: bool = False) -> list[dict]:
        where = [] if include_retired else [Cond("is_active", True)]
        if job_id is not None:
            where.append(Cond("trigger_job_id", job_id))
        return self.read(CONTROL, *where, order_by=["trigger_job_id", "sensor_source", "sensor_id"])

    def trigger_payload(self, idempotency_token: str) -> dict[str, str]:
        """The job parameters first sent with a trigger request (empty when none was recorded)."""
        return job_parameters(self.request_payload(idempotency_token))

    def trigger_payloads(self, idempotency_tokens: list[str]) -> dict[str, dict[str, str]]:
        """:meth:`trigger_payload` of many requests in one query (token -> job parameters)."""
        if not idempotency_tokens:
            return {}
        found = self.read(TRIGGER_REQUESTS_VIEW, Cond("idempotency_token", idempotency_tokens, "in"),
                          columns=["idempotency_token", "payload"])
        return {row["idempotency_token"]: job_parameters(json.loads(row["payload"]) if row["payload"] else {})
                for row in found}

    def latest_run_figures(self) -> dict[str, Any]:
        """The figures (``stage_timings``) of the latest run summary of a tick that ended (a FAILED tick's row
        carries none); empty when none is readable."""
        found = self.read(RUNS, Cond("status", TickStatus.FAILED.value, "<>"), order_by=["ended_ts DESC"], limit=1,
                          columns=["stage_timings"])
        try:
            figures = json.loads(found[0]["stage_timings"]) if found and found[0]["stage_timings"] else {}
        except ValueError:
            return {}
        return figures if isinstance(figures, dict) else {}

    def any_skipped(self) -> bool:
        """Whether the events hold a run the jobs service skipped (a RUN_SKIPPED event)."""
        return bool(self.read(EVENTS, Cond("event_type", EventType.RUN_SKIPPED.value), limit=1,
                              columns=["event_id"]))

    def skipped_tokens(self, idempotency_tokens: list[str]) -> set[str]:
        """Those of ``idempotency_tokens`` whose run the jobs service skipped (a RUN_SKIPPED event)."""
        if not idempotency_tokens:
            return set()
        found = self.read(EVENTS, Cond("idempotency_token", idempotency_tokens, "in"),
                          Cond("event_type", EventType.RUN_SKIPPED.value), columns=["idempotency_token"])
        return {row["idempotency_token"] for row in found}

    def skip_events(self, idempotency_tokens: list[str]) -> dict[str, tuple[datetime, dict[str, Any]]]:
        """For each of ``idempotency_tokens`` whose run the jobs service skipped: when the skip was recorded and
        its payload (the run's termination code, whether its data waits for a back-off)."""
        if not idempotency_tokens:
            return {}
        found = self.read(EVENTS, Cond("idempotency_token", idempotency_tokens, "in"),
                          Cond("event_type", EventType.RUN_SKIPPED.value),
                          columns=["idempotency_token", "event_ts", "payload"])
        return {row["idempotency_token"]: (row["event_ts"], json.loads(row["payload"]) if row["payload"] else {})
                for row in found}

    def latest_skip(self, job_id: str) -> dict[str, Any] | None:
        """The job's latest RUN_SKIPPED event (its time, run, message and payload), or None."""
        found = self.read(EVENTS, Cond("trigger_job_id", job_id), Cond("event_type", EventType.RUN_SKIPPED.value),
                          columns=["event_ts", "job_run_id", "message", "payload"], order_by=["event_ts DESC"], limit=1)
        return found[0] if found else None

    def request_payload(self, idempotency_token: str) -> dict[str, Any]:
        """The whole payload of a trigger request: the job parameters and Heartbeat's own ``_`` keys
        (a catch-up sequence's plan)."""
        found = self.read(TRIGGER_REQUESTS_VIEW, Cond("idempotency_token", idempotency_token), columns=["payload"])
        return json.loads(found[0]["payload"]) if found and found[0]["payload"] else {}

    def new_data_events(self, event_ids: list[str]) -> list[dict]:
        """The NEW_DATA events with these ids: their source, cursors and windows (a backlog's bounds)."""
        if not event_ids:
            return []
        return self.read(EVENTS, Cond("event_id", event_ids, "in"), Cond("event_type", EventType.NEW_DATA.value),
                         columns=["event_id", "event_ts", "source_key", "cursor_from", "cursor_to",
                                  "window_from", "window_to", "rows", "payload"])

    def triggered_runs(self, job_run_ids: list[str]) -> set[tuple[str, str]]:
        """(job, run id) of those of ``job_run_ids`` a trigger of Heartbeat started (a TRIGGERED event)."""
        if not job_run_ids:
            return set()
        found = self.read(EVENTS, Cond("event_type", EventType.TRIGGERED.value),
                          Cond("job_run_id", sorted(set(job_run_ids)), "in"), columns=["trigger_job_id", "job_run_id"])
        return {(row["trigger_job_id"], str(row["job_run_id"])) for row in found}

    def lineage_backlog(self, since: datetime) -> list[dict]:
        """The run events (TRIGGERED, COMPLETED, FAILED, REFUSED) and LINEAGE_SENT records since ``since``: what
        lineage looks back at when it starts."""
        kinds = [EventType.TRIGGERED.value, EventType.COMPLETED.value, EventType.FAILED.value,
                 EventType.REFUSED.value, EventType.LINEAGE_SENT.value]
        return self.read(EVENTS, Cond("event_type", kinds, "in"), Cond("event_ts", since, ">="),
                         columns=["event_type", "trigger_job_id", "job_run_id", "idempotency_token", "event_ts",
                                  "message", "payload"])

    def open_sequences(self) -> list[dict]:
        """Catch-up sequences not finished yet: running, failed, or with a run due (``status`` shows them)."""
        return self.read(SEQUENCES_VIEW, Cond("is_finished", False), order_by=["trigger_job_id"])

    def sync_window_policies(self, policies: dict[str, tuple[int, int, str]]) -> bool:
        """Make heartbeat_window_policies hold ``policies`` (job -> size_s, lateness_s, late_data); True if changed."""
        current = {r["trigger_job_id"]: (r["size_s"], r["lateness_s"], r["late_data"])
                   for r in self.read(WINDOW_POLICIES)}
        if current == policies:
            return False
        rows = [(job, *values) for job, values in sorted(policies.items())]
        frame = self.engine.frame(rows, _struct(TABLE_COLUMNS[WINDOW_POLICIES]))
        retry_lost_commits(lambda: frame.write.mode("overwrite").insertInto(self.name(WINDOW_POLICIES)),
                           "writing the window policies")
        return True

    def sync_trigger_policies(self, policies: dict[str, tuple]) -> bool:
        """Make heartbeat_trigger_policies hold ``policies`` (job -> the other columns, in order); True if it
        changed (a commit only then)."""
        columns = TABLE_COLUMNS[TRIGGER_POLICIES]
        current = {r["trigger_job_id"]: tuple(r[c] for c in columns[1:]) for r in self.read(TRIGGER_POLICIES)}
        if current == policies:
            return False
        rows = [(job, *values) for job, values in sorted(policies.items())]
        frame = self.engine.frame(rows, _struct(columns))
        retry_lost_commits(lambda: frame.write.mode("overwrite").insertInto(self.name(TRIGGER_POLICIES)),
                           "writing the trigger policies")
        return True

    def deadlines_seen(self) -> dict[str, dict[str, str]]:
        """Since when each job's deadline is configured: ``{job: {"deadline": text, "since": ISO time}}`` (empty
        before the table exists: a lakehouse made by an older Heartbeat, read by a command that creates nothing)."""
        if not self.exists(DEADLINES):
            return {}
        return {r["trigger_job_id"]: {"deadline": r["deadline"], "since": r["since"]} for r in self.read(DEADLINES)}

    def sync_deadlines(self, deadlines: dict[str, dict[str, str]]) -> bool:
        """Make heartbeat_deadlines hold ``deadlines`` (as :meth:`deadlines_seen` gives them); True if it changed
        (a commit only then: when a deadline was added, changed or removed)."""
        if self.deadlines_seen() == deadlines:
            return False
        rows = [(job, d["deadline"], d["since"]) for job, d in sorted(deadlines.items())]
        frame = self.engine.frame(rows, _struct(TABLE_COLUMNS[DEADLINES]))
        retry_lost_commits(lambda: frame.write.mode("overwrite").insertInto(self.name(DEADLINES)),
                           "writing the deadlines")
        return True

    def event_time_events(self, source_keys: list[str], *, archive: bool = True) -> list[dict]:
        """The NEW_DATA events of these sources that recorded event times: hot log and archive, or the hot
        log only (``archive=False``: every one a windowed job has not planned yet is there,
        heartbeat_events_live)."""
        if not source_keys:
            return []
        found = self._read_events(Cond("source_key", source_keys, "in"), Cond("event_type", EventType.NEW_DATA.value),
                                  columns=["event_id", "event_ts", "source_key", "payload"], archive=archive)
        return [e for e in found if e["payload"]]

    def window_plans(self, job_id: str, *, archive: bool = True) -> list[dict]:
        """The job's window plans (trigger requests, WINDOW_SKIPPED) with the TRIGGER_ERROR and RESET events
        that void or restart them, oldest first: hot log and archive, or the hot log only (``archive=False``:
        the latest plan is always there)."""
        found = self._read_events(Cond("trigger_job_id", job_id), Cond("event_type", PLAN_EVENT_TYPES, "in"),
                                  columns=PLAN_COLUMNS, archive=archive)
        return sorted(found, key=lambda e: (e["event_ts"], e["event_id"]))

    def _read_events(self, *where: Cond, columns: Sequence[str], archive: bool) -> list[dict]:
        return self._read_history(*where, columns=columns) if archive else self.read(EVENTS, *where, columns=columns)

    def _read_history(self, *where: Cond, columns: Sequence[str]) -> list[dict]:
        """Events from the hot log and its archive, once each (a row caught in both by a crash while
        archiving is an exact copy)."""
        return list({e["event_id"]: e for table in (EVENTS, EVENTS_ARCHIVE)
                     for e in self.read(table, *where, columns=columns)}.values())

    def windowed_jobs_free(self) -> list[str]:
        """Windowed jobs not paused, running, failed or inside a sequence (a correction run may start)."""
        return [r["trigger_job_id"] for r in self.read(WINDOWS_VIEW, Cond("is_free", True), columns=["trigger_job_id"])]

    def windows_due(self) -> list[dict]:
        """Windowed jobs whose next event-time window is final and that are free to run it (heartbeat_job_windows)."""
        return self.read(WINDOWS_VIEW, Cond("windows_due", True), order_by=["trigger_job_id"])

    def next_windows_due(self) -> list[dict]:
        """Sequences whose latest run succeeded with runs left, of jobs not paused (heartbeat_job_sequences)."""
        return self.read(SEQUENCES_VIEW, Cond("next_run_due", True), Cond("is_paused", False),
                         order_by=["trigger_job_id"])


_First = TypeVar("_First")
_Second = TypeVar("_Second")

#: the worker threads of ``concurrently``, kept for the process: a tick uses them every few seconds, forever
_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="heartbeat-read")


def concurrently(first: Callable[[], _First], second: Callable[[], _Second]) -> tuple[_First, _Second]:
    """``first()`` here and ``second()`` on a worker thread, at once: two independent reads of the engine
    overlap their round trips and planning (on Spark each read is mostly that). Both have finished when
    this returns or raises; an error of ``first`` wins over one of ``second``."""
    later = _WORKERS.submit(second)
    try:
        done = first()
    finally:
        wait([later])
    return done, later.result()


class ReadCache:
    """Rows of earlier reads, valid while the engine's table fingerprint stays the same.

    Invariant: every entry was read under ``fingerprint`` (see Engine.tables_fingerprint); a new
    fingerprint empties the cache first. A None fingerprint (engines whose table versions cost a
    query) caches nothing. Callers get copies of the rows. At most MAX_ENTRIES entries are kept.
    """

    MAX_ENTRIES = 256

    def __init__(self) -> None:
        self._fingerprint: tuple | None = None
        self._rows: dict[str, list[dict]] = {}
        self._lock = threading.Lock()

    def get(self, fingerprint: tuple | None, sql: str, args: dict[str, object],
            read: Callable[[], list[dict]]) -> list[dict]:
        if fingerprint is None:
            return read()
        key = sql + "\x00" + json.dumps(args, sort_keys=True, default=str)
        with self._lock:
            if fingerprint != self._fingerprint or len(self._rows) >= self.MAX_ENTRIES:
                self._fingerprint, self._rows = fingerprint, {}
            rows = self._rows.get(key)
        if rows is None:
            rows = read()
            with self._lock:
                if fingerprint == self._fingerprint:
                    self._rows[key] = rows
        return [dict(row) for row in rows]


@dataclass(frozen=True)
class Cond:
    """``column <op> value`` in a WHERE clause; ``in`` takes a list. The value is always bound."""

    column: str
    value: object
    op: str = "="

    _OPS = ("=", "<>", "<", "<=", ">", ">=", "in")

    def bind(self, parameter: str, *, arrays: bool = True) -> tuple[str, dict[str, object]]:
        """The condition's SQL and its named parameters (``parameter``, or ``parameter_0``, ``_1``, ...).

        ``in`` binds its list as one array parameter where the engine takes arrays (``arrays``), else one
        parameter per value (Spark 3.5 takes literals only); an empty list matches no row either way."""
        column = validate_identifier(self.column, "column")
        if self.op not in self._OPS:
            raise ValueError(f"unsupported comparison {self.op!r}")
        if self.op != "in":
            return f"{column} {self.op} :{parameter}", {parameter: self.value}
        if arrays:
            return f"array_contains(:{parameter}, {column})", {parameter: self.value}
        values = list(cast(Iterable[object], self.value))
        if not values:
            return "FALSE", {}
        names = [f"{parameter}_{i}" for i in range(len(values))]
        return f"{column} IN ({', '.join(':' + name for name in names)})", dict(zip(names, values))


def _prefixed(expression: str, alias: str) -> str:
    """``run_id`` -> ``t.run_id`` in one of the fixed ARCHIVE_KEYS expressions."""
    import re

    return re.sub(r"\b(event_id|run_id|source_key)\b", rf"{alias}.\1", expression)


def _order_term(term: str) -> str:
    """``column`` or ``column DESC``, validated."""
    column, _, direction = term.partition(" ")
    if direction.upper() not in ("", "ASC", "DESC"):
        raise ValueError(f"bad ORDER BY term {term!r}")
    return f"{validate_identifier(column, 'column')} {direction.upper()}".rstrip()


def _utc(row: dict) -> dict:
    """A row with its timestamps made timezone-aware (UTC)."""
    return {k: (as_utc(v) if isinstance(v, datetime) else v) for k, v in row.items()}


def retry_lost_commits(write: Callable[[], object], what: str,
                       also: tuple[type[HeartbeatError], ...] = ()) -> None:
    """Run ``write``; while it fails because another writer committed first (or with an error of one
    of the ``also`` kinds, for writes that are safe to repeat), run it again. Which error is which is
    decided by the engine's error table (``engine_errors``), never here."""
    retryable: tuple[type[HeartbeatError], ...] = (CommitConflictError, *also)
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            write()
            return
        except Exception as exc:  # noqa: BLE001 - engine and dbt errors carry no stable type: the table maps them
            if attempt == WRITE_ATTEMPTS or not is_kind(exc, *retryable):
                raise
            log.warning("%s failed (%s); retrying", what, str(exc).strip().splitlines()[-1])
            time.sleep(LOST_COMMIT_BACKOFF.after(attempt))
