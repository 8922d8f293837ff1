"""One local Spark per lakehouse, shared by every process that opens it.

Derby, the ``spark-local`` metastore, admits one JVM per lakehouse. So the first process that
opens ``spark-local`` on a Spark folder takes an exclusive lock on ``<spark dir>/engine.lock``
(``flock``: the operating system releases it when the process ends, however it ends), starts
the JVM, serves Spark Connect on loopback from it and writes where in ``<spark dir>/engine.json``.
Every other process finds the lock taken and connects to that address instead of starting a
JVM of its own: ``status``, ``pause``, ``complete``, ``reset``, ``ui`` and a job's final
``complete`` while a runner or ``serve`` holds the engine.

Invariants: at most one process per Spark folder holds the lock, and only the holder writes
the address file (atomically, removed when it stops); a client trusts an address only while
the lock is held and the holder's pid is alive.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from heartbeat_runner.core.files import replace_whole

LOCK_FILE = "engine.lock"
ADDRESS_FILE = "engine.json"
#: seconds between two "still starting" lines while a JVM starts
NOTICE_EVERY_S = 10.0


@dataclass(frozen=True)
class EngineAddress:
    """Where the process holding a lakehouse's Spark serves Spark Connect."""

    pid: int
    url: str
    mode: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])

    def reachable(self) -> bool:
        """The holder process lives and its port accepts a connection."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False


def try_hold(spark_dir: Path) -> IO[str] | None:
    """The open lock file when this process now holds ``spark_dir``'s engine, None when another does."""
    Path(spark_dir).mkdir(parents=True, exist_ok=True)
    handle = open(Path(spark_dir) / LOCK_FILE, "a+")  # noqa: SIM115 - kept open while the engine is held
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def withdraw(spark_dir: Path) -> None:
    """Remove the published address (the holder is about to stop its engine: nobody joins it now)."""
    (Path(spark_dir) / ADDRESS_FILE).unlink(missing_ok=True)


def publish(spark_dir: Path, address: EngineAddress) -> None:
    """Write the holder's address (whole: readers never see half a file)."""
    replace_whole(Path(spark_dir) / ADDRESS_FILE, json.dumps(asdict(address)))


def read_address(spark_dir: Path) -> EngineAddress | None:
    """The published address, None when there is none (or it is not readable yet)."""
    try:
        data = json.loads((Path(spark_dir) / ADDRESS_FILE).read_text())
        return EngineAddress(pid=int(data["pid"]), url=str(data["url"]), mode=str(data["mode"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def holder_address(spark_dir: Path) -> EngineAddress | None:
    """The address of a live holder of ``spark_dir``'s engine, None when no process holds it."""
    address = read_address(spark_dir)
    return address if address is not None and address.reachable() else None


@contextmanager
def notice(text: str, stream: IO[str] | None = None) -> Iterator[None]:
    """Say that something slow starts, a line every NOTICE_EVERY_S while it lasts, and how long it took."""
    out = stream or sys.stderr
    started = time.monotonic()
    done = threading.Event()
    print(f"{text} ...", file=out, flush=True)

    def tick() -> None:
        while not done.wait(NOTICE_EVERY_S):
            print(f"  ... {time.monotonic() - started:.0f} s", file=out, flush=True)

    thread = threading.Thread(target=tick, name="heartbeat-start-notice", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    print(f"  ready after {time.monotonic() - started:.0f} s", file=out, flush=True)
