"""Runner settings, resolved once from CLI flags and the environment (flags win)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from heartbeat_runner.core.names import TextEnum


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


@dataclass(frozen=True)
class Settings:
    """Everything a command needs to know about where things live and how to run."""

    lakehouse_dir: Path
    project_dir: Path
    target: Target = Target.LOCAL
    schema: str = "heartbeat"
    catalog: str | None = None
    #: where a bare upstream table name (``orders``) is resolved; None: ``default`` locally,
    #: the session's current schema on Spark and Databricks
    upstream_schema: str | None = None
    config_csv: Path | None = None
    jobs_file: Path | None = None
    trigger_dir: Path | None = None
    sources_file: Path | None = None
    #: a JobsBackendKind's value or a plugin's name (resolved by the runner, which knows the plugins)
    jobs_backend: str | None = None
    max_workers: int = 8
    sensor_timeout_s: float = 60.0
    replay_new_sensors: bool = False
    #: the spark-local target: ``classic`` (a SparkSession in this process, as on a job cluster)
    #: or ``connect`` (a local Spark Connect server, as serverless); where it keeps its metastore
    #: and warehouse (default ``<lakehouse>/spark``)
    spark_mode: str = "classic"
    spark_dir: Path | None = None
    #: runs longer than this are reported each tick (None: no limit)
    max_run_duration_s: float | None = None
    #: ... and cancelled, when the backend can cancel runs
    cancel_overdue_runs: bool = False
    #: YAML with automatic retry policies per job (off when absent)
    retry_policy_file: Path | None = None
    #: idle ticks (nothing new, nothing done) are summarised in one run row at most this often
    idle_flush_s: float = 600.0
    #: how maintenance archives, compacts and expires (``maintain``, and ticks when auto_maintenance)
    maintenance: MaintenancePolicy = field(default_factory=MaintenancePolicy)
    #: ticks that wrote run maintenance when it is due (HEARTBEAT_MAINTENANCE=off: only ``maintain`` does)
    auto_maintenance: bool = True
    #: events younger than this always stay in the hot log (a margin for clocks of other writers)
    archive_margin_minutes: float = 10.0
    #: bounds of the jobs API calls of one tick
    jobs_api: JobsApiLimits = field(default_factory=JobsApiLimits)
    #: how the embedded engine's process is recycled between ticks (and ``ui`` reads), and the
    #: ceiling after which ``run --loop`` restarts itself (see docs/memory.md)
    memory: MemoryPolicy = field(default_factory=lambda: MemoryPolicy())

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
            env.update(HEARTBEAT_SPARK_MODE=self.spark_mode, HEARTBEAT_SPARK_DIR=str(self.effective_spark_dir))
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
        for candidate in (Path.cwd() / "heartbeat_sources.yml", self.lakehouse_dir / "heartbeat_sources.yml"):
            if candidate.exists():
                return candidate
        return None

    @property
    def effective_jobs_backend(self) -> str:
        if self.jobs_backend:
            return self.jobs_backend
        return (JobsBackendKind.DATABRICKS if self.target is Target.DATABRICKS else JobsBackendKind.LOCAL).value

    def with_(self, **changes) -> Settings:
        return replace(self, **changes)


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser().resolve() if value else None


def load_settings(
    *,
    lakehouse_dir: str | None = None,
    target: str | None = None,
    config_csv: str | None = None,
    jobs_file: str | None = None,
    trigger_dir: str | None = None,
    sources_file: str | None = None,
    jobs_backend: str | None = None,
    env: dict[str, str] | None = None,
) -> Settings:
    """Resolve settings: explicit arguments, then HEARTBEAT_* variables, then defaults."""
    env = dict(os.environ if env is None else env)
    chosen = Target(_choice(target or env.get("HEARTBEAT_TARGET") or Target.LOCAL.value, TARGETS, "target"))
    schema = validate_identifier(env.get("HEARTBEAT_SCHEMA", "heartbeat"), "HEARTBEAT_SCHEMA")
    catalog = env.get("HEARTBEAT_CATALOG") or None
    if catalog:
        validate_identifier(catalog, "HEARTBEAT_CATALOG")
    upstream_schema = env.get("HEARTBEAT_UPSTREAM_SCHEMA") or None
    if upstream_schema:
        for part in upstream_schema.split(".", 1):
            validate_identifier(part, "HEARTBEAT_UPSTREAM_SCHEMA")
    backend = (jobs_backend or env.get("HEARTBEAT_JOBS_BACKEND") or "").strip() or None
    if backend is not None:
        validate_identifier(backend, "jobs backend")
    return Settings(
        lakehouse_dir=_path(lakehouse_dir or env.get("HEARTBEAT_HOME")) or Path(".heartbeat").resolve(),
        project_dir=_path(env.get("HEARTBEAT_PROJECT_DIR")) or package_project_dir(),
        target=chosen,
        schema=schema,
        catalog=catalog,
        upstream_schema=upstream_schema,
        config_csv=_path(config_csv or env.get("HEARTBEAT_CONFIG")),
        jobs_file=_path(jobs_file or env.get("HEARTBEAT_JOBS_FILE")),
        trigger_dir=_path(trigger_dir or env.get("HEARTBEAT_TRIGGER_DIR")),
        sources_file=_path(sources_file or env.get("HEARTBEAT_SOURCES_FILE")),
        jobs_backend=backend,
        max_workers=int(env.get("HEARTBEAT_MAX_WORKERS", "8")),
        sensor_timeout_s=float(env.get("HEARTBEAT_SENSOR_TIMEOUT", "60")),
        replay_new_sensors=_flag(env.get("HEARTBEAT_REPLAY_NEW_SENSORS")),
        spark_mode=_choice(env.get("HEARTBEAT_SPARK_MODE") or "classic", ("classic", "connect"), "HEARTBEAT_SPARK_MODE"),
        spark_dir=_path(env.get("HEARTBEAT_SPARK_DIR")),
        max_run_duration_s=float(env["HEARTBEAT_MAX_RUN_DURATION"]) if env.get("HEARTBEAT_MAX_RUN_DURATION") else None,
        cancel_overdue_runs=_flag(env.get("HEARTBEAT_CANCEL_OVERDUE_RUNS")),
        retry_policy_file=_path(env.get("HEARTBEAT_RETRY_POLICY")),
        idle_flush_s=float(env.get("HEARTBEAT_IDLE_FLUSH", "600")),
        maintenance=_maintenance_policy(env),
        auto_maintenance=(env.get("HEARTBEAT_MAINTENANCE") or "on").strip().lower() not in ("off", "false", "0", "no"),
        archive_margin_minutes=float(env.get("HEARTBEAT_ARCHIVE_MARGIN_MINUTES", "10")),
        jobs_api=jobs_api_limits(env),
        memory=_memory_policy(env),
    )


def _memory_policy(env: dict[str, str]) -> MemoryPolicy:
    default = MemoryPolicy()
    return MemoryPolicy(
        engine_recycle_ticks=int(_number(env, "HEARTBEAT_ENGINE_RECYCLE_TICKS", default.engine_recycle_ticks)),
        engine_max_rss_mb=_number(env, "HEARTBEAT_ENGINE_MAX_RSS_MB", default.engine_max_rss_mb),
        engine_park_after_s=_number(env, "HEARTBEAT_ENGINE_PARK_AFTER_S", default.engine_park_after_s),
        idle_flush_parked_s=_number(env, "HEARTBEAT_IDLE_FLUSH_PARKED", default.idle_flush_parked_s),
        max_rss_mb=_number(env, "HEARTBEAT_MAX_RSS_MB", default.max_rss_mb),
    )


def _number(env: dict[str, str], name: str, default: float) -> float:
    """A non-negative number from the environment (0: off), or a clear error naming the variable."""
    text = (env.get(name) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name}={text!r} is not a non-negative number (0 turns it off)")
    return value


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


def jobs_api_limits(env: dict[str, str]) -> JobsApiLimits:
    """JobsApiLimits from HEARTBEAT_JOBS_API_* variables (defaults for the ones not set); each must be > 0."""
    default = JobsApiLimits()
    return JobsApiLimits(
        concurrency=int(_positive(env, "HEARTBEAT_JOBS_API_CONCURRENCY", default.concurrency)),
        rate_per_s=_positive(env, "HEARTBEAT_JOBS_API_RATE", default.rate_per_s),
        budget_s=_positive(env, "HEARTBEAT_JOBS_API_BUDGET", default.budget_s),
        max_calls=int(_positive(env, "HEARTBEAT_JOBS_API_MAX_CALLS", default.max_calls)),
        list_pages=int(_positive(env, "HEARTBEAT_JOBS_API_LIST_PAGES", default.list_pages)),
    )


def _positive(env: dict[str, str], name: str, default: float) -> float:
    text = (env.get(name) or "").strip()
    try:
        value = float(text) if text else float(default)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"{name}={text!r} is not a positive number")
    return value


def _maintenance_policy(env: dict[str, str]) -> MaintenancePolicy:
    retention = env.get("HEARTBEAT_ARCHIVE_RETENTION_DAYS")
    return MaintenancePolicy(
        compact_min_files=int(env.get("HEARTBEAT_MAINTENANCE_MAX_FILES", "32")),
        vacuum_retention_hours=float(env.get("HEARTBEAT_VACUUM_RETENTION_HOURS", "1")),
        report_keep_hours=float(env.get("HEARTBEAT_REPORT_KEEP_HOURS", "24")),
        archive_retention_days=float(retention) if retention else None,
    )
