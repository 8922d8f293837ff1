"""Runner settings, resolved once from CLI flags and the environment (flags win).

Every ``HEARTBEAT_*`` variable the package reads is declared once, in ``HeartbeatEnvironment``
below: its type, bounds, default and a one-line help. ``load_settings`` validates the whole
environment at once (``SettingsError`` lists every bad variable) and builds the ``Settings`` record
the rest of the code is given; ``settings_table`` renders the README's table from the declaration.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from heartbeat_runner.core.durations import parse_seconds
from heartbeat_runner.core.errors import InvalidInputError
from heartbeat_runner.core.names import TextEnum

log = logging.getLogger(__name__)


class Target(TextEnum):
    """Where the lakehouse runs (``--target``, ``HEARTBEAT_TARGET``; the dbt profile's target of the same name)."""

    #: the embedded engine (Sail) in this process
    LOCAL = "local"
    #: Apache Spark + Delta Lake on this machine (classic or a local Spark Connect server)
    SPARK_LOCAL = "spark-local"
    #: a remote Spark Connect server (``SPARK_REMOTE``)
    SPARK = "spark"
    #: Databricks (Databricks Connect, Unity Catalog)
    DATABRICKS = "databricks"


class JobsBackendKind(TextEnum):
    """The built-in jobs backends (``--jobs-backend``, ``HEARTBEAT_JOBS_BACKEND``); plugins add others by name
    (the entry-point group ``heartbeat.jobs_backends``, see docs/plugins.md)."""

    #: commands from the local jobs file, run as detached processes
    LOCAL = "local"
    #: the Databricks Jobs API
    DATABRICKS = "databricks"


class LogFormat(TextEnum):
    """How log lines are written (``--log-format``, ``HEARTBEAT_LOG_FORMAT``)."""

    #: ``time level logger: message``, for people
    TEXT = "text"
    #: one JSON object per line, for log collectors (docs/observability.md)
    JSON = "json"


TARGETS = tuple(t.value for t in Target)
#: The targets whose tables live in the lakehouse folder.
LOCAL_TARGETS = (Target.LOCAL, Target.SPARK_LOCAL)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def package_project_dir() -> Path:
    """The dbt project that ships with the runner (the repository root)."""
    return Path(__file__).resolve().parents[2]


def validate_identifier(value: str, what: str) -> str:
    """Names that end up in SQL must be plain identifiers."""
    if not _IDENTIFIER.match(value or ""):
        raise ValueError(f"{what} {value!r} is not a valid identifier (letters, digits, underscore)")
    return value


@dataclass(frozen=True)
class MaintenancePolicy:
    """When and how much maintenance runs (HEARTBEAT_MAINTENANCE_* and friends, see load_settings)."""

    #: maintenance is due once one of Heartbeat's tables references more data files than this;
    #: every busy tick adds a few, so it also paces archiving (idle ticks write nothing)
    compact_min_files: int = 32
    #: files no longer referenced are removed after this long (readers on older snapshots finish first)
    vacuum_retention_hours: float = 1.0
    #: run summaries and report rows stay hot this long, then move to their archives
    report_keep_hours: float = 24.0
    #: archived rows older than this are deleted; None (the default) keeps history forever
    archive_retention_days: float | None = None


@dataclass(frozen=True)
class JobsApiLimits:
    """How hard one tick may use the jobs API (HEARTBEAT_JOBS_API_*; see docs/databricks.md for the
    calls a tick makes as a formula of the workload)."""

    #: calls in flight at once (trigger calls, single-run lookups, slices of a listing); local jobs too
    concurrency: int = 16
    #: client-side limit of calls per second to one endpoint (run-now, runs/get, runs/list), Databricks only
    rate_per_s: float = 100.0
    #: seconds of a tick spent on jobs API calls; no call starts later, the rest waits for the next tick
    budget_s: float = 30.0
    #: calls one tick may start (triggers and single-run lookups); the rest waits for the next tick
    max_calls: int = 2000
    #: pages (25 runs each) one tick may read of a workspace-wide run listing before it falls back
    list_pages: int = 120


@dataclass(frozen=True)
class MemoryPolicy:
    """Bounds on a long-running process's memory (HEARTBEAT_ENGINE_RECYCLE_TICKS,
    HEARTBEAT_ENGINE_MAX_RSS_MB, HEARTBEAT_ENGINE_PARK_AFTER_S, HEARTBEAT_IDLE_FLUSH_PARKED,
    HEARTBEAT_MAX_RSS_MB); 0 turns a bound off."""

    #: the embedded engine's process is replaced after this many ticks (or ``ui`` reads)
    engine_recycle_ticks: int = 5000
    #: ... or as soon as that process holds more than this many MiB
    engine_max_rss_mb: float = 200.0
    #: ``run --loop`` ends the embedded engine's process after this many seconds without a query, and
    #: the next query starts a new one (~2 s): an idle runner then holds only its own memory
    engine_park_after_s: float = 120.0
    #: while the engine is parked, an idle streak's row waits up to this many seconds (instead of
    #: ``idle_flush_s``): writing it would start the engine for that row alone (0: no longer wait)
    idle_flush_parked_s: float = 3600.0
    #: after a tick in which the whole process tree (runner and engine) holds more than this many
    #: MiB, ``run --loop`` restarts itself (same command line and pid): a safety net, not the fix
    max_rss_mb: float = 1024.0
    #: whether the user set the two MiB bounds (HEARTBEAT_ENGINE_MAX_RSS_MB, HEARTBEAT_MAX_RSS_MB): a bound
    #: left at its default follows the workload (raised above what a fresh process holds after its first
    #: tick, runner/memory.py); a bound the user set is obeyed as it is
    engine_max_rss_set: bool = False
    max_rss_set: bool = False


@dataclass(frozen=True)
class Settings:
    """Everything a command needs to know about where things live and how to run.

    Invariant: no field has a default here. Every default is declared once, with its variable, in
    :class:`HeartbeatEnvironment` (the README's table is generated from it), and :func:`settings_from` is the one
    place a ``Settings`` is made (tests/test_settings.py checks both)."""

    lakehouse_dir: Path
    project_dir: Path
    #: where dbt's saved parse is kept for new lakehouses (lakehouse/dbt_invoke.py); None: not kept
    dbt_parse_cache: Path | None
    target: Target
    schema: str
    catalog: str | None
    #: where a bare upstream table name (``orders``) is resolved; None: ``default`` locally,
    #: the session's current schema on Spark and Databricks
    upstream_schema: str | None
    config_csv: Path | None
    jobs_file: Path | None
    trigger_dir: Path | None
    sources_file: Path | None
    #: a JobsBackendKind's value or a plugin's name (resolved by the runner, which knows the plugins)
    jobs_backend: str | None
    max_workers: int
    sensor_timeout_s: float
    replay_new_sensors: bool
    #: the spark-local target: ``classic`` (a SparkSession in this process, as on a job cluster)
    #: or ``connect`` (a local Spark Connect server, as serverless); where it keeps its metastore
    #: and warehouse (default ``<lakehouse>/spark``)
    spark_mode: str
    spark_dir: Path | None
    #: ``spark-local``: the heap of its driver JVM (``spark.driver.memory``, e.g. ``2g``), in both shapes
    #: (HEARTBEAT_SPARK_DRIVER_MEMORY; unset: default_driver_memory(), chosen from the machine)
    spark_driver_memory: str
    #: runs longer than this are reported each tick (None: no limit)
    max_run_duration_s: float | None
    #: ... and cancelled, when the backend can cancel runs
    cancel_overdue_runs: bool
    #: the run-policy YAML (retries, catch-up, event windows, alerts per job; off when absent)
    run_policy_file: Path | None
    #: the variable that named ``run_policy_file`` (the deprecated HEARTBEAT_RETRY_POLICY when only it is set)
    run_policy_variable: str
    #: idle ticks (nothing new, nothing done) are summarised in one run row at most this often
    idle_flush_s: float
    #: how maintenance archives, compacts and expires (``maintain``, and ticks when auto_maintenance)
    maintenance: MaintenancePolicy
    #: ticks that wrote run maintenance when it is due (HEARTBEAT_MAINTENANCE=off: only ``maintain`` does)
    auto_maintenance: bool
    #: a refresh folds a tick's own commits into the control table when it can (HEARTBEAT_FOLDS=off: dbt
    #: derives every row of each refresh that has work; lakehouse/control_table.py)
    folds: bool
    #: events younger than this always stay in the hot log (a margin for clocks of other writers)
    archive_margin_minutes: float
    #: bounds of the jobs API calls of one tick
    jobs_api: JobsApiLimits
    #: how the embedded engine's process is recycled between ticks (and ``ui`` reads), and the
    #: ceiling after which ``run --loop`` restarts itself (see docs/memory.md)
    memory: MemoryPolicy
    #: seconds a tick lease lasts without renewal
    lease_ttl_s: float
    #: seconds a command waits for another runner's tick to end (``--wait-lease`` wins)
    lease_wait_s: float
    #: share of the active config rows a ``seed`` may retire without ``--allow-removals``
    max_removal_share: float
    #: seconds a stopping ``run --loop`` / ``ui`` / ``serve`` has to end before it dumps stacks and exits
    shutdown_grace_s: float
    #: where resolved Delta jar sets are cached (None: ``~/.cache/heartbeat/spark-jars``)
    spark_jars_dir: Path | None
    #: the status page's operators (e-mail addresses, lower case) and operator groups
    ui_operators: tuple[str, ...]
    ui_operator_groups: tuple[str, ...]
    #: delta_table sensor ids never ruled out by the catalog look: always sensed from their history
    catalog_look_skip: tuple[str, ...]
    #: seconds one Databricks HTTP call may take, and the SDK keeps retrying 429/503/timeouts
    databricks_http_timeout_s: float
    databricks_retry_timeout_s: int
    #: the run id a local job's own ``complete`` reports (set by the local jobs backend)
    job_run_id: str | None
    #: ``run --loop`` / ``serve``: the port of the Prometheus exposition (None: none) and the address it binds
    metrics_port: int | None
    metrics_host: str
    #: how log lines are written
    log_format: LogFormat
    #: ``run --loop`` ticks early for the sources that say they changed (runner/wakeups.py)
    wakeups: bool
    #: ``POST /wake``: its port (None: off), address and bearer token (a secret: never shown)
    wake_port: int | None
    wake_host: str
    wake_token: str | None = field(repr=False)
    #: the OpenLineage job namespace of the runs Heartbeat triggers (docs/lineage.md)
    lineage_namespace: str
    #: the IANA zone times are shown in (CLI, page); stored times stay UTC
    timezone: str
    #: the status page's address, for links in alert messages (None: no page link)
    ui_url: str | None

    @property
    def retry_policy_file(self) -> Path | None:
        """Deprecated name of ``run_policy_file`` (the file holds more than retries)."""
        return self.run_policy_file

    @property
    def lakehouse_in_folder(self) -> bool:
        """Whether Heartbeat's tables live in ``lakehouse_dir`` (the embedded and local Spark targets), rather
        than in a catalog elsewhere (``spark``, ``databricks``: the folder then holds only the tick lease)."""
        return self.target in LOCAL_TARGETS

    @property
    def warehouse_dir(self) -> Path:
        return self.lakehouse_dir / "warehouse"

    @property
    def effective_config_csv(self) -> Path:
        return self.config_csv or self.project_dir / "seeds" / "heartbeat_sensor_config.csv"

    @property
    def effective_trigger_dir(self) -> Path:
        return self.trigger_dir or self.lakehouse_dir / "triggers"

    @property
    def effective_spark_dir(self) -> Path:
        return self.spark_dir or self.lakehouse_dir / "spark"

    def lakehouse_env(self) -> dict[str, str]:
        """The variables that point a job's own ``heartbeat_runner`` commands (a final ``complete``)
        at this lakehouse on this engine, whatever flags chose them here."""
        env = {"HEARTBEAT_HOME": str(self.lakehouse_dir), "HEARTBEAT_TARGET": self.target}
        if self.target is Target.SPARK_LOCAL:
            env.update(HEARTBEAT_SPARK_MODE=self.spark_mode, HEARTBEAT_SPARK_DIR=str(self.effective_spark_dir),
                       HEARTBEAT_SPARK_DRIVER_MEMORY=self.spark_driver_memory)
        return env

    @property
    def effective_jobs_file(self) -> Path:
        if self.jobs_file:
            return self.jobs_file
        for candidate in (Path.cwd() / "heartbeat_jobs.yml", self.lakehouse_dir / "heartbeat_jobs.yml"):
            if candidate.exists():
                return candidate
        return self.lakehouse_dir / "heartbeat_jobs.yml"

    @property
    def effective_sources_file(self) -> Path | None:
        if self.sources_file:
            return self.sources_file
        # the project folder last: on a job cluster HEARTBEAT_PROJECT_DIR is the bundle's synced files, where
        # a heartbeat_sources.yml committed beside databricks.yml arrives (the cwd and the lakehouse are not)
        for candidate in (Path.cwd() / "heartbeat_sources.yml", self.lakehouse_dir / "heartbeat_sources.yml",
                          self.project_dir / "heartbeat_sources.yml"):
            if candidate.exists():
                return candidate
        return None

    @property
    def effective_jobs_backend(self) -> str:
        if self.jobs_backend:
            return self.jobs_backend
        return (JobsBackendKind.DATABRICKS if self.target is Target.DATABRICKS else JobsBackendKind.LOCAL).value

    def with_(self, **changes) -> Settings:
        """A copy with ``changes``; the deprecated ``retry_policy_file`` sets ``run_policy_file``."""
        if "retry_policy_file" in changes:
            changes["run_policy_file"] = changes.pop("retry_policy_file")
        return replace(self, **changes)


# -- the declaration of every HEARTBEAT_* variable ------------------------------------------------


class SettingsError(InvalidInputError):
    """One or more ``HEARTBEAT_*`` variables are invalid; ``problems`` names each variable, its value
    and what it accepts (all of them, not only the first)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid settings in the environment:\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class _Accepts:
    """What a variable's type accepts, as the settings table and error messages say it."""

    text: str


_BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "on": True,
                  "false": False, "0": False, "no": False, "off": False}
