"""The one table that turns the engines' errors into Heartbeat's error kinds.

Sail, delta-rs, Delta on Apache Spark (classic: ``Py4JJavaError``; Connect: ``SparkConnectGrpcException``
and friends) and dbt report the same few situations with no shared exception type: a Delta commit that
lost a race, a Spark Connect channel that dropped, a change-feed range Delta did not record. Their
messages are the only stable part, so this module is the only place that reads them; everything else
asks :func:`kind_of` and catches or compares classes.

One situation has no message at all: an engine process this one holds has died (a local Spark JVM
that ran out of heap exits, and py4j or gRPC only say the connection is gone). The engine that knows
its process registers a probe (:func:`register_death_probe`); :func:`engine_failures` turns a failure
that follows such a death into the probe's error, once, at the command's and the tick's edge.

Invariants:

- every rule names one kind and the lower-cased fragments that identify it, with where each was seen;
- the first matching rule wins; an error no rule matches has kind ``None`` (not one of ours);
- an error already of one of the table's kinds is that kind (a mapped error keeps its class).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from heartbeat_runner.core.errors import ConflictError, HeartbeatError, NotFoundError, TerminalError, TransientError


class CommitConflictError(ConflictError, TransientError):
    """Another writer committed to the Delta table first; the write may be repeated as it is."""


class EngineUnavailableError(TransientError):
    """The engine's channel broke mid-call (Spark Connect reset, server restarting); try again."""


class ChangeFeedRangeMissingError(NotFoundError):
    """Delta holds no change data feed for the asked range (the feed was off for part of it)."""


class CatalogLookError(HeartbeatError):
    """The catalog look (``information_schema.tables``) of one catalog failed; its tables are sensed from their
    history meanwhile. Raised ``from`` the engine's error."""


class CatalogLookUnavailableError(CatalogLookError, TransientError):
    """The look failed in a way that may pass (a timeout, a warehouse starting, a throttled query)."""


class NoCatalogLookError(CatalogLookError, NotFoundError, TerminalError):
    """The catalog has no ``information_schema`` (Databricks' ``hive_metastore``, a plain Spark catalog)."""


class DriverOutOfMemoryError(TerminalError):
    """The local Spark driver ran out of heap and its JVM stopped; it will again with the same heap and
    workload. The message names the setting and the heap the JVM had."""

    def __init__(self, driver_memory: str):
        self.driver_memory = driver_memory
        super().__init__(
            f"the local Spark driver ran out of memory (Java heap space) with HEARTBEAT_SPARK_DRIVER_MEMORY="
            f"{driver_memory}, and its JVM stopped: set HEARTBEAT_SPARK_DRIVER_MEMORY higher (e.g. 2g, 4g; "
            "docs/engines.md, \"The driver heap\")")


@dataclass(frozen=True)
class ErrorRule:
    """Errors whose text contains any of ``fragments`` (lower-cased) are of ``kind``."""

    kind: type[HeartbeatError]
    fragments: tuple[str, ...]
    seen: str


#: The table. Fragments are matched against the lower-cased text of the error and of its causes.
ENGINE_ERROR_RULES: tuple[ErrorRule, ...] = (
    ErrorRule(CommitConflictError,
              ("failed to commit transaction", "transaction failed", "missing commit file",
               "already exists, will retry", "version already exists", "max commit attempts",
               "concurrent transaction", "commit conflict", "metadata changed since last commit"),
              "Sail 0.7 / delta-rs with two processes writing one table (two MERGEs; a new table: "
              "'Missing commit file: expected version 0, found 7')"),
    ErrorRule(CommitConflictError,
              ("[delta_concurrent_", "[delta_protocol_changed]", "[delta_metadata_changed]", "by a concurrent update"),
              "Delta 4.0 on Apache Spark, classic (io.delta.exceptions.ConcurrentAppendException) and Connect "
              "(error class DELTA_CONCURRENT_APPEND); two CREATEs of one new table: DELTA_PROTOCOL_CHANGED"),
    ErrorRule(ChangeFeedRangeMissingError,
              ("delta_missing_change_data", "delta_change_data_file_not_found"),
              "Delta's readChangeFeed over versions written before the feed was turned on; change files "
              "vacuumed (Databricks' error class; OSS Delta 4.0 has none)"),
    ErrorRule(NoCatalogLookError,
              ("`information_schema`.`tables` cannot be found", "`information_schema` cannot be found"),
              "Apache Spark 4.0 / Databricks asked for <catalog>.information_schema.tables where the catalog "
              "has none (spark_catalog, hive_metastore)"),
    ErrorRule(EngineUnavailableError,
              ("exception deserializing response", "statuscode.unavailable", "connection reset",
               "socket closed", "cannot schedule new futures after shutdown"),
              "Spark Connect clients (PySpark 4.0) when the server drops or restarts mid-call, seen through dbt"),
)


_MAPPED_KINDS = tuple({rule.kind for rule in ENGINE_ERROR_RULES})


def kind_of(exc: BaseException) -> type[HeartbeatError] | None:
    """The Heartbeat error kind of ``exc`` (or of an error in its cause chain); None if no rule knows it."""
    if isinstance(exc, _MAPPED_KINDS):
        return type(exc)
    text = " ".join(str(e) for e in _chain(exc)).lower()
    for rule in ENGINE_ERROR_RULES:
        if any(fragment in text for fragment in rule.fragments):
            return rule.kind
    return None


#: probes of the engine processes this one holds: each returns the error that its process's death means,
#: or None while it lives (or died of nothing it can name). Its argument says whether the failure is a
#: broken connection (connection_lost): only then may it wait a moment for a dying process to be reaped
DeathProbe = Callable[[bool], "HeartbeatError | None"]
_death_probes: list[DeathProbe] = []


def register_death_probe(probe: DeathProbe) -> None:
    """Ask ``probe`` whenever a failure reaches :func:`engine_failures` (registered once, however often called)."""
    if probe not in _death_probes:
        _death_probes.append(probe)


def engine_death(exc: BaseException) -> HeartbeatError | None:
    """The error of a dead engine process behind ``exc`` (a probe's answer), None when none died;
    a HeartbeatError is never replaced."""
    if isinstance(exc, HeartbeatError):
        return None
    lost = connection_lost(exc)
    for probe in _death_probes:
        found = probe(lost)
        if found is not None:
            return found
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection to the engine broke: a socket error or py4j's network error
    (classic: "Answer from Java side is empty", "Connection refused") anywhere in its cause or context,
    or an error of the table's EngineUnavailableError kind (Spark Connect)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    for error in seen:
        if isinstance(error, ConnectionError) or any(c.__name__ == "Py4JNetworkError" for c in type(error).__mro__):
            return True
    return kind_of(exc) is EngineUnavailableError


@contextlib.contextmanager
def engine_failures() -> Iterator[None]:
    """Failures inside become the error of the engine process's death when a probe names one, raised
    from the original (its cause); any other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        death = engine_death(exc)
        if death is None:
            raise
        raise death from exc


def is_kind(exc: BaseException, *kinds: type[HeartbeatError]) -> bool:
    """Whether ``exc`` maps to one of ``kinds`` (or a subclass of one)."""
    kind = kind_of(exc)
    return kind is not None and issubclass(kind, kinds)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (``raise ... from``), without cycles."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__
    return seen
