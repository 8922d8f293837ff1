"""The process's current Spark Connect sessions, as the tests must leave them.

PySpark finds "the" session of a process through two slots: the default session (``builder.getOrCreate()``, which
dbt-spark calls) and the calling thread's active one. Every column function also asks the active session's conf
once per process (``pyspark.errors.utils.is_debugging_enabled``). So a session left in a slot after its server
ended is not harmless: the next column function of any later test in the same worker retries that ask for
minutes and the test hangs (the README's command hung in test_source_upstream_sensor_table after
test_engine_errors had stopped a Sail server under a session it had made current).

Invariant for the tests: a test leaves no session in a slot whose server is gone (conftest checks it after each
test), and a command run in the test's process sees no session of the test's (:func:`set_aside`).
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from typing import Any


def _sessions_class() -> Any:
    """PySpark's Connect ``SparkSession`` class, or None while nothing in the process imported it."""
    module = sys.modules.get("pyspark.sql.connect.session")
    return None if module is None else module.SparkSession


def current() -> list[Any]:
    """The sessions in the default slot and this thread's active slot that are not stopped (no repeats)."""
    sessions = _sessions_class()
    if sessions is None:
        return []
    found = []
    for session in (sessions._default_session, getattr(sessions._active_session, "session", None)):
        if session is not None and not session.is_stopped and session not in found:
            found.append(session)
    return found


def _address(session: Any) -> tuple[str, int]:
    """The host and port of the session's server."""
    builder = session.client._builder
    return builder.host, int(builder._port)


def _answers(session: Any) -> bool:
    """Whether the session's server still accepts a connection (a TCP connect: no RPC, so nothing retries)."""
    try:
        socket.create_connection(_address(session), timeout=2).close()
    except OSError:
        return False
    return True


def dead_current() -> list[Any]:
    """The current sessions whose server is gone."""
    return [session for session in current() if not _answers(session)]


def forget(sessions: list[Any]) -> None:
    """Take ``sessions`` out of the default and this thread's active slot (not stopped: a stop would ask the gone
    server to release them, and retry)."""
    klass = _sessions_class()
    if klass is None:
        return
    with klass._lock:
        if klass._default_session in sessions:
            klass._default_session = None
    if getattr(klass._active_session, "session", None) in sessions:
        klass._active_session.session = None


def describe(session: Any) -> str:
    """The session's server as a Spark Connect address (``sc://host:port``)."""
    host, port = _address(session)
    return f"sc://{host}:{port}"


@contextlib.contextmanager
def set_aside() -> Iterator[None]:
    """Empty slots while the block runs (a command opens and stops its own session, as a new process does); the
    test's sessions put back afterwards, whatever the block left in them."""
    klass = _sessions_class()
    if klass is None:
        yield
        return
    with klass._lock:
        saved_default, klass._default_session = klass._default_session, None
    saved_active = getattr(klass._active_session, "session", None)
    klass._active_session.session = None
    try:
        yield
    finally:
        with klass._lock:
            klass._default_session = saved_default
        klass._active_session.session = saved_active
