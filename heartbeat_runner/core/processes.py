"""Local processes: whether one still runs (lease holders, local job runs), and what a process tree holds in
memory. psutil reads them the same way on Linux and macOS (a developer's Mac measured 0 with /proc reads, so
the memory ceiling did nothing there).

Invariant: every function here answers for a process that is gone (or that this user may not inspect) with
the value for "nothing" (False, 0, an empty list or command) and never raises.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil

#: psutil's errors for a process that ended meanwhile or that this user may not read
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this machine (a zombie, finished but not yet reaped, counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.AccessDenied:
        return True  # it exists, owned by someone else
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def process_rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 when it is gone or may not be read)."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except _GONE:
        return 0


def process_tree(pid: int | None = None, *, prune: Callable[[int], bool] | None = None) -> list[int]:
    """``pid`` (default this process) and all its descendants. A descendant ``prune`` names is left out with
    its own descendants (the walk does not enter it)."""
    root = os.getpid() if pid is None else pid
    found, pending = [], [root]
    while pending:
        current = pending.pop()
        if current != root and prune is not None and prune(current):
            continue
        found.append(current)
        try:
            pending.extend(child.pid for child in psutil.Process(current).children())
        except _GONE:
            continue
    return found


def tree_rss_bytes(pid: int | None = None, *, leave_out: Callable[[int], bool] | None = None) -> int:
    """Resident memory of ``pid`` (default this process) and its descendants together: what the whole
    runner costs, its engine child included. Shared pages count once per process (an upper bound).
    The subtree of a descendant ``leave_out`` names is not counted (work the process started but that
    is not its own, e.g. local job runs)."""
    return sum(process_rss_bytes(p) for p in process_tree(pid, prune=leave_out))


def process_command(pid: int) -> bytes:
    """The command line of ``pid``, NUL-separated as the kernel keeps it (empty when it is gone or may not
    be read)."""
    try:
        args = psutil.Process(pid).cmdline()
    except _GONE:
        return b""
    return b"".join(arg.encode() + b"\0" for arg in args)
