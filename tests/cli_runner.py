"""Run ``python -m heartbeat_runner ARGS`` for a test: in this process where that proves the same, else as a process.

A cold ``python -m heartbeat_runner`` costs 1.7-2.6 s before it does anything (imports of dbt, PySpark and the
package), and the suite ran about 500 of them. Most are read-only or one-shot commands whose outcome depends only
on the lakehouse on disk and the environment: those run here through :func:`heartbeat_runner.interfaces.cli.main`,
as dbt-core's ``dbtRunner.invoke`` runs dbt, with the environment, the working folder, stdout, stderr and the root
logger set up as a fresh process would have them, and all put back afterwards.

What still runs as a real process (:func:`needs_process`):

- anything that injects a fault (``HEARTBEAT_CRASH_AT`` kills the process, ``HEARTBEAT_FAIL_AT`` counts per
  process, ``HEARTBEAT_HANG_AT`` never returns), shifts the clock or zone (``TZ``, ``FAKETIME``, ``LD_PRELOAD``), or
  has an import path of its own (``PYTHONPATH``: installed plugins are found through it);
- loops, servers and the demo (``--loop``, ``serve``, ``ui``, ``demo``), which install signal handlers, and
  ``dbt``, which reads its own process state;
- commands on a Spark target (``HEARTBEAT_TARGET`` other than ``local``): a classic session is one per process.
  (``SPARK_REMOTE`` alone is no reason: the embedded engine sets its own, so one the test's engine left in the
  environment changes nothing for a ``local`` command, in a process or here);
- every command of a test marked ``cli_processes`` (start-up state: caches, migrations, lineage's look-back);
- a command run from another thread than the main one (a command borrows the process's environment), or while
  a classic Spark session lives in this process (PySpark keeps one per process). A Spark Connect session of the
  test's own (``hb``'s engine, the shared ``engine``) is set aside while the command runs and put back after
  (tests/connect_sessions.py), so the command opens its own engine as a new process would and the test goes on
  with its own;
- everything, with ``HEARTBEAT_TEST_CLI=process`` (the switch that runs the suite as users run the CLI).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import connect_sessions

#: HEARTBEAT_TEST_CLI=process: every CLI command of the tests runs as its own process
ALL_PROCESSES = os.environ.get("HEARTBEAT_TEST_CLI", "").strip().lower() == "process"
#: set by the ``cli_processes`` marker (tests/conftest.py) for the test running now
_forced = False

_PROCESS_ENV = ("HEARTBEAT_CRASH_AT", "HEARTBEAT_FAIL_AT", "HEARTBEAT_HANG_AT", "FAKETIME", "LD_PRELOAD")
#: read once, when a process starts: a command whose value differs from this process's needs a process of its own
#: (the zone; the import path, where plugins' entry points are found)
_START_UP_ENV = ("TZ", "PYTHONPATH")
_PROCESS_COMMANDS = frozenset({"serve", "ui", "demo", "dbt"})
_PROCESS_FLAGS = frozenset({"--loop", "--target", "--metrics-port", "--wake-port"})


def force_processes(on: bool) -> None:
    """The test that starts now runs every CLI command as a process (``cli_processes`` marker)."""
    global _forced
    _forced = on


def needs_process(args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether ``args`` under ``env`` must run as a process (module docstring: what depends on process state)."""
    if ALL_PROCESSES or _forced or not _process_is_ours():
        return True
    if any(env.get(name) for name in _PROCESS_ENV) or any(env.get(name, os.environ.get(name)) != os.environ.get(name)
                                                          for name in _START_UP_ENV):
        return True
    if env.get("HEARTBEAT_TARGET", "local") not in ("", "local"):
        return True
    return bool(_PROCESS_COMMANDS.intersection(args) or any(a.split("=")[0] in _PROCESS_FLAGS for a in args))


def _process_is_ours() -> bool:
    """Whether a command may borrow this process: only from its main thread (a command swaps the process's
    environment, working folder and logging, which other threads would see), and only while no classic Spark
    session lives in it: PySpark keeps one per process, and a command that found it would run on the test's.
    A Spark Connect session of the test's is no bar: it is set aside while the command runs (before, every
    command of a worker that had used an engine of its own was a cold process)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    classic = sys.modules.get("pyspark.sql.session")
    return classic is None or getattr(classic.SparkSession, "_instantiatedSession", None) is None


#: HEARTBEAT_TEST_CLI_LOG=<file>: each command appends one JSON line there (the test, the command, whether it ran
#: as a process, its seconds), to find the tests whose commands are processes and what they cost
_LOG = os.environ.get("HEARTBEAT_TEST_CLI_LOG", "")


def run_cli(args: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float = 300,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python -m heartbeat_runner *args`` with exactly ``env`` and ``cwd``; its exit code, stdout and stderr."""
    args = [str(a) for a in args]
    began, as_process = time.monotonic(), stdin is not None or needs_process(args, env)
    if as_process:
        done = subprocess.run([sys.executable, "-m", "heartbeat_runner", *args], env=dict(env), capture_output=True,
                              text=True, timeout=timeout, cwd=cwd, input=stdin)
    else:
        done = _in_process(args, env, cwd)
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "command": args[:1],
                                  "process": as_process, "seconds": round(time.monotonic() - began, 2)}) + "\n")
    return done


def _in_process(args: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess:
    from heartbeat_runner.interfaces.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _fresh_process_state(env, cwd), connect_sessions.set_aside(), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse's usage errors, --help, --version
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            if isinstance(exc.code, str):
                err.write(exc.code + "\n")
    return subprocess.CompletedProcess([sys.executable, "-m", "heartbeat_runner", *args], code, out.getvalue(),
                                       err.getvalue())


@contextlib.contextmanager
def _fresh_process_state(env: Mapping[str, str], cwd: Path) -> Iterator[None]:
    """The environment, working folder and root logger a new process would start with; restored afterwards."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_disabled = logging.root.manager.disable
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    root.handlers.clear()  # so the command's logging.basicConfig installs its own handler, as in a new process
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for handler in root.handlers:
            with contextlib.suppress(Exception):
                handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        logging.disable(saved_disabled)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
