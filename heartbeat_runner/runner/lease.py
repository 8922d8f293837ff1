"""The tick lease: at most one runner ticks a lakehouse at a time, on any machine; a dead one blocks nobody for long.

The lease lives in the lakehouse itself: a row of Heartbeat's table ``heartbeat_lease`` (one per lease
name, ``tick``) with its owner (host:pid:random), host, pid, when it was taken and when it expires. So
runners on two machines (two clusters, a laptop through Databricks Connect, a re-deploy running old and new
side by side) exclude each other as two processes of one machine do. One engine keeps it elsewhere: local
Apache Spark, whose tables are on this machine and whose commits are slow, keeps the same record in a file
beside them (``<lakehouse>/locks/tick.lease``, under an ``flock``: :class:`FileLeaseRecords`;
``TableOps.lease_in_files``). Both keep one contract (:class:`LeaseRecords`; one test runs it against each).

Invariants:

- The row changes only by a compare-and-swap (the table's MERGE, ``TableStore.swap_lease``; the file's
  rewrite under its lock): it writes only when the row still has the owner and expiry the writer read.
  Two runners that read the same row and both try to take it make two Delta commits on one file; Delta's
  optimistic concurrency lets one through, the other's commit conflicts and, run again, no longer matches
  (in the file, the lock orders them and the second no longer matches). Every change is read back, so a
  runner holds the lease only when the committed row names it.
- A runner takes the lease when the row is free, already its own, expired (its holder hung or died on
  another machine), or held by a process of this machine that no longer exists (it crashed: taken at once).
- Renewing writes only when less than half the lifetime is left; while the holder keeps it, taking it
  again is a read, not a commit. So a loop that keeps the lease from tick to tick adds a commit about
  every ``ttl / 2`` seconds, not one per tick.
- A runner that waits for the lease writes its name into the row (``wanted_by``); a loop lets go between
  two ticks when someone asked (:meth:`Lease.yield_if_wanted`), so ``seed`` and ``reset`` get in as they
  did when the loop gave the lease up after every tick. A one-shot tick, ``seed`` and ``reset`` release it.
- A loop that let go leaves the free lease to the runner it let go for, up to ``HANDOFF_S`` seconds of its own
  monotonic clock (:class:`Handoff`): a loop whose ticks outlast its interval would otherwise take it back
  before the waiter's next look, tick after tick, and the waiter would wait forever. No clock of another
  machine is compared: the handoff ends when the row names another holder or the time is up.

What it protects: the events a tick appends and the control table it rebuilds between sensing and
triggering; ``seed``, ``reset``, ``maintain`` and ``rebuild`` take it too. Exactly-once does not rest on it
alone (the idempotency token does), but without it two runners sensing moments apart can consume
different sets of events and trigger twice. See docs/guarantees.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from heartbeat_runner.core.errors import ConflictError
from heartbeat_runner.core.files import replace_whole
from heartbeat_runner.core.metrics import metrics
from heartbeat_runner.lakehouse.store import FREE_LEASE, LeaseInfo, TableStore

__all__ = ["DEFAULT_TTL_S", "TICK_LEASE", "FileLeaseRecords", "Handoff", "Lease", "LeaseHeld", "LeaseInfo",
           "LeaseLost", "TableLeaseRecords", "tick_lease"]

#: Seconds a lease lasts unless renewed (longer than any tick should take).
DEFAULT_TTL_S = 600.0
#: The name of the tick lease's row.
TICK_LEASE = "tick"
#: How often a claim whose row changed under it reads and tries again before reporting the holder.
CLAIM_ATTEMPTS = 3
#: Seconds after which a waiting runner asks again (a new ``wanted_at``, so a new commit): a holder that missed
#: the ask (it read the row before the ask reached its engine and keeps that row while the table's version
#: stays; or a third runner took the lease during a handoff) sees it at its next tick. Compared on the waiter's
#: own clock only. (A holder re-taking the lease before the waiter's next look is what the handoff prevents.)
ASK_AGAIN_S = 5.0
#: Seconds a loop that let the lease go leaves it free for the runner it let go for (a waiter polls every
#: 0.25 s; a loaded machine's engine can take seconds to read and commit). A waiter that gave up costs one
#: handoff: the free row no longer names it, so the loop is not asked again.
HANDOFF_S = 10.0


@dataclass(frozen=True)
class Handoff:
    """The lease given up to ``waiter`` between two ticks: this runner leaves the free row alone until
    ``until`` (its own ``time.monotonic()``)."""

    waiter: str
    until: float

    def keeps(self, row: LeaseInfo, now: float) -> bool:
        """Whether the free ``row`` is still kept for the waiter at ``now`` (False once anyone holds it)."""
        return not row.owner and now < self.until


class LeaseHeld(ConflictError):
    """Another runner holds the lease (or it is free, left to the runner named ``wanted_by`` by a handoff)."""

    def __init__(self, holder: LeaseInfo):
        self.holder = holder
        super().__init__(f"another runner holds the tick lease: {holder.describe()}" if holder.owner else
                         f"the tick lease is left free for {holder.wanted_by}, which asked for it")


class LeaseLost(ConflictError):
    """The lease expired and another runner took it over: stop before touching the jobs API."""


class LeaseRecords(Protocol):
    """Where a lease's row is kept: read it, and compare-and-swap it (write ``new`` only if the row still
    has ``seen``'s owner and expiry)."""

    def read(self) -> LeaseInfo | None: ...

    def swap(self, seen: LeaseInfo, new: LeaseInfo) -> None: ...


