"""File-system notifications for sources whose upstream lives on this machine (trigger folders, local
Delta logs): the wake-ups of ``run --loop`` (docs/wakeups.md).

Invariants:

- a notification only wakes the loop early; it never records anything. Sensing stays the truth: a
  notification that never comes (a network file system, a watch limit reached, a lost event) costs at
  most one interval, because the loop still polls every source each interval;
- a folder that cannot be watched (missing, the inotify watch limit, no permission) is left to polling
  and reported by :attr:`FolderWatch.unwatched`; nothing here raises out of ``start``;
- ``wake`` is called from the notification thread, with a source key this watch was given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver

log = logging.getLogger(__name__)

#: called with the source key a notification is about (thread-safe on the receiving side)
Wake = Callable[[str], None]


class Watch(Protocol):
    """Notifications a source started for some of its targets; ``close`` stops them (idempotent)."""

    def close(self) -> None: ...


class FolderWatch:
    """One notification thread watching folders, each for the source keys whose data lands in it.

    ``folders`` maps a folder to the keys it wakes; a change to a file directly in one of them (created,
    written, moved in) wakes each of its keys. The folders are watched through ``roots``, each recursively
    (one watch per root, so ten thousand trigger folders under one base folder take one, not ten
    thousand threads); a root inside another is dropped. ``ignore`` names files whose changes wake nothing."""

    def __init__(self, folders: Mapping[Path, frozenset[str]] | Callable[[Path], frozenset[str]], roots: set[Path],
                 wake: Wake, ignore: Callable[[str], bool] = lambda name: False):
        """``folders`` may also be a function from a folder to its keys (for folders made as they come)."""
        self._folders = {} if callable(folders) else {_absolute(f): keys for f, keys in folders.items()}
        self._keys_of: Callable[[Path], frozenset[str]] = (
            folders if callable(folders) else lambda folder: self._folders.get(folder, frozenset()))
        self._roots = _outermost({_absolute(r) for r in roots})
        self._wake, self._ignore = wake, ignore
        self._observer: BaseObserver | None = None
        self._lock = threading.Lock()
        #: the roots left to polling, with why (missing, a watch limit, no notifications here)
        self.unwatched: dict[Path, str] = {}

    @property
    def watching(self) -> bool:
        return self._observer is not None

    def watched_keys(self) -> frozenset[str]:
        """The keys of the folders under a root being watched (the others are polled only)."""
        roots = [r for r in self._roots if r not in self.unwatched] if self.watching else []
        return frozenset(k for folder, keys in self._folders.items()
                         if any(r == folder or r in folder.parents for r in roots) for k in keys)

    def start(self) -> FolderWatch:
        """Start watching every root that can be watched; the rest go to :attr:`unwatched`."""
        try:
            from watchdog.observers import Observer
        except ImportError as exc:  # pragma: no cover - a base dependency; a broken install polls
            self.unwatched = {r: f"no file-system notifications: {exc}" for r in self._roots}
            return self
        observer = Observer()
        observer.daemon = True
        observer.start()  # first: a root scheduled on a running observer fails alone, not the others
        handler = _Handler(self)
        for root in sorted(self._roots):
            problem = _schedule(observer, handler, root)
            if problem is not None:
                self.unwatched[root] = problem
        if len(self.unwatched) == len(self._roots):
            _stop(observer)
        else:
            self._observer = observer
        return self

    def close(self) -> None:
        with self._lock:
            observer, self._observer = self._observer, None
        if observer is not None:
            _stop(observer)

    def changed(self, path: str) -> None:
        """A file changed at ``path``: wake the keys of its folder (unless the file is ignored)."""
        changed = Path(path)
        if self._ignore(changed.name):
            return
        for key in self._keys_of(changed.parent):
            try:
                self._wake(key)
            except Exception as exc:  # noqa: BLE001 - a lost wake-up costs one interval, never the thread
                log.warning("a wake-up for %s was lost (the next poll senses it): %s", key, exc)


def _absolute(path: Path) -> Path:
    return Path(path).absolute()


def _outermost(roots: set[Path]) -> set[Path]:
    """``roots`` without those inside another."""
    return {r for r in roots if not any(o != r and o in r.parents for o in roots)}


def _stop(observer: BaseObserver) -> None:
    observer.stop()
    observer.join(timeout=5)


def _schedule(observer: BaseObserver, handler: _Handler, root: Path) -> str | None:
    """Watch ``root`` and its subfolders; why not, when it cannot be."""
    if not root.is_dir():
        return "the folder does not exist yet"
    from watchdog.events import (
        DirCreatedEvent,
        DirMovedEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileModifiedEvent,
        FileMovedEvent,
    )

    # only what a write makes: the kernel then queues nothing for reads, so sensing ten thousand Delta logs
    # under a watched root does not overflow inotify's queue (each overflow re-walks the whole tree); the
    # folder events keep new subfolders watched
    wanted = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileClosedEvent, DirCreatedEvent, DirMovedEvent]
    try:
        observer.schedule(handler, str(root), recursive=True, event_filter=wanted)  # type: ignore[arg-type]
    except OSError as exc:  # ENOSPC: the inotify watch limit (fs.inotify.max_user_watches); EACCES
        return f"cannot watch it: {exc.strerror or exc}"
    return None


class _Handler:
    """watchdog's event handler: file events only, both ends of a move (a rename into the folder)."""

    def __init__(self, watch: FolderWatch):
        self._watch = watch

    def dispatch(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in _FILE_EVENTS:
            return
        self._watch.changed(_text(event.src_path))
        if event.event_type == "moved":
            self._watch.changed(_text(event.dest_path))


_FILE_EVENTS = frozenset({"created", "modified", "moved", "closed"})


def _text(path: str | bytes) -> str:
    return path.decode() if isinstance(path, bytes) else path