BOOLEAN_FORM = "true/false, 1/0, yes/no or on/off"


def _boolean(value: object) -> bool:
    """The one boolean dialect of the settings (case-insensitive)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word not in _BOOLEAN_WORDS:
        raise ValueError(f"not a boolean: use {BOOLEAN_FORM}")
    return _BOOLEAN_WORDS[word]


def _path(value: object) -> Path | None:
    """An absolute path (``~`` expanded, resolved from the working folder); empty: not set."""
    if value is None or isinstance(value, Path):
        return value.expanduser().resolve() if value else None
    text = str(value).strip()
    if "\0" in text:
        raise ValueError("not a path: it holds a NUL character")
    return Path(text).expanduser().resolve() if text else None


def _duration(value: object) -> float:
    return parse_seconds(value, allow_zero=True)


def _positive_duration(value: object) -> float:
    return parse_seconds(value, allow_zero=False)


def _optional_positive_duration(value: object) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    return _positive_duration(value)


def _identifier(value: object) -> str:
    if not _IDENTIFIER.match(str(value).strip()):
        raise ValueError("not an identifier")
    return str(value).strip()


def _optional_identifier(value: object) -> str | None:
    text = "" if value is None else str(value).strip()
    return _identifier(text) if text else None


def _qualified_schema(value: object) -> str | None:
    """``schema`` or ``catalog.schema``, each part a plain identifier."""
    text = "" if value is None else str(value).strip()
    for part in text.split(".", 1) if text else ():
        _identifier(part)
    return text or None


def _timezone(value: object) -> str:
    """An IANA time zone name (``Europe/Berlin``, ``UTC``) that this machine's zone database knows."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    text = str(value or "").strip() or "UTC"
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError("not a known IANA time zone (e.g. UTC, Europe/Berlin)") from exc
    return text


