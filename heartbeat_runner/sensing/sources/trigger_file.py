"""``trigger_file``: a new file under ``<trigger dir>/<sensor_id>/``.

Files are ordered by (modification time, name); the cursor is the newest one seen.
Hidden and temporary files (``.name``, ``_name``, ``*.tmp``) are ignored, so a
writer can create ``_x.tmp`` and rename it when complete. A folder that does not
exist yet simply has no new data.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import ClassVar

from heartbeat_runner.sensing.sources.base import (
    LineageDataset,
    LineageNaming,
    SenseContext,
    SenseResult,
    SensingTarget,
    Source,
    dump_cursor,
    load_cursor,
    location_dataset,
)
from heartbeat_runner.sensing.watch import FolderWatch


class TriggerFileSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("trigger_file",)

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """The trigger folder by location: ``file`` + ``<trigger dir>/<sensor_id>``."""
        return location_dataset(str(naming.trigger_dir / sensor_id))

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        if sensor_id.startswith("/"):
            return None
        parts = PurePosixPath(sensor_id).parts
        if ".." in parts or "\\" in sensor_id:
            return f"{sensor_id!r} must be a folder name under the trigger directory (no '..') or an absolute path"
        return None

    def folder(self, target: SensingTarget, ctx: SenseContext) -> Path:
        if target.sensor_id.startswith("/"):
            return Path(target.sensor_id)
        return ctx.trigger_dir / target.sensor_id

    def watch(self, targets: Sequence[SensingTarget], ctx: SenseContext,
              wake: Callable[[str], None]) -> FolderWatch:
        """File-system notifications on the trigger folders: a file renamed into one (or written there)
        wakes its source; hidden and temporary files wake nothing. Folders under the trigger directory are
        watched through it (made here when missing), so one made after the watch started is watched too."""
        folders: dict[Path, set[str]] = {}
        for target in targets:
            folders.setdefault(self.folder(target, ctx), set()).add(target.source_key)
        with contextlib.suppress(OSError):  # the base folder is Heartbeat's: made so it can be watched
            ctx.trigger_dir.mkdir(parents=True, exist_ok=True)
        return FolderWatch({f: frozenset(k) for f, k in folders.items()}, {f.parent for f in folders}, wake,
                           ignore=_hidden).start()

    def unchanged(self, targets: Sequence[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        """Folders with no visible file after their cursor's: exactly what :meth:`sense` would find, in one pass
        without a worker thread per folder (at thousands of folders the hand-offs cost more than the
        listings). A folder that cannot be listed, or a target without a cursor, is left to :meth:`sense`."""
        out = {}
        for target in targets:
            try:
                cursor = load_cursor(target.cursor)
                if cursor is None:
                    continue
                folder = self.folder(target, ctx)
                if not _newer(_visible_files(folder), cursor):
                    out[target.source_key] = _nothing_new(folder)
            except Exception:  # noqa: BLE001 - in doubt, leave it in: sensing reports what is wrong
                continue
        return out

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        folder = self.folder(target, ctx)
        files = _visible_files(folder)
        newest = max(files, default=None)
        cursor = load_cursor(target.cursor)
        if cursor is None and not ctx.replay_new_sensors:
            cursor_to = dump_cursor({"mtime_ns": newest[0], "name": newest[1]}) if newest else dump_cursor({})
            return SenseResult(new_data=False, cursor_to=cursor_to, detail="new sensor: baseline")
        new = _newer(files, cursor)
        if not new:
            return SenseResult(new_data=False, detail=_nothing_new(folder))
        return SenseResult(
            new_data=True,
            cursor_to=dump_cursor({"mtime_ns": new[-1][0], "name": new[-1][1]}),
            window_from=new[0][1],
            window_to=new[-1][1],
            rows=len(new),
            detail=f"{len(new)} new file(s)",
        )


def _newer(files: list[tuple[int, str]], cursor: dict | None) -> list[tuple[int, str]]:
    """The files after the cursor's (modification time, name), oldest first."""
    mark = (cursor.get("mtime_ns", -1), cursor.get("name", "")) if cursor else (-1, "")
    return sorted(f for f in files if f > mark)


def _nothing_new(folder: Path) -> str:
    return "folder does not exist yet" if not folder.exists() else "no new trigger file"


def _hidden(name: str) -> bool:
    """A file sensing never counts (a writer's temporary file, renamed when complete)."""
    return name.startswith((".", "_")) or name.endswith(".tmp")


def _visible_files(folder: Path) -> list[tuple[int, str]]:
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        (entry.stat().st_mtime_ns, entry.name)
        for entry in entries
        if entry.is_file() and not _hidden(entry.name)
    ]
