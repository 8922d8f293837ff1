"""Spark's own JDBC data source (``spark.read.format("jdbc")``), the ``jdbc`` source's ``reader: spark``.

On Apache Spark and Databricks the engine reads the relational table itself: no database
driver in the runner, the cluster's network and the cluster's JDBC driver jars. The
connection entry gives ``jdbc_url``, ``user``, ``password`` (a reference only:
``{env: NAME}``, ``{secret: scope/key}`` or ``HEARTBEAT_<SECTION>_<NAME>_PASSWORD``), optional ``driver`` (default
from the URL's sub-protocol), ``connect_timeout_s`` and ``options`` (more JDBC options).

Names are validated like the SQLAlchemy reader's and quoted the way SQLAlchemy quotes them
for the same database, so both readers address the same table. Values never go into SQL
text: predicates and aggregates are DataFrame expressions whose literals Spark compiles.
Every Spark error becomes a SourceError naming the sensor, with the password masked.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, time
from typing import TYPE_CHECKING, Any, ClassVar

from heartbeat_runner.core.errors import SourceError, first_line
from heartbeat_runner.core.secrets import is_reference
from heartbeat_runner.core.windows import EventTimes
from heartbeat_runner.sensing.connections import connection_settings, env_name
from heartbeat_runner.sensing.sources.base import SenseContext, SensingTarget
from heartbeat_runner.sensing.sources.common import frame_event_times
from heartbeat_runner.sensing.sources.sql_common import DEFAULT_CONNECT_TIMEOUT_S, table_clause

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

#: the JDBC driver class Spark loads when the entry names none, by the URL's sub-protocol
DEFAULT_DRIVERS = {
    "postgresql": "org.postgresql.Driver",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlserver": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
    "oracle": "oracle.jdbc.OracleDriver",
    "sap": "com.sap.db.jdbc.Driver",
}
#: the SQLAlchemy dialect whose quoting rules apply to names, by sub-protocol (else ANSI double quotes)
_DIALECTS = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlserver": "mssql",
             "oracle": "oracle"}
#: JDBC connection property holding the connect timeout, and its unit (per second)
_TIMEOUT_OPTIONS = {"postgresql": ("connectTimeout", 1), "mysql": ("connectTimeout", 1000),
                    "mariadb": ("connectTimeout", 1000), "sqlserver": ("loginTimeout", 1)}
#: options the reader sets itself (from the settings above); ``options`` may not give them
_OWN_OPTIONS = frozenset({"url", "dbtable", "query", "user", "password", "driver"})
#: a password written into the URL itself (``?password=``, ``;password=``, ``//user:pw@``)
_PASSWORD_IN_URL = re.compile(r"[?&;]password=|//[^/@]*:[^/@]*@", re.IGNORECASE)


@dataclass(frozen=True)
class SparkJdbcSettings:
    """A connection entry for Spark's JDBC source, validated; the password is never shown."""

    where: str
    url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    driver: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    KEYS: ClassVar[tuple[str, ...]] = ("reader", "jdbc_url", "user", "password", "driver", "connect_timeout_s",
                                       "options")
    #: ``HEARTBEAT_<SECTION>_<NAME>_<suffix>`` variables filling settings the file does not give
    ENV_SETTINGS: ClassVar[dict[str, str]] = {"READER": "reader", "JDBC_URL": "jdbc_url", "USER": "user",
                                              "PASSWORD": "password", "DRIVER": "driver"}

    @classmethod
    def load(cls, ctx: SenseContext, section: str, name: str, extra_keys: tuple[str, ...] = ()) -> SparkJdbcSettings:
        where = f"{section}.{name}"
        entry = ctx.connections.get(section, {}).get(name)
        password = entry.get("password") if isinstance(entry, dict) else None
        if password is not None and not is_reference(password):
            raise SourceError(f"{where}: the password must come from the environment or a secret scope: write "
                              "password: {env: NAME} or password: {secret: scope/key}, "
                              f"or set HEARTBEAT_{env_name(section)}_{env_name(name)}_PASSWORD")
        settings = connection_settings(ctx.connections, section, name, cls.ENV_SETTINGS, ctx.secrets)
        unknown = sorted(set(settings) - set(cls.KEYS) - set(extra_keys))
        if unknown:
            raise SourceError(f"{where}: unknown setting(s) {', '.join(unknown)}; "
                              f"expected {', '.join(cls.KEYS + extra_keys)}")
        url = str(settings.get("jdbc_url") or "")
        if not url.startswith("jdbc:") or url.count(":") < 2:
            raise SourceError(f"{where}: reader spark needs jdbc_url, a JDBC URL such as "
                              "jdbc:postgresql://host:5432/database")
        if _PASSWORD_IN_URL.search(url):
            raise SourceError(f"{where}: the jdbc_url must not carry the password; give it as password: {{env: NAME}} or {{secret: scope/key}}")
        options = settings.get("options") or {}
        if not isinstance(options, dict) or _OWN_OPTIONS & {str(k).lower() for k in options}:
            raise SourceError(f"{where}: options must map JDBC option names to values, other than "
                              f"{', '.join(sorted(_OWN_OPTIONS))} (those have their own settings)")
        subprotocol = url.split(":")[1].lower()
        timeout_s = float(settings.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S))
        extra = {str(k): str(v) for k, v in options.items()}
        if subprotocol in _TIMEOUT_OPTIONS:
            option, unit = _TIMEOUT_OPTIONS[subprotocol]
            extra.setdefault(option, str(max(1, int(timeout_s * unit))))
        secret = settings.get("password")
        return cls(where=where, url=url, user=None if settings.get("user") is None else str(settings["user"]),
                   password=None if secret is None else str(secret),
                   driver=str(settings.get("driver") or DEFAULT_DRIVERS.get(subprotocol) or "") or None,
                   options=extra)

    @property
    def subprotocol(self) -> str:
        return self.url.split(":")[1].lower()

    @property
    def shown(self) -> str:
        """The endpoint for messages: URL and user, never the password."""
        return self.mask(self.url + (f" as {self.user}" if self.user else ""))

    def mask(self, text: str) -> str:
        return text.replace(self.password, "***") if self.password else text

    def dbtable(self, name: str, schema: str | None, key: str) -> str:
        """``schema.table`` validated and quoted as SQLAlchemy quotes it for this database."""
        import sqlalchemy as sa
        from sqlalchemy.dialects import registry

        table = table_clause(name, schema, [key])
        dialect = (registry.load(_DIALECTS[self.subprotocol])() if self.subprotocol in _DIALECTS
                   else sa.engine.default.DefaultDialect())
        return str(dialect.identifier_preparer.format_table(table))

    def read_options(self, dbtable: str) -> dict[str, str]:
        own = {"url": self.url, "dbtable": dbtable, "user": self.user, "password": self.password,
               "driver": self.driver}
        return {**self.options, **{k: v for k, v in own.items() if v is not None}}


