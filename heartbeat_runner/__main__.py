"""``python -m heartbeat_runner``: the command line (interfaces/cli.py).

Invariant: Ctrl-C never prints a traceback, even while the program is still loading (its imports take
a second or more, before any command can install its own handling): the process then ends with 130,
as a command stopped by Ctrl-C does.
"""


def _run() -> int:
    try:
        from heartbeat_runner.interfaces.cli import main

        return main()
    except KeyboardInterrupt:
        return 130


raise SystemExit(_run())