def _url(value: object) -> str | None:
    """An http(s) address without a trailing slash; empty: not set."""
    text = str(value or "").strip().rstrip("/")
    if text and not text.lower().startswith(("http://", "https://")):
        raise ValueError("not an http(s) address")
    return text or None


#: a JVM memory size as Spark reads it (``spark.driver.memory``): a whole number and a unit
_MEMORY_SIZE = re.compile(r"^(\d+)\s*([kmgt])b?$", re.IGNORECASE)
_MIB_PER_UNIT = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
#: the smallest driver heap Spark starts with: it refuses a heap under 1.5 × its 300 MiB reserve
#: ("System memory ... must be at least 471859200"), and the JVM's usable heap is a little under -Xmx
MIN_DRIVER_MEMORY_MB = 512
#: bounds of the driver heap chosen from the machine (default_driver_memory)
DEFAULT_DRIVER_MEMORY_MIN_MB = 1024
DEFAULT_DRIVER_MEMORY_MAX_MB = 8192


def memory_mb(text: str) -> float:
    """MiB of a JVM memory size (``512m``, ``2g``, ``2G``, ``1536mb``); ValueError for anything else."""
    match = _MEMORY_SIZE.match(str(text).strip())
    if not match:
        raise ValueError("not a memory size")
    return int(match.group(1)) * _MIB_PER_UNIT[match.group(2).lower()]


def format_memory(mb: int) -> str:
    """A size in MiB as the JVM reads it: whole GiB as ``4g``, else ``1536m``."""
    return f"{mb // 1024}g" if mb % 1024 == 0 else f"{mb}m"


def _driver_memory(value: object) -> str | None:
    """A driver heap of at least MIN_DRIVER_MEMORY_MB, normalised (``2G`` -> ``2g``); blank: not set."""
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    mb = memory_mb(text)
    if mb < MIN_DRIVER_MEMORY_MB:
        raise ValueError(f"too small: Spark's driver needs at least {MIN_DRIVER_MEMORY_MB}m")
    match = _MEMORY_SIZE.match(text)
    assert match is not None  # memory_mb checked it
    return f"{int(match.group(1))}{match.group(2).lower()}"


