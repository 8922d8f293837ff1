"""Naming rules shared by the sources that reach external systems (Kafka, SAP, JDBC, sensor tables)."""

from __future__ import annotations

import re
from typing import Any

from heartbeat_runner.sources.base import SenseResult

_CONNECTION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def split_reference(sensor_id: str) -> tuple[str | None, str]:
    """``name: object`` -> (``name``, ``object``); without a colon (None, ``sensor_id``).

    Blanks around the colon are ignored (the spec writes ``my_product: my.topic``).
    """
    name, colon, rest = sensor_id.partition(":")
    if not colon:
        return None, sensor_id.strip()
    return name.strip(), rest.strip()


def check_connection_name(name: str | None, what: str) -> str | None:
    if name is None or not _CONNECTION_NAME.match(name):
        return f"{what} {name or ''!r} must be letters, digits, '_', '.' or '-'"
    return None


def check_upstream_key(upstream_key: str | None, columns: tuple[str, ...], source: str) -> str | None:
    """``upstream_key``, when set, must name a column of ``sensor_new_data`` (it is what ``?upstream_key`` renders)."""
    if upstream_key is None or upstream_key.lower() in (c.lower() for c in columns):
        return None
    return (f"upstream_key {upstream_key!r} is not a column {source} sources offer to preprocess_query; "
            f"use one of {', '.join(columns)} or leave it empty")


def keyed_result(key: str, previous: Any, top: Any, rows: int, cursor_to: str) -> SenseResult:
    """The answer of a source that found rows with ``key`` in (``previous``, ``top``]; new data when any was kept."""
    return SenseResult(
        new_data=rows > 0,
        cursor_to=cursor_to,
        window_from=f"{key} > {previous}" if previous is not None else "beginning",
        window_to=f"{key} <= {top}",
        rows=rows,
    )
