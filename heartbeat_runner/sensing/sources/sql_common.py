"""SQLAlchemy plumbing shared by the relational sources (``jdbc``, ``sap_bw``/``sap_b4``).

Names that end up in SQL are validated here and quoted by SQLAlchemy; values are
always bound parameters. Each sense opens one connection (no pool: ticks are minutes
apart) with a short connect timeout, and every database error becomes a SourceError
that shows the URL without its password.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from datetime import date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from heartbeat_runner.core.errors import SourceError, first_line
from heartbeat_runner.sensing.connections import connection_settings
from heartbeat_runner.sensing.sources.base import SenseContext, SensingTarget

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

#: SQL names: plain identifiers, plus ``/`` for SAP namespaces (``/BIC/...``), quoted by SQLAlchemy.
_SQL_NAME = re.compile(r"^[A-Za-z_/][A-Za-z0-9_$#/]*$")
DEFAULT_CONNECT_TIMEOUT_S = 10
#: driver argument holding the connect timeout, and its unit (per second)
_TIMEOUT_ARGS: dict[str, tuple[str, int]] = {
    "postgresql": ("connect_timeout", 1),
    "mysql": ("connect_timeout", 1),
    "hana": ("connectTimeout", 1000),
}
PREPROCESS_CHUNK_ROWS = 50_000


def check_sql_name(value: str, what: str) -> str | None:
    if not _SQL_NAME.match(value):
        return f"{what} {value!r} is not a valid SQL name (letters, digits, _ $ # /)"
    return None


def check_table_name(value: str) -> str | None:
    """``table`` or ``schema.table``."""
    parts = value.split(".")
    if not 1 <= len(parts) <= 2:
        return f"table {value!r} must be table or schema.table"
    return next(filter(None, (check_sql_name(p, "table name part") for p in parts)), None)


def table_clause(name: str, schema: str | None, columns: list[str]) -> sa.TableClause:
    import sqlalchemy as sa

    for part in [name, *([schema] if schema else []), *columns]:
        problem = check_sql_name(part, "SQL name")
        if problem:
            raise SourceError(problem)
    return sa.table(name, *(sa.column(c) for c in columns), schema=schema)


def split_table(qualified: str) -> tuple[str | None, str]:
    schema, _, table = qualified.rpartition(".")
    return schema or None, table


_CONNECTION_KEYS = ("url", "connect_timeout_s", "connect_args")


def sql_settings(ctx: SenseContext, section: str, name: str, extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """Connection settings with a ``url`` (file entry or ``HEARTBEAT_<SECTION>_<NAME>_URL``)."""
    settings = connection_settings(ctx.connections, section, name, {"URL": "url"}, ctx.secrets)
    unknown = sorted(set(settings) - set(_CONNECTION_KEYS) - set(extra_keys))
    if unknown:
        raise SourceError(f"{section}.{name}: unknown setting(s) {', '.join(unknown)}; "
                          f"expected {', '.join(_CONNECTION_KEYS + extra_keys)}")
    if not settings.get("url"):
        raise SourceError(f"{section}.{name}: the connection has no url (a SQLAlchemy URL)")
    return settings


@contextlib.contextmanager
def connect(settings: dict[str, Any], where: str) -> Iterator[sa.Connection]:
    """One connection for one sense; database errors become SourceError naming ``where``."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    try:
        url = sa.engine.make_url(str(settings["url"]))
    except sa.exc.ArgumentError as exc:
        raise SourceError(f"{where}: the url is not a SQLAlchemy URL ({exc})") from exc
    shown = url.render_as_string(hide_password=True)
    connect_args = dict(settings.get("connect_args") or {})
    timeout_s = float(settings.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S))
    if url.get_backend_name() in _TIMEOUT_ARGS:
        arg, unit = _TIMEOUT_ARGS[url.get_backend_name()]
        connect_args.setdefault(arg, max(1, int(timeout_s * unit)))
    try:
        engine = sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)
        conn = engine.connect()
    except (sa.exc.SQLAlchemyError, ImportError) as exc:
        raise SourceError(f"{where}: cannot connect to {shown}: {_describe(exc)}") from exc
    try:
        with conn:
            yield conn
    except sa.exc.SQLAlchemyError as exc:
        raise SourceError(f"{where} ({shown}): {_describe(exc)}") from exc
    finally:
        engine.dispose()


def _describe(exc: BaseException) -> str:
    import sqlalchemy as sa

    if isinstance(exc, (sa.exc.NoSuchModuleError, ImportError)):
        return f"{exc} (is the database driver installed? SAP HANA: pip install 'heartbeat-runner[hana]')"
    return first_line(getattr(exc, "orig", None) or exc)


def count_preprocessed_rows(conn: sa.Connection, statement: sa.Select, target: SensingTarget,
                            ctx: SenseContext) -> int:
    """Stream ``statement``'s rows through ``preprocess_query`` in chunks; return how many it kept."""
    result = conn.execution_options(stream_results=True, max_row_buffer=PREPROCESS_CHUNK_ROWS).execute(statement)
    return sum(ctx.count_preprocessed_records([dict(row) for row in chunk], target)
               for chunk in result.mappings().partitions(PREPROCESS_CHUNK_ROWS))


# Cursor values keep their type, so the next sense binds a datetime for a timestamp column.
_DECODERS: dict[str, Callable[[str], Any]] = {
    "datetime": datetime.fromisoformat,
    "date": date.fromisoformat,
    "time": time.fromisoformat,
    "decimal": Decimal,
    "int": int,
    "float": float,
    "str": str,
}


def encode_value(value: Any) -> dict[str, str] | None:
    """A database value as ``{"type": ..., "value": text}`` for a JSON cursor."""
    if value is None:
        return None
    for tag, kind in (("datetime", datetime), ("date", date), ("time", time), ("decimal", Decimal),
                      ("float", float), ("int", int)):
        if isinstance(value, kind) and not isinstance(value, bool):
            return {"type": tag, "value": value.isoformat() if hasattr(value, "isoformat") else str(value)}
    return {"type": "str", "value": str(value)}


def decode_value(encoded: dict[str, str] | None) -> Any:
    if encoded is None:
        return None
    return _DECODERS[encoded["type"]](encoded["value"])
