"""Whether a local process is still running (lease holders, local job runs)."""

from __future__ import annotations

import os


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