def physical_memory_mb() -> int | None:
    """This machine's physical memory in MiB (os.sysconf: Linux, most Unixes); None where it cannot tell."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    if pages <= 0 or page_size <= 0:
        return None
    return pages * page_size // (1024 * 1024)


def default_driver_memory(physical_mb: int | None = None) -> str:
    """The driver heap when HEARTBEAT_SPARK_DRIVER_MEMORY is unset: a quarter of ``physical_mb`` (default:
    this machine's), at least 1g and at most 8g, in whole MiB; 1g when the memory cannot be read.
    A quarter leaves the rest to the runner, the Python workers, dbt and the page cache Delta reads from."""
    physical = physical_memory_mb() if physical_mb is None else physical_mb
    if not physical:
        return format_memory(DEFAULT_DRIVER_MEMORY_MIN_MB)
    return format_memory(min(max(physical // 4, DEFAULT_DRIVER_MEMORY_MIN_MB), DEFAULT_DRIVER_MEMORY_MAX_MB))


def _listed(value: object) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(part.strip() for part in str(value or "").split(",") if part.strip())


Flag = Annotated[bool, BeforeValidator(_boolean), _Accepts(BOOLEAN_FORM)]
FilePath = Annotated[Path | None, BeforeValidator(_path), _Accepts("a path")]
Duration = Annotated[float, BeforeValidator(_duration), _Accepts("a duration, at least 0")]
PositiveDuration = Annotated[float, BeforeValidator(_positive_duration), _Accepts("a duration, greater than 0")]
OptionalDuration = Annotated[float | None, BeforeValidator(_optional_positive_duration),
                             _Accepts("a duration, greater than 0")]
Identifier = Annotated[str, BeforeValidator(_identifier), _Accepts("an identifier (letters, digits, underscore)")]
OptionalIdentifier = Annotated[str | None, BeforeValidator(_optional_identifier),
                               _Accepts("an identifier (letters, digits, underscore)")]
QualifiedSchema = Annotated[str | None, BeforeValidator(_qualified_schema),
                            _Accepts("`schema` or `catalog.schema` (identifiers)")]
#: NoDecode: a comma-separated text, not the JSON pydantic-settings would otherwise expect for a tuple
Names = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_listed), _Accepts("comma-separated names")]
Text = Annotated[str | None, _Accepts("text")]
TimeZone = Annotated[str, BeforeValidator(_timezone), _Accepts("an IANA time zone name")]
Url = Annotated[str | None, BeforeValidator(_url), _Accepts("an http(s) address")]
MemorySize = Annotated[str | None, BeforeValidator(_driver_memory),
                       _Accepts(f"a JVM memory size (`2g`, `1536m`), at least `{MIN_DRIVER_MEMORY_MB}m`")]


def _var(name: str, default: Any, help: str, *, shown: str | None = None, **bounds: Any) -> Any:
    """One variable's declaration: its name, default, one-line help (the README's ``meaning``), and the
    default as the README shows it when it is not the value itself (``shown``)."""
    return Field(default, validation_alias=name, description=help,
                 json_schema_extra={"shown_default": shown} if shown is not None else None, **bounds)


class HeartbeatEnvironment(BaseSettings):
    """Every ``HEARTBEAT_*`` variable Heartbeat reads, in the README's order.

    Invariant: no other module reads a ``HEARTBEAT_*`` variable (tests/test_settings.py checks the
    source); the ones Heartbeat only sets for its child processes are not declared here.
    """

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    home: FilePath = _var("HEARTBEAT_HOME", None, "the lakehouse directory (`--lakehouse-dir`)", shown="`./.heartbeat`")
    target: Annotated[Target, _Accepts("`local`, `spark-local`, `spark` or `databricks`")] = _var(
        "HEARTBEAT_TARGET", Target.LOCAL, "the engine (`--target`); `spark` connects to `SPARK_REMOTE`")
    spark_mode: Annotated[Literal["classic", "connect"], _Accepts("`classic` or `connect`")] = _var(
        "HEARTBEAT_SPARK_MODE", "classic",
        "`spark-local`: `classic` (a SparkSession in the runner) or `connect` (a local Spark Connect server)")
    spark_dir: FilePath = _var("HEARTBEAT_SPARK_DIR", None, "`spark-local`: its metastore and warehouse",
                               shown="`<lakehouse>/spark`")
    spark_driver_memory: MemorySize = _var(
        "HEARTBEAT_SPARK_DRIVER_MEMORY", None,
        "`spark-local`: the driver JVM's heap (`spark.driver.memory`), both shapes; a driver that runs out of it "
        "stops with an error naming this variable ([docs/engines.md](docs/engines.md#the-driver-heap))",
        shown="a quarter of physical memory, at least `1g`, at most `8g`")
    spark_jars_dir: FilePath = _var("HEARTBEAT_SPARK_JARS_DIR", None,
                                    "`spark-local`: where the resolved Delta jars are cached",
                                    shown="`~/.cache/heartbeat/spark-jars`")
    schema_name: Identifier = _var("HEARTBEAT_SCHEMA", "heartbeat", "the schema of Heartbeat's tables")
    catalog: OptionalIdentifier = _var("HEARTBEAT_CATALOG", None,
                                      "the catalog of Heartbeat's tables (targets `spark` and `databricks`; refused on "
                                      "`local` and `spark-local`, whose engine has one catalog)", shown="none")
    upstream_schema: QualifiedSchema = _var(
        "HEARTBEAT_UPSTREAM_SCHEMA", None,
        "where a bare upstream table name in the config (`orders`, as the reference implementation's "
        "configs write it) is resolved", shown="`default` locally; the session's current schema on Spark and Databricks")
    project_dir: FilePath = _var("HEARTBEAT_PROJECT_DIR", None, "the dbt project Heartbeat builds its tables with",
                                 shown="the one shipped with the runner")
    dbt_parse_cache: FilePath = _var(
        "HEARTBEAT_DBT_PARSE_CACHE", None,
        "a folder where dbt's parse of the project is kept for new lakehouses: a new lakehouse's first dbt call "
        "then starts from it (~0.1 s) rather than parse the project (~1.5 s); dbt checks it against the project. "
        "The statements the runner renders with dbt (~0.7 s each) and the views' compiled SQL are kept there too, "
        "by project, engine, schema and vars",
        shown="none (each new lakehouse parses once)")
    config: FilePath = _var("HEARTBEAT_CONFIG", None, "the config CSV (`--config`)",
                            shown="`seeds/heartbeat_sensor_config.csv`")
    jobs_backend: OptionalIdentifier = _var("HEARTBEAT_JOBS_BACKEND", None,
                                            "where jobs run: `local`, `databricks` or a plugin's name (`--jobs-backend`)",
                                            shown="`local` (`databricks` on that target)")
    jobs_file: FilePath = _var("HEARTBEAT_JOBS_FILE", None, "the local jobs file (`--jobs-file`)",
                               shown="`./heartbeat_jobs.yml`, else `<lakehouse>/heartbeat_jobs.yml`")
    trigger_dir: FilePath = _var("HEARTBEAT_TRIGGER_DIR", None, "the trigger folders (`--trigger-dir`)",
                                 shown="`<lakehouse>/triggers`")
    sources_file: FilePath = _var("HEARTBEAT_SOURCES_FILE", None, "connection settings (`--sources-file`)",
                                  shown="`./heartbeat_sources.yml`, else `<lakehouse>/heartbeat_sources.yml`, else "
                                        "`<HEARTBEAT_PROJECT_DIR>/heartbeat_sources.yml`")
    max_workers: Annotated[int, _Accepts("a whole number")] = _var(
        "HEARTBEAT_MAX_WORKERS", 8, "parallel sensing: the pool size", ge=1)
    sensor_timeout: PositiveDuration = _var("HEARTBEAT_SENSOR_TIMEOUT", 60.0,
                                            "parallel sensing: the time one source may take")
    replay_new_sensors: Flag = _var("HEARTBEAT_REPLAY_NEW_SENSORS", False,
                                    "new sensors replay their source from the beginning (`--replay-new-sensors`)")
    jobs_api_concurrency: Annotated[int, _Accepts("a whole number")] = _var(
        "HEARTBEAT_JOBS_API_CONCURRENCY", 16, "jobs API calls in flight at once (local job launches too)", ge=1)
    jobs_api_rate: Annotated[float, _Accepts("a number")] = _var(
        "HEARTBEAT_JOBS_API_RATE", 100.0, "jobs API calls per second to one endpoint (Databricks)", gt=0)
    jobs_api_budget: PositiveDuration = _var(
        "HEARTBEAT_JOBS_API_BUDGET", 30.0,
        "a tick's time for jobs API calls; what does not fit is carried to the next tick in order "
        "([docs/databricks.md](docs/databricks.md#6a-api-calls-per-tick-and-the-settings-that-bound-them))")
    jobs_api_max_calls: Annotated[int, _Accepts("a whole number")] = _var(
        "HEARTBEAT_JOBS_API_MAX_CALLS", 2000, "jobs API calls one tick may start", ge=1)
    jobs_api_list_pages: Annotated[int, _Accepts("a whole number")] = _var(
        "HEARTBEAT_JOBS_API_LIST_PAGES", 120, "pages (25 runs each) of a run listing one tick may read", ge=1)
    databricks_http_timeout: PositiveDuration = _var("HEARTBEAT_DATABRICKS_HTTP_TIMEOUT", 30.0,
                                                     "the time one Databricks HTTP call may take")
    databricks_retry_timeout: PositiveDuration = _var(
        "HEARTBEAT_DATABRICKS_RETRY_TIMEOUT", 120.0,
        "how long the Databricks SDK keeps retrying 429/503/timeouts before giving up")
    max_run_duration: OptionalDuration = _var("HEARTBEAT_MAX_RUN_DURATION", None,
                                              "runs longer than this are reported each tick", shown="none")
    cancel_overdue_runs: Flag = _var("HEARTBEAT_CANCEL_OVERDUE_RUNS", False,
                                     "... and cancelled, when the jobs backend can cancel runs")
    run_policy: FilePath = _var(
        "HEARTBEAT_RUN_POLICY", None,
        "the run-policy YAML per job: automatic retries ([docs/databricks.md](docs/databricks.md)), bounded "
        "catch-up and event windows ([docs/windows.md](docs/windows.md)) and alerts ([docs/alerts.md](docs/alerts.md)); a path that names no file is refused by `run` and "
        "`validate` (exit 1, nothing written)",
        shown="`<HEARTBEAT_PROJECT_DIR>/heartbeat_run_policy.yml` when that variable is set and the file is there, "
              "else none (off)")
    retry_policy: FilePath = _var("HEARTBEAT_RETRY_POLICY", None,
                                  "deprecated name of `HEARTBEAT_RUN_POLICY` (still read, with a warning)",
                                  shown="none")
    shutdown_grace: PositiveDuration = _var(
        "HEARTBEAT_SHUTDOWN_GRACE_S", 30.0,
        "`run --loop`, `ui`, `serve`: the time the process has to end after Ctrl-C / SIGTERM (once the running "
        "tick is done); after that it prints every thread's stack to stderr and exits with status 1")
    lease_ttl: PositiveDuration = _var("HEARTBEAT_LEASE_TTL", 600.0, "how long a tick's lease lasts without renewal")
    lease_wait: Duration = _var("HEARTBEAT_LEASE_WAIT", 30.0,
                                "how long a command waits for another runner's tick to end, then skips (`--wait-lease`)")
    lineage_namespace: Annotated[str, _Accepts("a namespace such as `heartbeat` or `prod.sales`")] = _var(
        "HEARTBEAT_LINEAGE_NAMESPACE", "heartbeat",
        "the OpenLineage job namespace of the runs Heartbeat triggers; lineage itself is on when OpenLineage is "
        "configured (`OPENLINEAGE_URL`, `OPENLINEAGE_CONFIG` or `openlineage.yml`: [docs/lineage.md](docs/lineage.md))",
        min_length=1)
    max_removal_share: Annotated[float, _Accepts("a number")] = _var(
        "HEARTBEAT_MAX_REMOVAL_SHARE", 0.5, "share of active rows a `seed` may retire without `--allow-removals`",
        ge=0, le=1)
    maintenance: Flag = _var("HEARTBEAT_MAINTENANCE", True,
                             "`off`: ticks never run maintenance (then schedule `maintain`)", shown="`on`")
    folds: Flag = _var(
        "HEARTBEAT_FOLDS", True,
        "a tick folds its own commits (new data, requests, runs that ended) into the control table by MERGEs; "
        "`off`: dbt derives every row at each refresh that has work (slower; the same table). `runs --json` "
        "and `heartbeat_control_refresh_total` show which path each refresh took "
        "([docs/observability.md](docs/observability.md))", shown="`on`")
    maintenance_max_files: Annotated[int, _Accepts("a whole number")] = _var(
        "HEARTBEAT_MAINTENANCE_MAX_FILES", 32,
        "maintenance is due once one of Heartbeat's tables references more data files than this", ge=1)
    report_keep_hours: Annotated[float, _Accepts("a number of hours")] = _var(
        "HEARTBEAT_REPORT_KEEP_HOURS", 24.0, "run summaries and report rows stay in the hot tables this long", ge=0)
    archive_retention_days: Annotated[float | None, _Accepts("a number of days")] = _var(
        "HEARTBEAT_ARCHIVE_RETENTION_DAYS", None, "archived events, runs and report rows older than this are deleted",
        shown="none (keep forever)", gt=0)
    archive_margin_minutes: Annotated[float, _Accepts("a number of minutes")] = _var(
        "HEARTBEAT_ARCHIVE_MARGIN_MINUTES", 10.0, "events this young always stay in the hot log", ge=0)
    vacuum_retention_hours: Annotated[float, _Accepts("a number of hours")] = _var(
        "HEARTBEAT_VACUUM_RETENTION_HOURS", 1.0, "unreferenced data files are removed after this long",
        shown="`1` (at least 168 on Spark/Databricks)", ge=0)
    idle_flush: Duration = _var("HEARTBEAT_IDLE_FLUSH", 600.0,
                                "a streak of idle ticks is written as one run row at least this often")
    engine_recycle_ticks: Annotated[int, _Accepts("a whole number")] = _var(
        "HEARTBEAT_ENGINE_RECYCLE_TICKS", 5000,
        "the embedded engine runs in a child process; `run --loop` replaces it after this many ticks (`ui`: "
        "reads); `0`: never ([docs/memory.md](docs/memory.md))", ge=0)
    engine_max_rss_mb: Annotated[float, _Accepts("a number of MiB")] = _var(
        "HEARTBEAT_ENGINE_MAX_RSS_MB", 200.0,
        "... or as soon as that process holds more than this many MiB (`serve` too); `0`: no bound. Unset, the "
        "bound follows the workload: at least 1.5× what a fresh engine holds after its first tick", ge=0)
    engine_park_after: Duration = _var(
        "HEARTBEAT_ENGINE_PARK_AFTER_S", 120.0,
        "`run --loop` ends the embedded engine's process after this long without a query (idle ticks need none) "
        "and starts a new one at the next query (~0.5–2 s); `0`: never")
    idle_flush_parked: Duration = _var(
        "HEARTBEAT_IDLE_FLUSH_PARKED", 3600.0,
        "while the engine is parked, an idle streak's row waits up to this long instead of `HEARTBEAT_IDLE_FLUSH` "
        "(the write would start the engine for that row alone); `0`: no longer wait")
    max_rss_mb: Annotated[float, _Accepts("a number of MiB")] = _var(
        "HEARTBEAT_MAX_RSS_MB", 1024.0,
        "after a tick in which the whole process tree (the runner and its engine, not local job runs) holds more "
        "than this many MiB, `run --loop` restarts itself (same command line and pid; logged, counted in the run "
        "summaries); `0`: off. Unset, the bound follows the workload: at least 1.5× what the tree holds after "
        "its first tick", ge=0)
    catalog_look_skip: Names = _var(
        "HEARTBEAT_CATALOG_LOOK_SKIP", (),
        "`databricks`: delta_table sensor ids (as in the config) the catalog look never rules out: each is sensed "
        "from its history every tick (a table written where Unity Catalog does not see it)", shown="none")
    ui_operators: Names = _var("HEARTBEAT_UI_OPERATORS", (),
                               "`ui --allow-actions`: the e-mail addresses of the users who may act", shown="none")
    ui_operator_groups: Names = _var("HEARTBEAT_UI_OPERATOR_GROUPS", (),
                                     "`ui --allow-actions`: workspace groups whose members may act", shown="none")
    metrics_port: Annotated[int | None, _Accepts("a port number (1-65535)")] = _var(
        "HEARTBEAT_METRICS_PORT", None,
        "`run --loop`, `serve`: serve Prometheus metrics on this port (`--metrics-port`; "
        "[docs/observability.md](docs/observability.md))", shown="none (off)", ge=1, le=65535)
    metrics_host: Annotated[str, _Accepts("a host name or address")] = _var(
        "HEARTBEAT_METRICS_HOST", "127.0.0.1", "the address the metrics bind (`--metrics-host`; `0.0.0.0`: every one)",
        min_length=1)
    log_format: Annotated[LogFormat, _Accepts("`text` or `json`")] = _var(
        "HEARTBEAT_LOG_FORMAT", LogFormat.TEXT,
        "log lines as text, or as one JSON object per line with the tick's run id and stage (`--log-format`)")
    wakeups: Flag = _var(
        "HEARTBEAT_WAKEUPS", True,
        "`run --loop` senses a source as soon as it says it changed (trigger folders and local Delta tables "
        "through file-system notifications, `POST /wake`), between its polls ([docs/wakeups.md](docs/wakeups.md)); "
        "`off`: polls only", shown="`on`")
    wake_port: Annotated[int | None, _Accepts("a port number")] = _var(
        "HEARTBEAT_WAKE_PORT", None, "`run --loop`: serve `POST /wake` on this port (`--wake-port`)",
        shown="none (off)", ge=0, le=65535)
    wake_host: Annotated[str, _Accepts("a host name or address")] = _var(
        "HEARTBEAT_WAKE_HOST", "127.0.0.1", "`POST /wake`: the address it listens on (`0.0.0.0`: every one)")
    wake_token: Text = _var("HEARTBEAT_WAKE_TOKEN", None,
                            "`POST /wake`: the bearer token callers present (required with a port; a secret: "
                            "set it from a secret store)", shown="none")
    timezone: TimeZone = _var("HEARTBEAT_TIMEZONE", "UTC",
                              "the time zone the CLI and the status page show times in (stored times stay UTC)",
                              shown="`UTC`")
    ui_url: Url = _var("HEARTBEAT_UI_URL", None,
                       "the status page's address: alert messages (webhook, e-mail, PagerDuty) link to the job's view",
                       shown="none")
    job_run_id: Text = _var("HEARTBEAT_JOB_RUN_ID", None,
                            "set by the local jobs backend for a job's processes: the run `complete` reports",
                            shown="none")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Values come only from ``read_environment``'s mapping (never a second, implicit read of os.environ)."""
        return (init_settings,)


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, environ: Mapping[str, str]):
        super().__init__(HeartbeatEnvironment, case_sensitive=True, env_ignore_empty=True)
        self.env_vars = {name: value for name, value in environ.items() if str(value).strip()}


