"""Keeping Heartbeat's own tables the same size on day 400 as on day 1.

Three jobs, each safe to interrupt at any point:

- **archive**: events the control table no longer needs (``heartbeat_events_live``
  says which are needed) move from the hot log to ``heartbeat_events_archive``; run
  summaries and per-source report rows older than ``report_keep_hours`` move to their
  archives (the latest report row of each source stays hot, for ``explain``). Rows are
  first copied, then deleted from the hot table in one commit, so a crash in between
  leaves a row in both places, which every reader de-duplicates by id; nothing is
  ever in neither.
- **compact**: a table with more data files than ``compact_min_files`` is compacted,
  checkpointed and vacuumed (files unreferenced for ``vacuum_retention_hours``).
- **retention**: archived rows older than ``archive_retention_days`` are deleted,
  and only when the user chose that setting; by default history is kept forever.

Between runs, :meth:`Maintenance.compact_control` compacts the control table alone once it holds more
than ``CONTROL_MAX_FILES`` files: every tick folds into it (each fold adds a file), and every fold and
every read of it (the ready view, the sensor plan) costs per file. It is one row per source and job,
so that compaction is cheap; vacuuming the files it leaves waits for the next run.

The tick runs maintenance when it is due (see :meth:`Maintenance.due`), under the tick
lease; ``python -m heartbeat_runner maintain`` runs it on demand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING

from heartbeat_runner.core.faults import ARCHIVE_STEPS, FaultPoint, crash_point
from heartbeat_runner.core.records import utcnow
from heartbeat_runner.core.settings import MaintenancePolicy
from heartbeat_runner.engines import delta_log
from heartbeat_runner.lakehouse.store import (
    ARCHIVE_KEYS,
    CONTROL,
    EVENTS,
    EVENTS_ARCHIVE,
    LIVE_EVENTS_VIEW,
    OWN_TABLES,
    REBUILT_TABLES,
    RUN_REPORT,
    RUN_REPORT_ARCHIVE,
    RUNS,
    RUNS_ARCHIVE,
    TableStore,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: the operations a maintenance run commits to the events table (compaction, vacuum, the archive's delete): what
#: ControlTable.keeping_current lets a marker move over; an append is never one
MAINTENANCE_OPERATIONS = delta_log.NO_DATA_OPERATIONS | {"DELETE"}
#: the control table is compacted alone (Maintenance.compact_control) past this many data files
CONTROL_MAX_FILES = 8


class MaintenanceDue(Enum):
    """What :meth:`Maintenance.due` found due."""

    NOTHING = "nothing"
    CONTROL = "control"  # the control table compacted alone
    RUN = "run"          # a whole run: archive, compact, vacuum


@dataclass
class MaintenanceResult:
    """What one maintenance run did."""

    archived_events: int = 0
    archived_runs: int = 0
    archived_report_rows: int = 0
    deleted_by_retention: int = 0
    compacted: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (files before, after)
    duration_s: float = 0.0
    #: control rows whose folded state differed from their derivation, rebuilt (ControlTable.check_folds), as
    #: (sensor_source, sensor_id, trigger_job_id)
    repaired_rows: list[tuple[str, str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"archived_events": self.archived_events, "archived_runs": self.archived_runs,
                "repaired_rows": [list(key) for key in self.repaired_rows],
                "archived_report_rows": self.archived_report_rows,
                "deleted_by_retention": self.deleted_by_retention,
                "compacted": {t: {"files_before": b, "files_after": a} for t, (b, a) in self.compacted.items()},
                "duration_s": round(self.duration_s, 3)}


class Maintenance:
    """Archives, compacts and (by choice) expires Heartbeat's own tables. Never changes the control table's rows
    (compacting it rewrites the same rows into fewer files)."""

    def __init__(self, store: TableStore, policy: MaintenancePolicy, *,
                 progress: Callable[[str], None] = lambda message: None):
        self.store = store
        self.engine = store.engine
        self.policy = policy
        self.progress = progress
        self._next_check = 0.0  # monotonic time before which due() answers False without reading

    # -- when -----------------------------------------------------------------------------------

    def due(self) -> MaintenanceDue:
        """What is due: a run (one of Heartbeat's tables references more than ``compact_min_files`` data
        files), else the control table compacted alone (more than ``CONTROL_MAX_FILES``: every tick folds
        into it, :meth:`compact_control`), else nothing.

        Reads table metadata only (the Delta log locally), each table's once; the tick asks only after it
        wrote. Where that costs a query per table, at most once per the engine's
        ``maintenance_check_interval_s``.
        """
        now = time.monotonic()
        if now < self._next_check:
            return MaintenanceDue.NOTHING
        self._next_check = now + self.engine.ops.maintenance_check_interval_s
        control = self.engine.file_count(self.store.name(CONTROL))
        if control > self.policy.compact_min_files or any(
                self.engine.file_count(self.store.name(t)) > self.policy.compact_min_files
                for t in OWN_TABLES if t != CONTROL):
            return MaintenanceDue.RUN
        return MaintenanceDue.CONTROL if control > CONTROL_MAX_FILES else MaintenanceDue.NOTHING

    def compact_control(self) -> tuple[int, int]:
        """Compact the control table alone: its files before and after. A rewrite of the same rows: what every
        view reads stays the same, so the control table stays current."""
        return self._compact(CONTROL, self.engine.file_count(self.store.name(CONTROL)))

    # -- what -----------------------------------------------------------------------------------

    def run(self, *, compact_all: bool = False) -> MaintenanceResult:
        """Archive, expire (only under a retention setting), then compact and vacuum. Never touches
        the control table's content: what it derives from the hot log is the same before and after."""
        began = time.monotonic()
        result = MaintenanceResult()
        self.progress("archiving events the control table no longer needs")
        result.archived_events = self.archive_events()
        self.progress("archiving old run summaries and report rows")
        result.archived_runs = self._archive_runs()
        result.archived_report_rows = self._archive_report()
        if self.policy.archive_retention_days is not None:
            result.deleted_by_retention = self.expire_archives(self.policy.archive_retention_days)
        self.progress("compacting and vacuuming tables")
        self._compact_tables(compact_all, result.compacted)
        result.duration_s = time.monotonic() - began
        return result

    def archive_events(self) -> int:
        """Move the hot log's dead events (not in heartbeat_events_live) to the archive: copy, then delete."""
        spark = self.store.spark
        hot = spark.table(self.store.name(EVENTS))
        dead = hot.join(spark.table(self.store.name(LIVE_EVENTS_VIEW)), "event_id", "left_anti")
        return self._move(EVENTS, EVENTS_ARCHIVE, dead.select("event_id").distinct(), "events")

    def _archive_runs(self) -> int:
        """Move run summaries older than ``report_keep_hours`` to their archive."""
        from pyspark.sql import functions as F

        runs = self.store.spark.table(self.store.name(RUNS))
        old_runs = runs.where(F.col("snapshot_ts") < F.lit(self._report_cutoff())).select("run_id").distinct()
        return self._move(RUNS, RUNS_ARCHIVE, old_runs, "runs")

    def _archive_report(self) -> int:
        """Move report rows older than ``report_keep_hours`` to their archive; the newest row of every source
        stays hot (it is what `explain` shows as its last evaluation)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        report = self.store.spark.table(self.store.name(RUN_REPORT))
        newest = Window.partitionBy("source_key").orderBy(F.col("snapshot_ts").desc())
        old_report = (report.withColumn("recency", F.row_number().over(newest))
                      .where((F.col("snapshot_ts") < F.lit(self._report_cutoff())) & (F.col("recency") > 1))
                      .select(F.expr(ARCHIVE_KEYS[RUN_REPORT])).distinct())
        return self._move(RUN_REPORT, RUN_REPORT_ARCHIVE, old_report, "report")

    def _report_cutoff(self) -> datetime:
        return _before(timedelta(hours=self.policy.report_keep_hours))

    def _move(self, table: str, archive: str, keys: DataFrame, what: str) -> int:
        """Copy the rows of ``table`` whose archive key (store.ARCHIVE_KEYS) is in ``keys`` to ``archive``,
        then delete them from ``table``.

        The keys are staged in their own table first, so the copy and the delete agree even if
        rows are appended meanwhile. A crash after the copy leaves rows in both tables (readers
        de-duplicate); the next run copies and deletes them again.
        """
        count = self.store.stage_keys(keys)
        if count == 0:
            return 0
        crash_point(ARCHIVE_STEPS[what].after_staging)
        self.store.copy_staged(table, archive)
        crash_point(ARCHIVE_STEPS[what].after_copy)
        self.store.delete_staged(table)
        crash_point(ARCHIVE_STEPS[what].after_delete)
        log.info("archived %d %s", count, what)
        return count

    def expire_archives(self, days: float) -> int:
        """Delete archived rows older than ``days`` (the user's retention setting)."""
        cutoff = _before(timedelta(days=days))
        return sum(self.store.delete_older_than(archive, column, cutoff)
                   for archive, column in ((EVENTS_ARCHIVE, "event_ts"), (RUNS_ARCHIVE, "snapshot_ts"),
                                           (RUN_REPORT_ARCHIVE, "snapshot_ts")))

    def _compact_tables(self, force: bool, done: dict[str, tuple[int, int]]) -> None:
        """Compact each of Heartbeat's tables with too many files (every one when ``force``), then vacuum them
        all, the dbt-built ones too (each build rewrites those, leaving unreferenced files); what is compacted
        goes into ``done`` as it goes."""
        for table in OWN_TABLES:
            name = self.store.name(table)
            before = self.engine.file_count(name)
            if not force and before <= self.policy.compact_min_files:
                continue
            done[table] = self._compact(table, before)
        for table in (*OWN_TABLES, *REBUILT_TABLES):
            if self.store.exists(table):
                self.engine.vacuum(self.store.name(table), retention_hours=self.policy.vacuum_retention_hours)

    def _compact(self, table: str, before: int) -> tuple[int, int]:
        """Compact ``table``, which references ``before`` data files: its files before and after."""
        crash_point(FaultPoint.DURING_COMPACTION)
        name = self.store.name(table)
        self.engine.compact(name)
        return before, self.engine.file_count(name)


def _before(age: timedelta) -> datetime:
    """Now minus ``age``, naive UTC (the session time zone of Heartbeat's timestamps)."""
    return (utcnow() - age).replace(tzinfo=None)