class SparkJdbcReader:
    """``reader: spark``: the table as a JDBC DataFrame of the engine's session."""

    def __init__(self, settings: SparkJdbcSettings):
        self.settings = settings

    @classmethod
    def for_connection(cls, ctx: SenseContext, name: str) -> SparkJdbcReader:
        return cls(SparkJdbcSettings.load(ctx, "jdbc", name))

    @contextlib.contextmanager
    def open(self, ctx: SenseContext, schema: str | None, name: str, key: str,
             where: str) -> Iterator[SparkKeyedTable]:
        """The table for one sense; Spark errors inside the block become SourceError naming ``where``."""
        if ctx.engine.is_local:
            raise SourceError(f"{where}: the Spark JDBC reader (reader: spark) needs Apache Spark or Databricks; "
                              "the embedded engine (Sail) has no JDBC source. Use the SQLAlchemy reader "
                              "(a url setting) or the spark-local / databricks target")
        dbtable = self.settings.dbtable(name, schema, key)
        try:
            frame = ctx.spark.read.format("jdbc").options(**self.settings.read_options(dbtable)).load()
            yield SparkKeyedTable(frame, key)
        except _spark_errors() as exc:
            raise SourceError(self.settings.mask(f"{where} ({self.settings.shown}): {_describe(exc)}")) from exc


@dataclass
class SparkKeyedTable:
    """The keyed-table questions of the ``jdbc`` source, as DataFrame actions on the JDBC table."""

    frame: DataFrame
    key: str

    def max_key(self) -> Any:
        from pyspark.sql import functions as F

        return self.frame.agg(F.max(self.key)).collect()[0][0]

    def after(self, previous: Any) -> tuple[Any, int]:
        from pyspark.sql import functions as F

        row = self.frame.where(self._after(previous)).agg(F.max(self.key), F.count(F.lit(1))).collect()[0]
        return row[0], int(row[1])

    def count_preprocessed(self, previous: Any, top: Any, target: SensingTarget, ctx: SenseContext) -> int:
        return ctx.count_preprocessed(self._between(previous, top), target)

    def event_times(self, previous: Any, top: Any, grain: int) -> EventTimes | None:
        return frame_event_times(self._between(previous, top), self.key, grain)

    def _between(self, previous: Any, top: Any) -> DataFrame:
        """The new rows: a key in (``previous``, ``top``]."""
        from pyspark.sql import functions as F

        return self.frame.where(self._after(previous) & (F.col(self.key) <= self._literal(top)))

    def _after(self, previous: Any) -> Column:
        from pyspark.sql import functions as F

        key = F.col(self.key)
        return key.isNotNull() if previous is None else key > self._literal(previous)

    def _literal(self, value: Any) -> Column:
        """``value`` as a literal of the key column's type (a cursor may come from the other reader).

        Spark reads a SQL ``time`` column as a timestamp on 1970-01-01, and has no literal for a
        Python time (the SQLAlchemy reader's cursor for such a column): it becomes that timestamp.
        """
        from pyspark.sql import functions as F

        if isinstance(value, time):
            value = datetime.combine(date(1970, 1, 1), value)
        return F.lit(value).cast(self._key_type())

    def _key_type(self) -> DataType:
        return self.frame.select(self.key).schema.fields[0].dataType  # resolves the name as Spark does


def _spark_errors() -> tuple[type[BaseException], ...]:
    from pyspark.errors import PySparkException

    try:
        from py4j.protocol import Py4JError
    except ImportError:  # pragma: no cover - Spark Connect only
        return (PySparkException,)
    return (PySparkException, Py4JError)


def _describe(exc: BaseException) -> str:
    """The first line of a Spark error; for a Java exception its own text (py4j's first line only
    says which call failed)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        with contextlib.suppress(Exception):
            text = str(java.toString()).strip()
            if text:
                return text.splitlines()[0].rstrip(";")
    return first_line(exc).rstrip(";")
