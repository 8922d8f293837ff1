"""Log lines as JSON, and what a log line knows about the tick it was written in (a leaf).

The tick sets :data:`TICK_RUN_ID` around itself and :data:`TICK_STAGE` around each stage
(``runner/tick.py``); a line about one source or job passes it with ``extra={"source": key}`` or
``extra={"job": job_id}``. :class:`JsonFormatter` writes one object per line:
``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, and ``run_id``, ``stage``, ``source``,
``job``, ``exception`` where they apply.

Invariant: every string a JSON line carries went through :func:`~heartbeat_runner.core.secrets.redact`
(URLs cut to their host, the values of the secret variables named in :data:`SECRET_VARIABLES` replaced),
the message and every field alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import datetime, timezone

from heartbeat_runner.core.secrets import redact

#: the run id of the tick this thread works for (None: outside a tick)
TICK_RUN_ID: ContextVar[str | None] = ContextVar("heartbeat_tick_run_id", default=None)
#: the tick's stage this thread is in (sensing, dbt, triggering, ...)
TICK_STAGE: ContextVar[str | None] = ContextVar("heartbeat_tick_stage", default=None)
#: what a line may name with ``extra=``: the source or the job it is about
EXTRA_FIELDS = ("source", "job")
#: environment variables whose values are secrets wherever they appear (the SDK's auth chain reads them)
SECRET_VARIABLES = ("DATABRICKS_TOKEN", "DATABRICKS_CLIENT_SECRET", "DATABRICKS_PASSWORD")


@contextlib.contextmanager
def in_context(var: ContextVar[str | None], value: str) -> Iterator[None]:
    """Set ``var`` to ``value`` for a block, then back to what it was."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module's invariants); ``secrets`` are values replaced wherever they
    appear."""

    def __init__(self, secrets: tuple[str, ...] = ()):
        super().__init__()
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run_id, stage = TICK_RUN_ID.get(), TICK_STAGE.get()
        if run_id is not None:
            line["run_id"] = run_id
        if stage is not None:
            line["stage"] = stage
        for name in EXTRA_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps({key: self._clean(value) for key, value in line.items()})

    def _clean(self, text: str) -> str:
        """``text`` redacted line by line (a traceback keeps its lines)."""
        return "\n".join(redact(part, self.secrets) for part in text.splitlines() or [""])


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the secret variables set in ``environ`` (for :class:`JsonFormatter`)."""
    return tuple(value for name in SECRET_VARIABLES if (value := environ.get(name)))


def use_json_logs(secrets: tuple[str, ...] = ()) -> None:
    """Write every line of the root logger's handlers as JSON from now on."""
    formatter = JsonFormatter(secrets)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
