"""Columns Heartbeat's derived tables gained after lakehouses were made without them.

A model adds new columns after its existing ones. An older table lacks them: its MERGE would
leave them out without a word, and a view that reads them would fail. So before a process's first
build or view restore (dbt_invoke.DbtProject), each table below gets its missing columns, empty; the
next build fills them, since the control table's MERGE writes every active row. One metadata commit
per table that needed it, none after.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from heartbeat_runner.engines.engine import Column, Engine

log = logging.getLogger(__name__)

#: model (a table the runner builds) -> the columns it gained, in the order the model selects them
ADDED_COLUMNS: dict[str, tuple[Column, ...]] = {
    # each job's latest lifecycle event and the catch-up sequence of its latest request, read by
    # heartbeat_job_sequences instead of the events
    "heartbeat_control": (
        Column("last_lifecycle_event", "string"),
        Column("base_requested_ts", "timestamp"),
        Column("sequence_run", "int"),
        Column("sequence_runs", "int"),
        Column("sequence_windows", "string"),
    ),
}


def add_missing_columns(engine: Engine, schema: str) -> None:
    """Add to each existing table of ADDED_COLUMNS in ``schema`` the columns it lacks. A table that
    does not exist yet is left alone (its first build creates it whole).

    Two processes that start on an older lakehouse at once may both find the columns missing; the
    one whose commit loses fails to add them. That failure is judged by what the table holds after
    it, not by the error: when the columns are there, the other process added them and this one goes
    on; otherwise the error is raised."""
    for model, columns in ADDED_COLUMNS.items():
        name = f"{schema}.{model}"
        if not engine.table_exists(name):
            continue
        missing = _missing(engine, name, columns)
        if not missing:
            continue
        try:
            engine.add_columns(name, missing)
        except Exception:
            if _missing(engine, name, missing):
                raise
            how = "another process added the column(s) {} first"
        else:
            how = "added the column(s) {} (a table made by an older Heartbeat)"
        log.info("%s: %s", name, how.format(", ".join(c.name for c in missing)))


def _missing(engine: Engine, name: str, columns: Sequence[Column]) -> list[Column]:
    """Those of ``columns`` the table ``name`` lacks now."""
    present = {c.lower() for c in engine.columns(name)}
    return [c for c in columns if c.name.lower() not in present]
