"""``python -m heartbeat_runner``: the command line (interfaces/cli.py).

Invariant: a stop signal (Ctrl-C, SIGTERM) that comes while the program is still loading is never lost
and never prints a traceback. Loading takes a second or more (PySpark, dbt, gRPC), before any command
can handle a signal, and a KeyboardInterrupt raised inside a library's import can be swallowed there
(one was: the loop then ran on as if never asked to stop). So while loading, a signal is only noted;
once loaded, Python's own handling is back, and a noted signal ends the process before any command
runs: 130 for Ctrl-C (as a command stopped by Ctrl-C ends), by the signal itself for SIGTERM (as a
supervisor expects of a process it stops).
"""

import os
import signal
from types import FrameType


def _load() -> list[int]:
    """Import the command line with stop signals noted, not acted on; the signals noted meanwhile."""
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    before = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        import heartbeat_runner.interfaces.cli  # noqa: F401 - loaded here, run by _run
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return noted


def _run() -> int:
    try:
        noted = _load()
        if signal.SIGTERM in noted:
            os.kill(os.getpid(), signal.SIGTERM)  # Python's default action again: the process ends by it
        if noted:
            return 130
        from heartbeat_runner.interfaces.cli import main

        return main()
    except KeyboardInterrupt:  # Ctrl-C after loading, before a command handles it
        return 130


raise SystemExit(_run())
