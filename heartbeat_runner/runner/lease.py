"""The tick lease: at most one runner ticks a lakehouse at a time; a dead one blocks nobody for long.

The lease is a small JSON file, ``<lakehouse>/locks/tick.lease``, naming its owner
and when it expires. A runner takes it when it is absent, already its own,
expired (its holder hung or died on another machine), or held by a process of
this machine that no longer exists (it crashed); it renews the lease before
calling the jobs API and removes it after the tick. Every read-check-write of the file happens under an
``flock`` on a sidecar file, so two runners can never both take it.

What it protects: the events a tick appends and the control table it rebuilds
between sensing and triggering; ``seed`` and ``reset`` take it too. Exactly-once
does not rest on it alone (the idempotency token does), but without it two runners
sensing moments apart can consume different sets of events and trigger twice.

This is for one machine (the ``local`` target, or any runner whose lakehouse
directory is on local disk). On Databricks run the heartbeat as a single job with
``max_concurrent_runs = 1``; see docs/guarantees.md.
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
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from heartbeat_runner.core.errors import ConflictError
from heartbeat_runner.core.files import replace_whole
from heartbeat_runner.core.processes import pid_alive

#: Seconds a lease lasts unless renewed (longer than any tick should take).
DEFAULT_TTL_S = 600.0


@dataclass(frozen=True)
class LeaseInfo:
    """Who holds the lease (owner names host and process) and until when (seconds since the epoch)."""

    owner: str
    acquired_at: float
    expires_at: float
    host: str = ""
    pid: int = 0

    def stale(self, now: float) -> bool:
        """Expired, or its holder was a process of this machine that is gone."""
        return now >= self.expires_at or (self.host == socket.gethostname() and not pid_alive(self.pid))

    def describe(self) -> str:
        until = datetime.fromtimestamp(self.expires_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{self.owner} (until {until})"


class LeaseHeld(ConflictError):
    """Another runner holds the lease."""

    def __init__(self, holder: LeaseInfo):
        self.holder = holder
        super().__init__(f"another runner holds the tick lease: {holder.describe()}")


class LeaseLost(ConflictError):
    """The lease expired and another runner took it over: stop before touching the jobs API."""


class Lease:
    """A renewable lease with expiry in one file."""

    def __init__(self, path: Path, *, ttl_s: float = DEFAULT_TTL_S, owner: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.path = path
        self.ttl_s = ttl_s
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.clock = clock

    def holder(self) -> LeaseInfo | None:
        """The current, unexpired holder (possibly us), if any."""
        with self._guard():
            current = self._read()
        return current if current is not None and not current.stale(self.clock()) else None

    def try_acquire(self) -> LeaseInfo | None:
        """Take or renew the lease. Returns None on success, else the holder."""
        with self._guard():
            current = self._read()
            now = self.clock()
            if current is not None and current.owner != self.owner and not current.stale(now):
                return current
            acquired = current.acquired_at if current is not None and current.owner == self.owner else now
            self._write(LeaseInfo(self.owner, acquired, now + self.ttl_s, self.host, self.pid))
            return None

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.25) -> None:
        """Take the lease, waiting up to ``wait_s`` seconds for its holder; raise LeaseHeld."""
        deadline = time.monotonic() + wait_s
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                raise LeaseHeld(holder)
            time.sleep(poll_s)

    def renew(self) -> None:
        """Extend our lease; raise LeaseLost if it is no longer ours (it expired and was taken over)."""
        with self._guard():
            current = self._read()
            if current is None or current.owner != self.owner:
                holder = current.describe() if current is not None else "another runner, since done"
                raise LeaseLost(f"the tick lease expired and was taken over by {holder}; "
                                "stopping before the jobs API (the other runner carries on)")
            self._write(LeaseInfo(self.owner, current.acquired_at, self.clock() + self.ttl_s, self.host, self.pid))

    def release(self) -> None:
        """Give the lease up (only if it is ours)."""
        with self._guard():
            current = self._read()
            if current is not None and current.owner == self.owner:
                self.path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def held(self, wait_s: float = 0.0) -> Iterator[Lease]:
        """Hold the lease for a block (raise LeaseHeld if it cannot be had within ``wait_s``)."""
        self.acquire(wait_s)
        try:
            yield self
        finally:
            self.release()

    # -- the file ---------------------------------------------------------------------------

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
            return LeaseInfo(str(data["owner"]), float(data["acquired_at"]), float(data["expires_at"]),
                             str(data.get("host", "")), int(data.get("pid", 0)))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: written by no runner of ours; take it over

    def _write(self, info: LeaseInfo) -> None:
        replace_whole(self.path, json.dumps(asdict(info)))


def tick_lease(lakehouse_dir: Path, env: dict[str, str] | None = None) -> Lease:
    """The lease of one lakehouse; ``HEARTBEAT_LEASE_TTL`` sets its lifetime in seconds."""
    env = dict(os.environ if env is None else env)
    return Lease(lakehouse_dir / "locks" / "tick.lease", ttl_s=float(env.get("HEARTBEAT_LEASE_TTL", DEFAULT_TTL_S)))
