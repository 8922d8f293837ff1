"""``local_prefix``: new objects under an S3-style key prefix, in a bucket that is a local folder.

``sensor_id`` is ``<bucket>/<key prefix>``: the bucket is a folder under ``HEARTBEAT_BUCKETS_DIR``
(the plugin's own setting, read from the environment), the key prefix matches object keys (paths
relative to the bucket, with ``/``) from their start, as S3's ListObjectsV2 does. Objects are
ordered by (modification time, key); the cursor is the newest seen. An object's modification
time is its event time (for jobs with an event-time window policy), and a catch-up policy
cuts a backlog into runs of at most N objects.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.windows import EventTimes, SourceWindow, WindowLimit
from heartbeat_runner.sensing.sources.base import (
    SenseContext,
    SenseResult,
    SensingTarget,
    Source,
    dump_cursor,
    load_cursor,
)

#: where the buckets are (one folder each)
BUCKETS_DIR = "HEARTBEAT_BUCKETS_DIR"


class LocalPrefixSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("local_prefix",)
    reports_event_times: ClassVar[bool] = True

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        bucket, _, _ = sensor_id.partition("/")
        if not bucket or bucket in (".", "..") or "\\" in sensor_id or ".." in sensor_id.split("/"):
            return f"{sensor_id!r} must be <bucket>/<key prefix> (a bucket folder name, no '..')"
        if upstream_key is not None:
            return "upstream_key must be empty for local_prefix sources (objects have no columns)"
        return None

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        objects = _list_objects(target.sensor_id)
        cursor = load_cursor(target.cursor)
        if cursor is None and not ctx.replay_new_sensors:
            newest = objects[-1] if objects else None
            return SenseResult(new_data=False, cursor_to=_cursor(newest), detail="new sensor: baseline")
        mark = (cursor["mtime_ns"], cursor["key"]) if cursor and cursor.get("key") else (-1, "")
        new = [o for o in objects if o > mark]
        if not new:
            return SenseResult(new_data=False, detail="no new object")
        grain = ctx.event_time_grains.get(target.source_key)
        return SenseResult(
            new_data=True, cursor_to=_cursor(new[-1]), window_from=new[0][1], window_to=new[-1][1], rows=len(new),
            detail=f"{len(new)} new object(s)", cut_points=tuple(_cursor(o) for o in new),
            event_times=EventTimes.of([mtime // 1_000_000_000 for mtime, _ in new], grain) if grain else None)

    def split(self, window: SourceWindow, limit: WindowLimit, upstream_key: str | None) -> list[SourceWindow]:
        """Runs of at most ``limit`` objects, cut after the objects sensing saw."""
        if limit.count is None:
            raise SourceError(f"max_window {limit}: the windows of {window.sensor_id} are objects, give a count")
        ends = list(window.cut_points[limit.count - 1::limit.count]) or [window.cursor_to]
        if ends[-1] != window.cursor_to:
            ends.append(window.cursor_to)
        pieces, low = [], window.cursor_from
        for end in ends:
            pieces.append(SourceWindow(window.sensor_source, window.sensor_id, low, end,
                                       _key(low) or "beginning", _key(end)))
            low = end
        return pieces


def _list_objects(sensor_id: str) -> list[tuple[int, str]]:
    """(modification time ns, key) of the objects whose key starts with the prefix, oldest first."""
    root = os.environ.get(BUCKETS_DIR)
    if not root:
        raise SourceError(f"set {BUCKETS_DIR} to the folder that holds the buckets")
    bucket, _, prefix = sensor_id.partition("/")
    folder = Path(root) / bucket
    if not folder.is_dir():
        raise SourceError(f"bucket {bucket!r} does not exist (no folder {folder})")
    found = []
    for path in folder.rglob("*"):
        key = path.relative_to(folder).as_posix()
        if path.is_file() and key.startswith(prefix):
            found.append((path.stat().st_mtime_ns, key))
    return sorted(found)


def _cursor(obj: tuple[int, str] | None) -> str:
    return dump_cursor({"mtime_ns": obj[0], "key": obj[1]} if obj else {})


def _key(cursor: str | None) -> str | None:
    return json.loads(cursor).get("key") if cursor else None
