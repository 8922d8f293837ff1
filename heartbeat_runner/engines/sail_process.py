"""The embedded engine (Sail) in a child process that the runner can recycle.

Sail 0.7.2 keeps ~50-60 KiB of native memory for every SQL text it parses (view definitions
included, re-parsed at each read) and frees none of it, not even when the server is stopped
inside the same process (docs/sail_memory_leak.md). In its own process the growth is contained:
stopping that process gives it all back. The runner talks to it over Spark Connect on loopback.

Invariants:

- the child binds 127.0.0.1 only and reports its port on its stdout (one line) once it listens;
- the child dies with its parent: it reads its stdin (a pipe the parent holds, closed on exit
  *and* on ``exec``) until end-of-file, and asks the kernel for SIGKILL when the parent dies
  (``PR_SET_PDEATHSIG``, Linux); a child whose parent is already gone exits at once;
- only the runner stops the child: it runs in its own session (so Ctrl-C in a terminal, ``timeout`` or a
  ``kill`` of the runner's process group never reaches it) and ignores SIGINT and SIGTERM (so a signal to the
  whole control group, systemd's ``KillMode=control-group``, leaves it serving): the runner finishes its tick
  and closes the engine itself, and the parent-death signal and the closed pipe still end the child when the
  runner dies (measured before: the engine died with the group and the runner's shutdown waited on it for the
  whole 30 s grace, then dumped its stacks with exit 1);
- the kernel sends that signal when the parent *thread* that spawned the child ends, not the
  process: a child is spawned on the main thread or on one spawner thread that lives as long as
  the process, never on a short-lived thread (a ``ui`` request recycling the engine on its own
  thread killed the new server the moment the request ended);
- the child's allocator (mimalloc, inside Sail) commits its arenas' pages as they are used, not
  up front, and the child keeps an idle session for a year, not Sail's 15 minutes (both in
  :data:`CHILD_ENVIRONMENT`), unless the user's environment says otherwise.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.processes import tree_rss_bytes

#: seconds the child may take to listen (importing pysail and binding takes ~0.1-0.5 s)
START_TIMEOUT_S = 60.0
#: seconds a stopping child gets to exit after its pipe closes, then it is killed
STOP_TIMEOUT_S = 5.0
_PR_SET_PDEATHSIG = 1
#: the child's environment defaults. Sail's allocator commits a whole arena up front by default: a
#: fresh engine held ~164 MiB after its first queries, ~108 MiB with this (benchmarks/README.md), so
#: the same recycling bound is reached later and a lower bound serves. RUST_LOG keeps Sail's own
#: logging to errors. Sail drops a Spark Connect session after 15 idle minutes by default; the runner's
#: one session must live as long as the child does (the runner parks or recycles the child itself, and a
#: status page or ``serve`` left unvisited overnight still answers), so the timeout is a year.
SESSION_TIMEOUT_S = 365 * 24 * 3600
CHILD_ENVIRONMENT = {"RUST_LOG": "error", "MIMALLOC_ARENA_EAGER_COMMIT": "0",
                     "SAIL_SPARK__SESSION_TIMEOUT_SECS": str(SESSION_TIMEOUT_S)}


class EngineStartError(HeartbeatError):
    """The embedded engine's process did not start listening."""


@dataclass
class SailProcess:
    """A running Sail server process (Spark Connect on 127.0.0.1:``port``), owned by this process."""

    process: subprocess.Popen
    port: int
    #: seconds from spawning the process to its first answer (part of a recycle's cost)
    start_s: float

    @classmethod
    def start(cls, port: int = 0, *, timeout_s: float = START_TIMEOUT_S,
              meanwhile: Callable[[], object] | None = None) -> SailProcess:
        """Spawn the server (``port`` 0: any free port) and wait until it listens.

        ``meanwhile`` runs in this process while the child starts (a cold start overlaps the client's
        own imports with the server's); if it raises, the child is stopped and the error goes on.
        """
        began = time.monotonic()
        env = {**CHILD_ENVIRONMENT, **os.environ}
        process = _spawn([sys.executable, "-m", "heartbeat_runner.engines.sail_process", str(port), str(os.getpid())],
                         env)
        try:
            if meanwhile is not None:
                meanwhile()
            bound = _read_port(process, timeout_s)
        except BaseException:
            _stop(process)
            raise
        return cls(process=process, port=bound, start_s=time.monotonic() - began)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def rss_bytes(self) -> int:
        """Resident memory of the server process (0 once it has ended)."""
        return tree_rss_bytes(self.pid) if self.running else 0

    def stop(self) -> None:
        """End the server: close its pipe, wait a moment, kill it if it is still there (idempotent)."""
        _stop(self.process)


#: the one long-lived thread that spawns children for other threads (see the module's invariants)
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heartbeat-engine-spawner")


def _spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start the child from a thread that lives as long as the process (its death signal follows
    the spawning thread)."""
    def popen() -> subprocess.Popen:
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # noqa: S603 - our module
                                env=env, close_fds=True, start_new_session=True)

    if threading.current_thread() is threading.main_thread():
        return popen()
    return _SPAWNER.submit(popen).result()


def _read_port(process: subprocess.Popen, timeout_s: float) -> int:
    """The port line the child prints once it listens."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    line = process.stdout.readline().decode("ascii", "replace").strip() if ready else ""
    if not line.isdigit():
        ended = process.poll()
        why = f"it exited with code {ended}" if ended is not None else f"no port after {timeout_s:g} s"
        raise EngineStartError(f"the embedded engine (Sail) did not start: {why}; its errors are above")
    return int(line)


def _stop(process: subprocess.Popen) -> None:
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- the child --------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent ends (Linux); exit now if the parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def serve_until_parent_leaves(port: int, parent_pid: int) -> None:
    """Run Sail on 127.0.0.1:``port``, print the port it bound, and serve until stdin closes."""
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.SIG_IGN)  # a stop signal is the runner's: it stops us after its tick
    _die_with_parent(parent_pid)
    from pysail.spark import SparkConnectServer

    server = SparkConnectServer("127.0.0.1", port)
    server.start(background=True)
    sys.stdout.write(f"{server.listening_address[1]}\n")
    sys.stdout.flush()
    while sys.stdin.buffer.read(65536):
        pass
    os._exit(0)  # the server's threads need no orderly stop: the process and its memory go


if __name__ == "__main__":  # pragma: no cover - runs in the child process
    serve_until_parent_leaves(int(sys.argv[1]), int(sys.argv[2]))
