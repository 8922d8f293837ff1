"""Runs one local job command and records its exit code (``python -m ... RUN_DIR -- CMD...``).

Started detached by the local backend. It first claims the run (``launched``, see :func:`claim`):
a second launcher of the same run exits without running anything. It writes ``result.json`` atomically when the
command ends (exit code, and when the command itself started and ended: the run's own
duration), so a later tick can tell success from failure even if the runner that
started it is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from heartbeat_runner.core.files import create_exclusively, replace_whole


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m heartbeat_runner.jobs.local_launcher RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    command = argv[2:]
    if not claim(run_dir):
        return 0  # another launcher of this run started it: the command runs at most once
    (run_dir / "pid").write_text(str(os.getpid()))  # what older versions of the backend read
    started_at = datetime.now(timezone.utc).isoformat()
    try:
        code = subprocess.call(command)
    except OSError as exc:
        print(f"heartbeat: cannot run {command!r}: {exc}", flush=True)
        code = 127
    result = {"exit_code": code, "started_at": started_at, "ended_at": datetime.now(timezone.utc).isoformat()}
    replace_whole(run_dir / "result.json", json.dumps(result))
    return code


def claim(run_dir: Path) -> bool:
    """Create ``launched`` holding this process's pid, exclusively and whole: True for the one launcher
    that did, False when it already exists."""
    return create_exclusively(run_dir / "launched", str(os.getpid()))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
