"""Wake-ups: ``run --loop`` senses a source as soon as it says it changed, not at the next poll.

Polling stays the truth. A wake-up only starts a tick early, limited to the sources it names (what is
due besides, reconciliation, retries and sequences, runs in every tick anyway), under the same lease
and exactly-once rules as any tick. The loop still polls every source each interval, so a lost or
never-sent notification costs at most one interval, and a spurious one costs one cheap sense.

Invariants:

- :class:`WakeSignal` is the one meeting point: any thread (file-system notifications, a consumer's
  long poll, ``POST /wake``) calls :meth:`WakeSignal.wake`; the loop's thread alone waits and takes.
  Wake-ups that arrive while a tick runs, or in a burst, coalesce into one :class:`TickScope`, taken by
  the next tick;
- :class:`SourceWatches` (re)starts the sources' notifications (``Source.watch``) from the loop's
  thread, only when the set of due sources changed, and closes every one it started; the jobs backend's
  notifications of ended runs (``JobsBackend.watch_runs``) start a tick that senses nothing but records
  the ends;
- nothing here records anything or raises into the loop: a source whose notifications cannot start
  is polled, and said so once in the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from heartbeat_runner.core.faults import FaultPoint, fail_point
from heartbeat_runner.core.records import SensingTarget
from heartbeat_runner.core.stopping import POLL_S, StopRequest
from heartbeat_runner.jobs.base import JobsBackend
from heartbeat_runner.sensing.sources.base import SenseContext
from heartbeat_runner.sensing.sources.registry import source_for
from heartbeat_runner.sensing.watch import FolderWatch, Watch

log = logging.getLogger(__name__)

#: folders that could not be watched (not made yet, a watch limit) are tried again after this many polls
RETRY_UNWATCHED_POLLS = 10


@dataclass(frozen=True)
class TickScope:
    """Which due sources a tick senses: every one (a poll), or those a wake-up named."""

    #: the source keys to sense; None: every due source
    source_keys: frozenset[str] | None = None

    @property
    def polls(self) -> bool:
        return self.source_keys is None

    def describe(self) -> str:
        return "poll" if self.source_keys is None else f"woken by {len(self.source_keys)} source(s)"


#: A tick that senses every due source.
POLL = TickScope()


class WakeSignal:
    """Wake-ups from any thread, coalesced until the loop takes them."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._keys: set[str] = set()
        self._everything = False
        #: a run may have ended: a tick is due even when no source is named
        self._runs = False

    def wake(self, source_key: str | None = None) -> None:
        """Ask for a tick now: sensing ``source_key``, or every source (None). Thread-safe, never blocks
        for long. HEARTBEAT_FAIL_AT=lose_wake_up loses it (tests: the next poll must catch the change)."""
        fail_point(FaultPoint.LOSE_WAKE_UP)
        with self._changed:
            if source_key is None:
                self._everything = True
            else:
                self._keys.add(source_key)
            self._changed.notify_all()

    def wake_all(self, source_keys: Iterable[str]) -> None:
        for key in source_keys:
            self.wake(key)

    def run_ended(self) -> None:
        """A run a jobs backend started may have ended: tick now (sensing only what else was named), so its
        end is recorded at once. Thread-safe."""
        with self._changed:
            self._runs = True
            self._changed.notify_all()

    def _pending(self) -> bool:
        return self._everything or self._runs or bool(self._keys)

    def take(self) -> TickScope | None:
        """The wake-ups so far as one scope (None: none), and forget them."""
        with self._changed:
            if not self._pending():
                return None
            scope = POLL if self._everything else TickScope(frozenset(self._keys))
            self._keys, self._everything, self._runs = set(), False, False
            return scope

    def wait(self, until: float, stop: StopRequest) -> TickScope | None:
        """Block until a wake-up (its scope), ``stop``, or the monotonic time ``until`` (None for both)."""
        while not stop.is_set():
            scope = self.take()
            if scope is not None:
                return scope
            left = until - time.monotonic()
            if left <= 0:
                return None
            with self._changed:
                if not self._pending():
                    self._changed.wait(min(POLL_S, left))  # the stop flag is polled (core/stopping.py)
        return None


class SourceWatches:
    """The notifications of every due source, by source type, kept in step with the due sources."""

    def __init__(self, ctx: SenseContext, signal: WakeSignal):
        self._ctx, self._signal = ctx, signal
        self._keys: frozenset[str] = frozenset()
        #: sensor_id and source_key -> the source keys it names (replaced whole: read from other threads)
        self._names: dict[str, frozenset[str]] = {}
        self._watches: list[Watch] = []
        #: polls until folders that could not be watched are tried again (0: not needed)
        self._retry_in = 0

    def follow(self, targets: Sequence[SensingTarget]) -> None:
        """After a poll: restart the notifications when the due sources changed (or a folder that could not
        be watched may exist now)."""
        keys = frozenset(t.source_key for t in targets)
        if keys == self._keys and self._retry_in != 1:
            self._retry_in = max(0, self._retry_in - 1)
            return
        self.close()
        self._keys, self._retry_in = keys, 0
        self._names = _names_of(targets)
        by_type: dict[str, list[SensingTarget]] = {}
        for target in targets:
            by_type.setdefault(target.sensor_source, []).append(target)
        watched = 0
        for sensor_source, group in sorted(by_type.items()):
            watch = self._start(sensor_source, group)
            if watch is None:
                continue
            self._watches.append(watch)
            if not isinstance(watch, FolderWatch):
                watched += len(group)
                continue
            watched += len(watch.watched_keys())
            if watch.unwatched:
                self._retry_in = RETRY_UNWATCHED_POLLS
                log.info("wake-ups: %d %s folder(s) are polled only, tried again in %d polls (%s)",
                         len(watch.unwatched), sensor_source, RETRY_UNWATCHED_POLLS,
                         "; ".join(sorted(set(watch.unwatched.values()))))
        log.info("wake-ups: %d of %d source(s) wake the loop; the others are polled", watched, len(keys))

    def runs_of(self, backend: JobsBackend) -> Watch | None:
        """The backend's notifications of ended runs (``JobsBackend.watch_runs``), or None; never raises."""
        try:
            return backend.watch_runs(self._signal.run_ended)
        except Exception as exc:  # noqa: BLE001 - an optimisation: runs are reconciled at each poll anyway
            log.warning("wake-ups: the ends of %s runs are seen at the next poll: %s", backend.name, exc)
            return None

    def names(self, name: str) -> frozenset[str]:
        """The due sources ``name`` (a sensor_id or a source key) stands for; empty when none. Thread-safe."""
        return self._names.get(name, frozenset())

    def _start(self, sensor_source: str, targets: list[SensingTarget]) -> Watch | None:
        try:
            return source_for(sensor_source).watch(targets, self._ctx, self._signal.wake)
        except Exception as exc:  # noqa: BLE001 - a source's notifications are an optimisation: poll it
            log.warning("wake-ups: %s sources are polled only: %s", sensor_source, exc)
            return None

    def close(self) -> None:
        watches, self._watches = self._watches, []
        for watch in watches:
            try:
                watch.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.warning("wake-ups: closing a watch failed: %s", exc)


def _names_of(targets: Sequence[SensingTarget]) -> dict[str, frozenset[str]]:
    """Each target's key under its source key and under its sensor_id (several sources may share one)."""
    found: dict[str, set[str]] = {}
    for target in targets:
        found.setdefault(target.source_key, set()).add(target.source_key)
        found.setdefault(target.sensor_id, set()).add(target.source_key)
    return {name: frozenset(keys) for name, keys in found.items()}
