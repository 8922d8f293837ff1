"""Names of upstream tables as the config writes them (a leaf module: standard library only).

A Delta upstream is named by ``table`` (resolved in a default schema), ``schema.table``,
``catalog.schema.table``, or an absolute path / URL. Every part is a plain identifier,
so a name can be put into SQL as it is; anything else is refused when the config is
validated.
"""

from __future__ import annotations

import enum
import re

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_TABLE_NAME = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER}){{0,2}}$")


def is_table_name(value: str) -> bool:
    """``table``, ``schema.table`` or ``catalog.schema.table`` with plain identifiers."""
    return bool(_TABLE_NAME.match(value))


def is_path(value: str) -> bool:
    return value.startswith("/") or "://" in value


def check_table_reference(sensor_id: str) -> str | None:
    """The problem with a sensor_id that names a Delta table or a path, or None."""
    if is_path(sensor_id) or is_table_name(sensor_id):
        return None
    return (f"{sensor_id!r} is neither a table name (table, schema.table or catalog.schema.table, "
            "letters, digits and underscores) nor an absolute path or URL")


def qualify(table_name: str, default_schema: str | None) -> str:
    """A bare ``table`` in ``default_schema`` (unchanged without one, or when already qualified)."""
    if "." in table_name or not default_schema:
        return table_name
    return f"{default_schema}.{table_name}"


def sql_string(value: str) -> str:
    """A Spark SQL string literal, for the few statements that cannot bind parameters (DDL's LOCATION)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class TextEnum(str, enum.Enum):
    """A vocabulary whose values are the words users type and files hold: ``str()`` and f-strings give the value."""

    def __str__(self) -> str:
        return self.value
