"""Local processes: whether one still runs (lease holders, local job runs), and what a process tree holds in memory."""

from __future__ import annotations

import os
from collections.abc import Callable


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this machine (a zombie, finished but not yet reaped, counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return True


def process_rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 when it is gone or /proc is not there, e.g. not Linux)."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def process_tree(pid: int | None = None, *, prune: Callable[[int], bool] | None = None) -> list[int]:
    """``pid`` (default this process) and all its descendants, read from /proc (only ``pid`` elsewhere).
    A descendant ``prune`` names is left out with its own descendants (the walk does not enter it)."""
    root = os.getpid() if pid is None else pid
    found, pending = [], [root]
    while pending:
        current = pending.pop()
        if current != root and prune is not None and prune(current):
            continue
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    pending.extend(int(child) for child in handle.read().split())
            except (OSError, ValueError):
                continue
    return found


def tree_rss_bytes(pid: int | None = None, *, leave_out: Callable[[int], bool] | None = None) -> int:
    """Resident memory of ``pid`` (default this process) and its descendants together: what the whole
    runner costs, its engine child included. Shared pages count once per process (an upper bound).
    The subtree of a descendant ``leave_out`` names is not counted (work the process started but that
    is not its own, e.g. local job runs)."""
    return sum(process_rss_bytes(p) for p in process_tree(pid, prune=leave_out))


def process_command(pid: int) -> bytes:
    """The command line of ``pid``, NUL-separated (empty when it is gone or /proc is not there)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