def _aliases() -> dict[str, str]:
    return {name: str(info.validation_alias) for name, info in HeartbeatEnvironment.model_fields.items()}


def read_environment(environ: Mapping[str, str] | None = None) -> HeartbeatEnvironment:
    """Every declared variable of ``environ`` (default ``os.environ``), validated together; SettingsError
    naming each bad variable, its value and what it accepts. Blank values count as not set."""
    raw = _MappingSource(os.environ if environ is None else environ)()
    try:
        env = HeartbeatEnvironment(**raw)
    except ValidationError as exc:
        raise SettingsError([_problem(error, raw) for error in exc.errors()]) from exc
    problems = _combination_problems(env)
    if problems:
        raise SettingsError(problems)
    return env


#: the targets whose engine has one catalog, its own (the embedded engine; Spark on this machine)
ONE_CATALOG_TARGETS = (Target.LOCAL, Target.SPARK_LOCAL)


def _combination_problems(env: HeartbeatEnvironment) -> list[str]:
    """Variables each valid alone that do not go together (a job cluster's environment copied to a laptop)."""
    if env.catalog and env.target in ONE_CATALOG_TARGETS:
        return [f"HEARTBEAT_CATALOG={env.catalog!r}: target {env.target.value!r} has one catalog, the engine's own; "
                "leave HEARTBEAT_CATALOG unset there (it names a Unity Catalog catalog on targets 'spark' and "
                "'databricks')"]
    return []


