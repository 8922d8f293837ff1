"""The program's entry points: ``python -m heartbeat_runner`` (``__main__``) and the ``heartbeat`` console
script, which is also the Databricks wheel task's entry point. This module stays light (the standard library
only): pip's script wrapper and the wheel task import it before anything else, and it loads the command line
(interfaces/cli.py: PySpark, dbt, gRPC, a second or more) itself.

Invariants:

- A stop signal (Ctrl-C, SIGTERM) that comes while the command line loads is never lost and never prints a
  traceback. A KeyboardInterrupt raised inside a library's import can be swallowed there (one was: the loop then
  ran on as if never asked to stop), so while loading a signal is only noted (core/early_stop.py). A noted
  signal ends the process before any command runs: 130 after Ctrl-C (as a command stopped by Ctrl-C ends), by
  SIGTERM itself after SIGTERM (what a supervisor expects of a process it stops).
- After loading, SIGTERM is Python's again (it ends the process), and Ctrl-C raises KeyboardInterrupt as in
  Python (130) but is noted first: one that a finalizer or a library swallows before a long-running command
  handles signals is adopted by that command (``StopRequest.install``), which then stops (and a finalizer's
  swallowed KeyboardInterrupt is not printed). CI saw a loop Ctrl-C'd at its start still ticking two minutes
  later.
- For the script, a failed command is an exception, never a returned value. A Databricks ``python_wheel_task``
  calls the entry point and ignores what it returns: only an exception or a non-zero ``SystemExit`` fails the
  task (and fires its failure notifications). Success returns normally, so a runtime that treats any
  ``SystemExit`` as a failure still sees a good run as one. In-process callers use ``cli.main(argv)``, which
  returns the code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from heartbeat_runner.core import early_stop


def run() -> int:
    """Load the command line, run the command of ``sys.argv``; its exit code."""
    sys.unraisablehook = early_stop.unraisable  # a Ctrl-C a finalizer swallowed is noted, not printed
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


def script() -> None:
    """The ``heartbeat`` console script and wheel-task entry point: :func:`run`, ending with ``SystemExit(code)``
    when the command failed."""
    code = run()
    if code:
        raise SystemExit(code)


def _load() -> tuple[int, ...]:
    """Import the command line with stop signals noted, not acted on (on the main thread: only there can a
    handler be set, and only there does Python deliver signals); the signals noted meanwhile. After it, SIGTERM
    has the handler it had and Ctrl-C is noted, then raised (module invariants)."""
    if threading.current_thread() is not threading.main_thread():
        import heartbeat_runner.interfaces.cli  # noqa: F401 - loaded here, run by run()

        return ()
    before = {sig: signal.signal(sig, early_stop.note) for sig in early_stop.STOP_SIGNALS}
    try:
        import heartbeat_runner.interfaces.cli  # noqa: F401 - loaded here, run by run()
    finally:
        signal.signal(signal.SIGTERM, before[signal.SIGTERM])
        interrupts = before[signal.SIGINT] is signal.default_int_handler
        signal.signal(signal.SIGINT, early_stop.note_then_interrupt if interrupts else before[signal.SIGINT])
    return early_stop.noted()