class TableLeaseRecords:
    """The row of ``heartbeat_lease`` named ``name``, in the lakehouse ``store`` writes to (every machine sees it)."""

    def __init__(self, store: TableStore, name: str):
        self.store, self.name = store, name
        self._ready = False
        #: the row as read at a table version, where the version is a file listing on this machine: while the
        #: version stays, the row is the same and the engine is not asked (a loop's idle tick leaves a parked
        #: embedded engine parked)
        self._known: tuple[int, LeaseInfo] | None = None

    def read(self) -> LeaseInfo | None:
        if not self._ready:
            self.store.ensure_lease(self.name)
            self._ready = True
        version = self.store.lease_version()  # before the row: a commit in between shows as a newer version
        if version is not None and self._known is not None and self._known[0] == version:
            return self._known[1]
        current = self.store.lease_row(self.name)
        if current is None:  # someone deleted the row: put a free one back
            self.store.ensure_lease(self.name)
            current = self.store.lease_row(self.name)
        self._known = (version, current) if version is not None and current is not None else None
        return current

    def swap(self, seen: LeaseInfo, new: LeaseInfo) -> None:
        self.store.swap_lease(self.name, seen, new)


class FileLeaseRecords:
    """A JSON file on this machine, read and swapped under an ``flock`` on a sidecar file: for engines whose
    tables are on this machine and whose commits are slow (``TableOps.lease_in_files``: local Apache Spark)."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> LeaseInfo | None:
        with self._guard():
            return self._read()

    def swap(self, seen: LeaseInfo, new: LeaseInfo) -> None:
        with self._guard():
            current = self._read() or FREE_LEASE
            if (current.owner, current.expires_at) == (seen.owner, seen.expires_at):
                replace_whole(self.path, json.dumps(asdict(new)))

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".guard"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> LeaseInfo | None:
        try:
            data = json.loads(self.path.read_text())
            return LeaseInfo(**{key: data[key] for key in asdict(FREE_LEASE) if key in data})
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: written by no runner of ours; taken over as free


class Lease:
    """A renewable lease with expiry: one row of the lakehouse's ``heartbeat_lease`` table (``where`` a
    store), or of a file on this machine (``where`` a path)."""

    def __init__(self, where: TableStore | Path, *, name: str = TICK_LEASE, ttl_s: float = DEFAULT_TTL_S,
                 owner: str | None = None, clock: Callable[[], float] = time.time, handoff_s: float = HANDOFF_S):
        self.records: LeaseRecords = (FileLeaseRecords(where) if isinstance(where, Path)
                                      else TableLeaseRecords(where, name))
        self.name = name
        self.ttl_s = ttl_s
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.clock = clock
        self.handoff_s = handoff_s
        #: set while the free lease is left to the runner this one let go for (yield_if_wanted)
        self._handoff: Handoff | None = None

    def holder(self) -> LeaseInfo | None:
        """The current, unexpired holder (possibly us), if any."""
        current = self._read()
        return None if current.stale(self.clock()) else current

    def try_acquire(self) -> LeaseInfo | None:
        """Take or renew the lease. Returns None on success, else the holder.

        No commit when it is ours with more than half its lifetime left. While a handoff keeps the free row for
        the runner this one let go for, the free row naming that runner (``wanted_by``) is the holder."""
        for _ in range(CLAIM_ATTEMPTS):
            current = self._read()
            if self._handoff is not None:
                if self._handoff.keeps(current, time.monotonic()):
                    return self._holding(False, replace(current, wanted_by=self._handoff.waiter))
                self._handoff = None
            now = self.clock()
            if current.owner == self.owner and current.expires_at - now > self.ttl_s / 2:
                return self._holding(True)
            if current.owner != self.owner and not current.stale(now):
                return self._holding(False, current)
            ours = current.owner == self.owner
            self.records.swap(current, LeaseInfo(
                owner=self.owner, acquired_at=current.acquired_at if ours else now, expires_at=now + self.ttl_s,
                host=self.host, pid=self.pid,
                wanted_by="" if current.wanted_by == self.owner else current.wanted_by,
                wanted_at=0.0 if current.wanted_by == self.owner else current.wanted_at))
            after = self._read()
            if after.owner == self.owner:
                return self._holding(True)
            if after.owner and not after.stale(self.clock()):
                return self._holding(False, after)  # another runner's commit went first
        return self._holding(False, after)

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.25, stop: Callable[[], bool] = lambda: False,
                waiting: Callable[[LeaseInfo], None] = lambda holder: None) -> None:
        """Take the lease, waiting up to ``wait_s`` seconds for its holder; raise LeaseHeld.

        While waiting, the row says so (``wanted_by``, asked again every ``ASK_AGAIN_S``): a loop holding it
        lets go after its tick, and leaves it to us (Handoff). ``waiting(holder)`` is called once, when the wait
        begins (never when the lease is had at once or not waited for), so the process can say what it waits
        for. The wait ends early, as LeaseHeld, once ``stop()`` says the process was asked to stop (a loop's
        SIGINT or SIGTERM): a runner waiting up to ``--wait-lease`` for another's long tick still stops at once."""
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() >= deadline or stop():
                raise LeaseHeld(holder)
            if not said:
                waiting(holder)
                said = True
            if holder.owner and (holder.wanted_by != self.owner or self.clock() - holder.wanted_at >= ASK_AGAIN_S):
                self._ask(holder)  # (a free row kept for another by a handoff has nobody to ask)
            time.sleep(poll_s)

    def renew(self) -> None:
        """Keep our lease (a commit only when less than half its lifetime is left); raise LeaseLost if it
        is no longer ours (it expired and was taken over)."""
        current = self._read()
        if current.owner != self.owner:
            self._holding(False)
            holder = current.describe() if current.owner else "another runner, since done"
            raise LeaseLost(f"the tick lease expired and was taken over by {holder}; "
                            "stopping before the jobs API (the other runner carries on)")
        if self.try_acquire() is not None:
            raise LeaseLost("the tick lease was taken over while being renewed; stopping before the jobs API")

    def release(self) -> None:
        """Give the lease up (only if it is ours)."""
        current = self._read()
        if current.owner == self.owner:
            self.records.swap(current, FREE_LEASE)
            self._holding(False)

    def yield_if_wanted(self) -> bool:
        """Between two ticks of a loop: give the lease up if another runner waits for it (True), and leave it
        to that runner for up to ``handoff_s`` seconds; else keep it without a commit (False)."""
        current = self._read()
        wanted = current.wanted_by not in ("", self.owner) and self.clock() - current.wanted_at < self.ttl_s
        if current.owner == self.owner and wanted:
            self.records.swap(current, FREE_LEASE)
            self._holding(False)
            self._handoff = Handoff(current.wanted_by, time.monotonic() + self.handoff_s)
            return True
        return False

    @contextlib.contextmanager
    def held(self, wait_s: float = 0.0) -> Iterator[Lease]:
        """Hold the lease for a block (raise LeaseHeld if it cannot be had within ``wait_s``), then release it."""
        self.acquire(wait_s)
        try:
            yield self
        finally:
            self.release()

    @contextlib.contextmanager
    def ticking(self, wait_s: float = 0.0, stop: Callable[[], bool] = lambda: False,
                waiting: Callable[[LeaseInfo], None] = lambda holder: None) -> Iterator[Lease]:
        """One tick of a loop: hold the lease for the block and keep it after, unless someone waits for it
        (``stop`` and ``waiting``: as :meth:`acquire`'s)."""
        self.acquire(wait_s, stop=stop, waiting=waiting)
        try:
            yield self
        finally:
            self.yield_if_wanted()

    # -- the row ----------------------------------------------------------------------------

    def _holding(self, held: bool, holder: LeaseInfo | None = None) -> LeaseInfo | None:
        """Note in the metrics whether this process holds the tick lease now; ``holder`` (None when held)."""
        if self.name == TICK_LEASE:
            metrics().lease_held.set(1 if held else 0)
        return None if held else holder

    def _read(self) -> LeaseInfo:
        return self.records.read() or FREE_LEASE

    def _ask(self, holder: LeaseInfo) -> None:
        """Tell the holder we wait (the holder's renewals compare owner and expiry only, so they go on)."""
        self.records.swap(holder, replace(holder, wanted_by=self.owner, wanted_at=self.clock()))


def tick_lease(store: TableStore, ttl_s: float | None = None) -> Lease:
    """The tick lease of the lakehouse ``store`` writes to: its row in ``heartbeat_lease``, or the file
    ``<lakehouse>/locks/tick.lease`` where the engine says so (``TableOps.lease_in_files``).
    Its lifetime is ``ttl_s``, else the engine's settings' ``lease_ttl_s`` (``HEARTBEAT_LEASE_TTL``)."""
    engine = store.engine
    ttl_s = engine.settings.lease_ttl_s if ttl_s is None else ttl_s
    if engine.ops.lease_in_files:
        return Lease(engine.settings.lakehouse_dir / "locks" / "tick.lease", ttl_s=ttl_s)
    return Lease(store, ttl_s=ttl_s)
