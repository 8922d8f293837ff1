"""``delta_table`` and ``lmu_delta_table`` (Lakehouse Manual Upload): Delta tables.

Without ``upstream_key`` new data means new Delta commits that added data after
the stored version; with ``upstream_key`` it means rows whose key is greater than
the stored value. Either way ``preprocess_query`` can filter the new rows (seen as
``sensor_new_data``), and an event is recorded only when it returns rows.

Unkeyed, the new rows are read from the table's change data feed when it records one
(``delta.enableChangeDataFeed``): the rows inserted or updated to since the stored
version. Otherwise they are the current version minus the stored one (``exceptAll``),
which reads both versions whole.

Cursor: ``{"version": int}`` plus ``"value"`` (the key reached) when keyed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.names import check_table_reference, is_path
from heartbeat_runner.core.records import as_utc
from heartbeat_runner.core.windows import EventTimes, SourceWindow, WindowBounds, WindowLimit
from heartbeat_runner.engines import delta_log
from heartbeat_runner.engines.engine import Engine
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
from heartbeat_runner.sensing.sources.common import frame_event_times, keyed_result, split_key_span
from heartbeat_runner.sensing.watch import FolderWatch

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: how far the catalog's clock may be behind the runner's: a table altered up to this long before its
#: cursor was taken is still sensed (a bulk look must never rule out a commit the cursor missed)
CATALOG_CLOCK_MARGIN = timedelta(minutes=5)


#: tables a tick spot-checks among those the catalog look rules out (their newest version, one history row each):
#: with N such tables, a catalog lagging one of them is found within ceil(N / CATALOG_SPOT_CHECKS) ticks
CATALOG_SPOT_CHECKS = 1


def _spot_checked(ruled_out: dict[str, str], names: dict[str, tuple[str, SensingTarget]],
                  ctx: SenseContext) -> dict[str, str]:
    """``ruled_out`` less the tables whose spot check (their newest version, in turn across ticks) found a commit
    after their cursor: the catalog lags their history. Each such table is logged once and joins
    ``engine.catalog_lagging``; a check that cannot read the table leaves it to sensing too."""
    if not ruled_out or CATALOG_SPOT_CHECKS <= 0:
        return ruled_out
    keys = sorted(ruled_out)
    start = ctx.engine.catalog_spot_turn % len(keys)
    ctx.engine.catalog_spot_turn = start + CATALOG_SPOT_CHECKS
    out = dict(ruled_out)
    for key in (keys[(start + n) % len(keys)] for n in range(min(CATALOG_SPOT_CHECKS, len(keys)))):
        name, target = names[key]
        seen = (load_cursor(target.cursor) or {}).get("version")
        try:
            current = ctx.engine.table_version(name)
        except Exception:  # noqa: BLE001 - in doubt, leave it in: sensing reports what is wrong
            out.pop(key)
            continue
        if seen is not None and current is not None and current > int(seen):
            out.pop(key)
            if name not in ctx.engine.catalog_lagging:
                ctx.engine.catalog_lagging.add(name)
                log.warning("%s has commits after version %s that the catalog's last_altered does not show: it is "
                            "sensed from its history from now on (set HEARTBEAT_CATALOG_LOOK_SKIP to say so)", name, seen)
    return out


class DeltaTableSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("delta_table", "lmu_delta_table")
    reports_event_times: ClassVar[bool] = True

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """By location (``file`` + path, ``s3://bucket`` + key, ...) or by name in the catalog's namespace."""
        return table_dataset(sensor_id, naming)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        return check_table_reference(sensor_id)

    def unchanged(self, targets: Sequence[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        """Tables known to have no commit after their cursor's: on this machine, by a look at the log (a
        ``stat`` of the next commit's file); elsewhere, by one catalog query per catalog."""
        out = self._unchanged_on_this_machine(targets, ctx)
        out.update(self._unchanged_in_the_catalog([t for t in targets if t.source_key not in out], ctx))
        return out

    @staticmethod
    def _unchanged_on_this_machine(targets: Sequence[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        """Tables on this machine whose newest commit is still their cursor's version: exactly what
        :meth:`sense` would find first, without a worker thread per table (at 10,000 tables the hand-offs
        cost more than the looks). A table that cannot be looked at here is left to :meth:`sense`."""
        ctx.engine.learn_locations([ctx.engine.upstream_table(t.sensor_id) for t in targets
                                    if not is_path(t.sensor_id)])
        out = {}
        for target in targets:
            try:
                seen = (load_cursor(target.cursor) or {}).get("version")
                if seen is None or (local := _local_table_dir(target.sensor_id, ctx.engine)) is None:
                    continue
                if delta_log.latest_version(local) == int(seen):
                    out[target.source_key] = f"no commit after version {seen}"
            except Exception:  # noqa: BLE001 - in doubt, leave it in: sensing reports what is wrong
                continue
        return out

    @staticmethod
    def _unchanged_in_the_catalog(targets: Sequence[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        """Tables the catalog vouches were not altered since their cursor was taken, in one catalog query per
        catalog asking for these tables only (Unity Catalog's ``information_schema.tables.last_altered``;
        engines whose tables are on this machine have no such look, and need none). ``last_altered`` also
        moves on metadata changes, so it only rules tables out: one it names is sensed (its history then tells
        data from maintenance).

        Invariant: a table is ruled out only when the catalog can vouch for it: listed, of a type every write of
        which goes through the catalog (``VOUCHED_TABLE_TYPES``: not an EXTERNAL table, which other engines can
        write at its path), not named in ``HEARTBEAT_CATALOG_LOOK_SKIP``, and not found lagging its history.
        Lagging is found by spot checks: ``CATALOG_SPOT_CHECKS`` tables a tick that the look would rule out, in
        turn, have their newest version read (one history row); one that moved past its cursor while its
        ``last_altered`` did not is logged once and sensed from its history for the rest of the process."""
        skip = {name.lower() for name in ctx.engine.settings.catalog_look_skip}
        taken = {t.source_key: (ctx.engine.upstream_table(t.sensor_id), as_utc(t.cursor_ts), t) for t in targets
                 if t.cursor is not None and t.cursor_ts is not None and not is_path(t.sensor_id)
                 and t.sensor_id.lower() not in skip}
        if not taken:
            return {}
        looked = ctx.engine.catalog_look(sorted({name for name, _, _ in taken.values()}))
        if looked is None:
            return {}
        ruled_out = {}
        for key, (name, at, _) in taken.items():
            entry = looked.get(name)
            if entry is None or not entry.vouched or name in ctx.engine.catalog_lagging:
                continue  # the catalog cannot vouch for it: sensed from its history
            if entry.last_altered is None or entry.last_altered < at - CATALOG_CLOCK_MARGIN:
                ruled_out[key] = "not altered since the cursor (catalog)"
        return _spot_checked(ruled_out, {key: (name, target) for key, (name, _, target) in taken.items()}, ctx)

    def watch(self, targets: Sequence[SensingTarget], ctx: SenseContext,
              wake: Callable[[str], None]) -> FolderWatch | None:
        """File-system notifications on the ``_delta_log`` of every table on this machine: a new commit file
        wakes its source. Tables elsewhere (Databricks, a remote Spark) are polled. The logs are watched
        through the folders holding the tables (a schema's folder), not one watch per table."""
        logs: dict[Path, set[str]] = {}
        for target in targets:
            local = _local_table_dir(target.sensor_id, ctx.engine)
            if local is not None:
                logs.setdefault(local / "_delta_log", set()).add(target.source_key)
        if not logs:
            return None
        return FolderWatch({f: frozenset(k) for f, k in logs.items()}, {f.parent.parent for f in logs}, wake,
                           ignore=_not_a_commit).start()

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        table = DeltaRef.resolve(target.sensor_id, ctx.engine)
        current = table.latest_version()
        if current is None:
            raise SourceError(f"Delta table {target.sensor_id!r} not found")
        cursor = load_cursor(target.cursor)
        if cursor is None:
            if not ctx.replay_new_sensors:
                return self._baseline(table, target, current, ctx)
            cursor = {"version": -1, "value": None}
        seen = int(cursor["version"])
        if current == seen:
            return SenseResult(new_data=False, detail=f"no commit after version {seen}")
        if current < seen:
            raise SourceError(f"Delta table {target.sensor_id!r} is at version {current}, behind the cursor {seen} "
                              "(table re-created?); use `reset` to re-process it")
        grain = ctx.event_time_grains.get(target.source_key)
        if target.upstream_key and grain:
            return self._sense_event_times(table, target, ctx, cursor, current, target.upstream_key, grain)
        if target.upstream_key:
            return self._sense_keyed(table, target, ctx, cursor, current, target.upstream_key)
        return self._sense_versions(table, target, ctx, seen, current)

    def bounds(self, cursor_from: str | None, cursor_to: str | None) -> WindowBounds:
        """Keyed: values of the key (as text). Unkeyed: Delta versions (the run reads the versions after
        ``from`` up to ``until``; from None: from the first version)."""
        before, after = load_cursor(cursor_from) or {}, load_cursor(cursor_to) or {}
        if "value" in after:
            return WindowBounds("key", before.get("value"), after["value"])
        version = before.get("version")
        return WindowBounds("delta_version", None if version is None or version < 0 else version, after.get("version"))

    def split(self, window: SourceWindow, limit: WindowLimit, upstream_key: str | None) -> list[SourceWindow]:
        """Keyed: spans of the key (``7d`` for a date or timestamp key, a count for a numeric one).
        Unkeyed: runs of at most ``limit`` Delta versions."""
        before, after = load_cursor(window.cursor_from) or {}, load_cursor(window.cursor_to) or {}
        if upstream_key:
            version = after.get("version")
            return split_key_span(window, limit, upstream_key, before.get("value"), after.get("value"),
                                  lambda top: dump_cursor({"version": version, "value": top}))
        if limit.count is None:
            raise SourceError(f"max_window {limit} is a time span, but {window.sensor_id} has no upstream_key: "
                              "its windows are Delta versions, so give a number of versions (e.g. 10)")
        low, high = int(before.get("version", -1)), int(after["version"])
        pieces = []
        for lo in range(low, high, limit.count):
            hi = min(lo + limit.count, high)
            pieces.append(SourceWindow(window.sensor_source, window.sensor_id, dump_cursor({"version": lo}),
                                       dump_cursor({"version": hi}), f"version {lo + 1}", f"version {hi}"))
        return pieces or [window]

    def _baseline(self, table: DeltaRef, target: SensingTarget, current: int, ctx: SenseContext) -> SenseResult:
        cursor: dict[str, int | str | None] = {"version": current}
        times = None
        if target.upstream_key:
            top = table.read(current).agg({target.upstream_key: "max"}).collect()[0][0]
            cursor["value"] = None if top is None else str(top)
            if target.source_key in ctx.event_time_grains:
                times = EventTimes.baseline(top)  # the watermark starts at the end of the table
        return SenseResult(new_data=False, cursor_to=dump_cursor(cursor), window_to=f"version {current}",
                           detail="new sensor: baseline at the current end of the table", event_times=times)

    def _sense_versions(self, table: DeltaRef, target: SensingTarget, ctx: SenseContext,
                        seen: int, current: int) -> SenseResult:
        cursor_to = dump_cursor({"version": current})
        window_from, window_to = f"version {seen + 1}", f"version {current}"
        if not table.added_data_between(seen, current):
            return SenseResult(new_data=False, cursor_to=cursor_to, window_from=window_from, window_to=window_to,
                               detail="commits without new data")
        if not target.preprocess_query:
            return SenseResult(new_data=True, cursor_to=cursor_to, window_from=window_from, window_to=window_to)
        new_rows, how = self._new_rows(table, seen, current)
        rows = ctx.count_preprocessed(new_rows, target)
        return SenseResult(new_data=rows > 0, cursor_to=cursor_to, window_from=window_from, window_to=window_to,
                           rows=rows, detail=how)

    @staticmethod
    def _new_rows(table: DeltaRef, seen: int, current: int) -> tuple[DataFrame, str]:
        """The rows versions ``seen+1``..``current`` added (inserted or updated to), with the table's
        own columns, and how they were found (the result's detail)."""
        if seen < 0:
            return table.read(current), f"every row of version {current} (new sensor replayed)"
        from_feed = table.changes(seen, current)
        if from_feed is not None:
            return from_feed, "new rows from the change data feed"
        return table.read(current).exceptAll(table.read(seen)), "new rows by comparing versions"

    def _sense_event_times(self, table: DeltaRef, target: SensingTarget, ctx: SenseContext, cursor: dict,
                           current: int, key: str, grain: int) -> SenseResult:
        """For a job with an event-time window policy: the rows the new versions added, whatever their key
        (a row for an hour already final is late data, not nothing), with their event times by ``key``."""
        kind = dict(table.read(current).dtypes).get(key)
        if kind not in ("date", "timestamp", "timestamp_ntz"):
            raise SourceError(f"upstream_key {key!r} of {target.sensor_id!r} is {kind or 'not a column'}: an event-time "
                              "window policy needs a date or timestamp column")
        seen = int(cursor["version"])
        new_rows, how = self._new_rows(table, seen, current)
        times = frame_event_times(new_rows, key, grain)
        previous = cursor.get("value")
        top = previous
        if times is not None and times.max_s is not None:
            latest = iso_key(times.max_s, previous)
            top = latest if previous is None or latest > previous else previous
        cursor_to = dump_cursor({"version": current, "value": top})
        window_from, window_to = f"version {seen + 1}", f"version {current}"
        if times is None:
            return SenseResult(new_data=False, cursor_to=cursor_to, window_from=window_from, window_to=window_to,
                               detail="commits without new rows")
        rows = ctx.count_preprocessed(new_rows, target)
        return SenseResult(new_data=rows > 0, cursor_to=cursor_to, window_from=window_from, window_to=window_to,
                           rows=rows, detail=how, event_times=times)

    def _sense_keyed(self, table: DeltaRef, target: SensingTarget, ctx: SenseContext,
                     cursor: dict, current: int, key: str) -> SenseResult:
        """New rows by ``key``, the target's upstream_key."""
        from pyspark.sql import functions as F

        frame = table.read(current)
        if key not in frame.columns:
            raise SourceError(f"upstream_key {key!r} is not a column of {target.sensor_id!r}")
        previous = cursor.get("value")
        new_rows = frame
        if previous is not None:
            key_type = frame.schema[key].dataType
            new_rows = frame.where(F.col(key) > F.lit(previous).cast(key_type))
        top = new_rows.agg(F.max(key)).collect()[0][0]
        if top is None:
            return SenseResult(new_data=False, cursor_to=dump_cursor({"version": current, "value": previous}),
                               detail=f"no {key} after {previous}")
        rows = ctx.count_preprocessed(new_rows, target)
        return keyed_result(key, previous, top, rows, dump_cursor({"version": current, "value": str(top)}))


def _local_table_dir(sensor_id: str, engine: Engine) -> Path | None:
    """The folder of a table on this machine (by path or by name), or None; never raises."""
    try:
        return DeltaRef.resolve(sensor_id, engine).local_dir
    except Exception:  # noqa: BLE001 - a table that cannot be resolved now is polled (sensing reports it)
        return None


def _not_a_commit(name: str) -> bool:
    """A ``_delta_log`` file that is not a commit (checkpoints, CRCs, temporary files)."""
    return not (name.endswith(".json") and name[:1].isdigit())


def iso_key(seconds: int, like: str | None) -> str:
    """Epoch seconds as key text in the shape the cursor already holds (``2026-05-01 10:00:00``)."""
    from datetime import datetime, timezone

    value = datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)
    return value.date().isoformat() if like is not None and len(like) == 10 else str(value)


class DeltaRef:
    """A Delta table named by ``schema.table`` or by path, on the engine at hand."""

    def __init__(self, engine: Engine, sql_name: str, local_dir: Path | None):
        self.engine = engine
        self.sql_name = sql_name
        self.local_dir = local_dir

    @classmethod
    def resolve(cls, sensor_id: str, engine: Engine) -> DeltaRef:
        if is_path(sensor_id):
            local = Path(sensor_id) if sensor_id.startswith("/") else None
            return cls(engine, f"delta.`{sensor_id}`", local)
        name = engine.upstream_table(sensor_id)
        local = engine.local_location(name)
        if local is not None:
            return cls(engine, f"delta.`{local}`", local)
        return cls(engine, name, engine.delta_log_dir(name))

    def latest_version(self) -> int | None:
        """From the table's ``_delta_log`` when it is on this machine (no Spark job), else its history."""
        if self.local_dir is not None:
            version = delta_log.latest_version(self.local_dir)
            if version is not None or self.sql_name.startswith("delta.`"):
                return version
            self.engine.forget_location(self.sql_name)  # dropped, maybe re-created elsewhere
        try:
            return self.engine.table_version(self.sql_name)
        except Exception as exc:  # noqa: BLE001 - any engine error means we cannot see the table
            raise SourceError(f"cannot read the history of {self.sql_name}: {exc}") from exc

    def added_data_between(self, after: int, up_to: int) -> bool:
        """Whether a commit after version ``after`` up to ``up_to`` changed data: from the ``_delta_log`` on
        this machine, else from the table's history; maintenance (OPTIMIZE, VACUUM, properties, comments,
        schema changes) never counts, on either path."""
        if self.local_dir is not None:
            return delta_log.added_data_between(self.local_dir, after, up_to)
        try:
            return self.engine.data_changed_between(self.sql_name, after, up_to)
        except Exception as exc:  # noqa: BLE001 - any engine error means we cannot read the history
            raise SourceError(f"cannot read the history of {self.sql_name}: {exc}") from exc

    def read(self, version: int) -> DataFrame:
        return self.engine.sql(f"SELECT * FROM {self.sql_name} VERSION AS OF {int(version)}")

    def changes(self, after: int, up_to: int) -> DataFrame | None:
        """The rows versions ``after+1``..``up_to`` inserted or updated to, from the table's change
        data feed; None when the table records no feed for that range (read the versions instead)."""
        try:
            return self.engine.changes(self.sql_name, after + 1, up_to)
        except Exception as exc:  # noqa: BLE001 - any engine error means we cannot read the feed
            raise SourceError(f"cannot read the change data feed of {self.sql_name}: {exc}") from exc