def _problem(error: Mapping[str, Any], raw: Mapping[str, Any]) -> str:
    """``HEARTBEAT_X='value': what is wrong; accepts: the form and bounds``."""
    aliases = _aliases()
    key = str(error["loc"][0]) if error["loc"] else "?"
    name = aliases.get(key, key)
    message = str(error["msg"]).removeprefix("Value error, ")
    field_name = next((f for f, alias in aliases.items() if alias == name), None)
    accepts = f"; accepts {accepts_text(HeartbeatEnvironment.model_fields[field_name])}" if field_name else ""
    return f"{name}={raw.get(name, error.get('input'))!r}: {message}{accepts}"


def accepts_text(info: FieldInfo) -> str:
    """What a field accepts, with its bounds (``a whole number, at least 1``)."""
    parts = [m.text for m in info.metadata if isinstance(m, _Accepts)]
    for meta in info.metadata:
        for attr, word in (("ge", "at least"), ("gt", "greater than"), ("le", "at most"), ("lt", "less than")):
            if getattr(meta, attr, None) is not None:
                parts.append(f"{word} {getattr(meta, attr):g}")
    return ", ".join(parts) or "text"


#: deprecated names already warned about in this process (one line each, not one per load)
_warned: list[str] = []


def _run_policy_file(env: HeartbeatEnvironment) -> Path | None:
    """HEARTBEAT_RUN_POLICY, else its deprecated name HEARTBEAT_RETRY_POLICY (one warning per process
    whenever the old name is set, also when the new one wins)."""
    if env.retry_policy is not None and "HEARTBEAT_RETRY_POLICY" not in _warned:
        _warned.append("HEARTBEAT_RETRY_POLICY")
        log.warning("HEARTBEAT_RETRY_POLICY is deprecated; use HEARTBEAT_RUN_POLICY")
    return env.run_policy or env.retry_policy


