"""``python -m heartbeat_runner``: the command line, through interfaces/entry.py (which says how a stop signal
that comes while the program loads is handled)."""

from heartbeat_runner.interfaces.entry import run

raise SystemExit(run())
