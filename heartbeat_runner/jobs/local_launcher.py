"""Runs one local job command and records its exit code (``python -m ... RUN_DIR -- CMD...``).

Started detached by the local backend; writes ``result.json`` atomically when the
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


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m heartbeat_runner.jobs.local_launcher RUN_DIR -- COMMAND...", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    command = argv[2:]
    (run_dir / "pid").write_text(str(os.getpid()))  # a runner killed before it recorded the pid finds it here
    started_at = datetime.now(timezone.utc).isoformat()
    try:
        code = subprocess.call(command)
    except OSError as exc:
        print(f"heartbeat: cannot run {command!r}: {exc}", flush=True)
        code = 127
    result = {"exit_code": code, "started_at": started_at, "ended_at": datetime.now(timezone.utc).isoformat()}
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, run_dir / "result.json")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