def load_settings(
    *,
    lakehouse_dir: str | None = None,
    target: str | None = None,
    config_csv: str | None = None,
    jobs_file: str | None = None,
    trigger_dir: str | None = None,
    sources_file: str | None = None,
    jobs_backend: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve settings: explicit arguments, then HEARTBEAT_* variables, then defaults.

    SettingsError (an InvalidInputError) lists every invalid variable at once.
    """
    flags = {"HEARTBEAT_HOME": lakehouse_dir, "HEARTBEAT_TARGET": target, "HEARTBEAT_CONFIG": config_csv,
             "HEARTBEAT_JOBS_FILE": jobs_file, "HEARTBEAT_TRIGGER_DIR": trigger_dir,
             "HEARTBEAT_SOURCES_FILE": sources_file, "HEARTBEAT_JOBS_BACKEND": jobs_backend}
    environ = dict(os.environ if env is None else env)
    environ.update({name: value for name, value in flags.items() if value})
    return settings_from(read_environment(environ))


#: the run-policy file a deployed project holds (found without HEARTBEAT_RUN_POLICY, see _deployed_run_policy)
DEPLOYED_RUN_POLICY = "heartbeat_run_policy.yml"


def _deployed_run_policy(env: HeartbeatEnvironment) -> Path | None:
    """``<HEARTBEAT_PROJECT_DIR>/heartbeat_run_policy.yml`` when that variable is set and the file exists: a job
    cluster gets the project as the bundle synced it (HEARTBEAT_PROJECT_DIR), not a path to set per file.
    Only an explicit project folder counts: the package's own folder never turns policies on by itself."""
    if env.project_dir is None:
        return None
    candidate = env.project_dir / DEPLOYED_RUN_POLICY
    return candidate if candidate.is_file() else None


def settings_from(env: HeartbeatEnvironment) -> Settings:
    """The ``Settings`` record of a validated environment."""
    return Settings(
        lakehouse_dir=env.home or Path(".heartbeat").resolve(),
        project_dir=env.project_dir or package_project_dir(),
        dbt_parse_cache=env.dbt_parse_cache,
        target=env.target,
        schema=env.schema_name,
        catalog=env.catalog,
        upstream_schema=env.upstream_schema,
        config_csv=env.config,
        jobs_file=env.jobs_file,
        trigger_dir=env.trigger_dir,
        sources_file=env.sources_file,
        jobs_backend=env.jobs_backend,
        max_workers=env.max_workers,
        sensor_timeout_s=env.sensor_timeout,
        replay_new_sensors=env.replay_new_sensors,
        spark_mode=env.spark_mode,
        spark_dir=env.spark_dir,
        spark_driver_memory=env.spark_driver_memory or default_driver_memory(),
        max_run_duration_s=env.max_run_duration,
        cancel_overdue_runs=env.cancel_overdue_runs,
        run_policy_file=_run_policy_file(env) or _deployed_run_policy(env),
        run_policy_variable="HEARTBEAT_RUN_POLICY" if env.run_policy or not env.retry_policy else "HEARTBEAT_RETRY_POLICY",
        idle_flush_s=env.idle_flush,
        maintenance=MaintenancePolicy(
            compact_min_files=env.maintenance_max_files, vacuum_retention_hours=env.vacuum_retention_hours,
            report_keep_hours=env.report_keep_hours, archive_retention_days=env.archive_retention_days),
        auto_maintenance=env.maintenance,
        folds=env.folds,
        archive_margin_minutes=env.archive_margin_minutes,
        jobs_api=jobs_api_limits(env),
        memory=MemoryPolicy(
            engine_recycle_ticks=env.engine_recycle_ticks, engine_max_rss_mb=env.engine_max_rss_mb,
            engine_park_after_s=env.engine_park_after, idle_flush_parked_s=env.idle_flush_parked,
            max_rss_mb=env.max_rss_mb, engine_max_rss_set="engine_max_rss_mb" in env.model_fields_set,
            max_rss_set="max_rss_mb" in env.model_fields_set),
        lease_ttl_s=env.lease_ttl,
        lease_wait_s=env.lease_wait,
        max_removal_share=env.max_removal_share,
        shutdown_grace_s=env.shutdown_grace,
        spark_jars_dir=env.spark_jars_dir,
        ui_operators=env.ui_operators,
        catalog_look_skip=env.catalog_look_skip,
        ui_operator_groups=env.ui_operator_groups,
        databricks_http_timeout_s=env.databricks_http_timeout,
        databricks_retry_timeout_s=max(1, round(env.databricks_retry_timeout)),
        job_run_id=env.job_run_id,
        metrics_port=env.metrics_port,
        metrics_host=env.metrics_host,
        log_format=env.log_format,
        wakeups=env.wakeups,
        wake_port=env.wake_port,
        wake_host=env.wake_host,
        wake_token=env.wake_token,
        lineage_namespace=env.lineage_namespace,
        timezone=env.timezone,
        ui_url=env.ui_url,
    )


def jobs_api_limits(env: HeartbeatEnvironment | Mapping[str, str]) -> JobsApiLimits:
    """JobsApiLimits of a validated environment (or of a raw mapping, validated here)."""
    if not isinstance(env, HeartbeatEnvironment):
        env = read_environment(env)
    return JobsApiLimits(concurrency=env.jobs_api_concurrency, rate_per_s=env.jobs_api_rate,
                         budget_s=env.jobs_api_budget, max_calls=env.jobs_api_max_calls,
                         list_pages=env.jobs_api_list_pages)


# -- the README's settings table ------------------------------------------------------------------

#: the comments around the generated table in README.md
TABLE_START = "<!-- settings-table: generated by heartbeat_runner.core.settings.settings_table; do not edit -->"
TABLE_END = "<!-- /settings-table -->"


def settings_table() -> str:
    """The README's settings table, one row per declared variable: name, default, accepted values, meaning."""
    rows = ["| variable | default | accepts | meaning |", "|---|---|---|---|"]
    for info in HeartbeatEnvironment.model_fields.values():
        rows.append(f"| `{info.validation_alias}` | {_shown_default(info)} | {accepts_text(info)} | {info.description} |")
    return "\n".join(rows)


def _shown_default(info: FieldInfo) -> str:
    extra = info.json_schema_extra
    shown = extra.get("shown_default") if isinstance(extra, dict) else None
    if shown is not None:
        return str(shown)  # written as markdown by the declaration
    default = info.default
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def with_settings_table(text: str) -> str:
    """``text`` (the README) with the generated table between TABLE_START and TABLE_END;
    ValueError when the markers are missing."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {TABLE_START!r} and {TABLE_END!r} are missing")
    return text[:start] + TABLE_START + "\n" + settings_table() + "\n" + text[end:]


def rewrite_settings_table(readme: Path) -> bool:
    """Regenerate the table in ``readme``; True when it changed."""
    before = readme.read_text(encoding="utf-8")
    after = with_settings_table(before)
    if after != before:
        readme.write_text(after, encoding="utf-8")
    return after != before
