"""Running dbt in-process against the runner's engine.

On the local target dbt-spark's ``session`` method attaches to the embedded Sail
server (``SPARK_REMOTE``), so dbt and the runner share one catalog. Everything dbt
writes (compiled SQL, logs, the loaded seed) goes under ``<lakehouse>/dbt/``.

dbt runs on ``<lakehouse>/dbt/project``, a folder of links to the project's files, with
the seed and target folders relative to it and the lakehouse's own paths in environment
variables only the macros read when a statement runs. What dbt parses and hashes is then
the same for every lakehouse of one project and engine, so dbt's saved parse
(``target/partial_parse.msgpack``) of one lakehouse serves another: a copied or moved
lakehouse, and a new one when ``HEARTBEAT_DBT_PARSE_CACHE`` names a folder to keep it in.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.files import replace_whole
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.engines.engine import Engine
from heartbeat_runner.engines.engine_errors import EngineUnavailableError
from heartbeat_runner.lakehouse.migrations import add_missing_columns
from heartbeat_runner.lakehouse.store import retry_lost_commits

if TYPE_CHECKING:  # pragma: no cover
    from dbt.cli.main import dbtRunnerResult

log = logging.getLogger(__name__)

CONTROL_MODEL = "heartbeat_control"
SENSOR_STATE_MODEL = "heartbeat_sensor_state"
PROJECT_NAME = "heartbeat"
SEED_NAME = "heartbeat_sensor_config"
#: what dbt parses, besides the seed: a change to any file under these re-parses the project; also what
#: ``<lakehouse>/dbt/project`` links to (link_project)
PROJECT_INPUTS = ("dbt_project.yml", "models", "macros")
#: the seed and target folders as dbt is given them, relative to ``<lakehouse>/dbt/project``
SEED_PATH, TARGET_PATH = "../seed", "../target"
#: dbt's saved parse, in its target folder
PARSE_FILE = "partial_parse.msgpack"
#: where incremental builds stage their MERGE source on engines that ask for it (TableOps.stages_merge_sources)
MERGE_SOURCES = "_merge_sources"
#: a staged MERGE source older than this was left by a dbt process that did not clean up after itself
MERGE_SOURCE_MAX_AGE_S = 3600


class DbtError(HeartbeatError):
    """A dbt command failed; the message lists the failing nodes."""


@dataclass
class DbtProject:
    """The dbt project at ``settings.project_dir``, run inside ``engine``."""

    engine: Engine
    #: (fingerprint of the project's files, the manifest parsed from them), see manifest()
    _parsed: tuple[tuple, Any] | None = field(default=None, repr=False)
    #: the derived tables were given the columns older Heartbeats did not make (see migrate_once)
    _migrated: bool = field(default=False, repr=False)
    #: macro SQL rendered in this process, by key (see macro_sql)
    _rendered: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def settings(self):
        return self.engine.settings

    @property
    def work_dir(self) -> Path:
        return self.settings.lakehouse_dir / "dbt"

    @property
    def seed_dir(self) -> Path:
        return self.work_dir / "seed"

    @property
    def seed_csv(self) -> Path:
        return self.seed_dir / f"{SEED_NAME}.csv"

    @property
    def has_seed(self) -> bool:
        return self.seed_csv.exists()

    @property
    def available(self) -> bool:
        """Whether this process has the dbt project (``dbt_project.yml`` in ``settings.project_dir``). A process
        holding only the wheel (the status page as a Databricks App: HEARTBEAT_PROJECT_DIR unset, so the
        package's folder in site-packages) has none: it appends events and leaves every rebuild to the runner."""
        return (self.settings.project_dir / "dbt_project.yml").is_file()

    def write_profiles(self) -> Path:
        """Copy profiles.example.yml to ``<lakehouse>/dbt/profiles/profiles.yml``; return the folder."""
        profiles = self.work_dir / "profiles"
        profiles.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.settings.project_dir / "profiles.example.yml", profiles / "profiles.yml")
        return profiles

    def _profiles_dir(self) -> Path:
        explicit = os.environ.get("DBT_PROFILES_DIR")
        return Path(explicit) if explicit else self.write_profiles()

    def link_project(self) -> Path:
        """``<lakehouse>/dbt/project``: links to the project's ``PROJECT_INPUTS``, made or moved to the project
        folder of the settings now (a redeployed project, a lakehouse copied elsewhere). Each link is replaced
        whole, so a concurrent dbt call sees the old link or the new one."""
        linked = self.work_dir / "project"
        linked.mkdir(parents=True, exist_ok=True)
        for name in PROJECT_INPUTS:
            target, link = self.settings.project_dir / name, linked / name
            with contextlib.suppress(OSError):
                if os.readlink(link) == str(target):
                    continue
            staged = linked / f".{name}.{os.getpid()}.{threading.get_ident()}"
            staged.unlink(missing_ok=True)
            staged.symlink_to(target)
            if link.is_dir() and not link.is_symlink():  # a copy that followed the links: a folder, not a link
                with contextlib.suppress(FileNotFoundError):  # another process moved it first
                    link.rename(aside := staged.with_name(staged.name + ".old"))
                    shutil.rmtree(aside, ignore_errors=True)
            os.replace(staged, link)
        return linked

    def _cli_vars(self) -> str:
        """The ``--vars`` of every dbt call: fixed by the engine and the archive margin, never by the lakehouse."""
        return json.dumps({"heartbeat_archive_margin_minutes": self.settings.archive_margin_minutes,
                           "heartbeat_stage_events": self.engine.ops.stage_events,
                           "heartbeat_change_feed": self.engine.ops.writes_change_feed,
                           "heartbeat_list_by_name": self.engine.ops.lists_relations_by_name}, sort_keys=True)

    def _compiled_key(self, *extra: str) -> str:
        """What SQL dbt compiles from this project depends on: its files, the target, the schema and catalog (the
        relation names), the vars, and ``extra``; never the lakehouse's own paths."""
        return hashlib.sha256("\0".join([self.project_digest(), self.settings.target.value, self.settings.schema,
                                         self.settings.catalog or "", self._cli_vars(), *extra]).encode()).hexdigest()

    def _parse_cache(self) -> Path | None:
        """Where dbt's saved parse for this project, engine and schema is kept for new lakehouses
        (``HEARTBEAT_DBT_PARSE_CACHE``; None: not kept). dbt itself checks a saved parse against the project's
        files, the vars, the target and its own version, and parses again what differs."""
        root = self.settings.dbt_parse_cache
        if root is None:
            return None
        return root / f"{self._compiled_key()[:24]}.msgpack"

    def _prime_parse(self, cached: Path | None) -> None:
        """A lakehouse without dbt's saved parse starts from the kept one (a parse of ~0.1 s instead of ~1.5 s)."""
        saved = self.work_dir / "target" / PARSE_FILE
        if cached is not None and cached.is_file() and not saved.exists():
            saved.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(cached, saved)

    def _keep_parse(self, cached: Path | None) -> None:
        """Keep this lakehouse's saved parse for new ones (written whole: readers see an old one or this)."""
        saved = self.work_dir / "target" / PARSE_FILE
        if cached is None or cached.exists() or not saved.is_file():
            return
        with contextlib.suppress(OSError):
            cached.parent.mkdir(parents=True, exist_ok=True)
            staged = cached.with_name(f".{cached.name}.{os.getpid()}.{threading.get_ident()}")
            shutil.copyfile(saved, staged)
            os.replace(staged, cached)

    @contextlib.contextmanager
    def _environment(self, stage_root: Path | None, full_history: bool) -> Iterator[None]:
        """dbt reads env_var() from os.environ; set ours for the call, then restore. The seed and target folders
        are relative to the linked project (link_project), the same for every lakehouse; the lakehouse's own
        paths and the full-history switch are read by the macros when a statement runs, never while dbt parses
        (macros/engine_overrides.sql, heartbeat_helpers.sql); ``stage_root``: where incremental models stage their
        MERGE source (None: they do not)."""
        local = self.engine.is_local
        values = {
            "HEARTBEAT_SEED_DIR": SEED_PATH,
            "HEARTBEAT_DBT_TARGET_PATH": TARGET_PATH,
            "HEARTBEAT_LOCATION_ROOT": str(self.settings.warehouse_dir / self.settings.schema) if local else "",
            "HEARTBEAT_MERGE_STAGE_ROOT": str(stage_root or ""),
            "HEARTBEAT_SEED_FILE": str(self.seed_csv) if self.engine.ops.seeds_from_file else "",
            "HEARTBEAT_FULL_HISTORY": "true" if full_history else "",
            "HEARTBEAT_SCHEMA": self.settings.schema,
            "HEARTBEAT_TARGET": self.settings.target.value,
            "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
        }
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def invoke(self, args: list[str], *, quiet: bool = True, reuse_manifest: bool = False,
               full_history: bool = False, artifacts: bool = False) -> dbtRunnerResult:
        """Run one dbt command; raise DbtError naming what failed. ``full_history``: the models read the
        archive with the hot log (the full-rebuild path).

        ``reuse_manifest`` skips dbt's parse by running on :meth:`manifest` (the runner's own builds).
        dbt's manifest.json and run_results.json are written only with ``artifacts`` (a user's own dbt
        command): nothing of Heartbeat reads them, and writing the manifest took ~0.7 s a call. dbt's saved
        parse (partial_parse.msgpack) and the compiled SQL (target/run, read by restore_views) are written
        either way."""
        from dbt.cli.main import dbtRunner

        manifest = self.manifest() if reuse_manifest else None

        stage_root = merge_stage_dir(self.settings) if self.engine.ops.stages_merge_sources else None
        cli_vars = self._cli_vars()
        full = [
            *args,
            "--project-dir", str(self.link_project()),
            "--profiles-dir", str(self._profiles_dir()),
            "--target", self.settings.target.value,
            "--vars", cli_vars,
            "--log-path", str(self.work_dir / "logs"),
        ]
        if quiet:
            full += ["--quiet", "--no-use-colors"]
        if not artifacts:
            full.append("--no-write-json")
        cached = None if manifest is not None else self._parse_cache()
        self._prime_parse(cached)
        started = time.monotonic()
        self.engine.touch()  # a parked engine starts now: dbt finds the server through the default session
        self.engine.generation += 1  # dbt may re-create views: cached reads of them are stale
        try:
            with self._environment(stage_root, full_history):
                result = dbtRunner(manifest=manifest).invoke(full)
        finally:
            self.engine.touch()  # dbt used the engine until now
        if stage_root is not None:
            _remove_merge_sources(stage_root)
        log.debug("dbt %s took %.2fs", " ".join(args), time.monotonic() - started)
        if not result.success:
            raise DbtError(_failure_summary(args, result))
        self._keep_parse(cached)
        return result

    def manifest(self) -> Any:
        """The parsed project, kept between dbt calls of this process (parsing costs ~0.5-5 s).

        Parsed again when a project file or the seed changes. ``--vars`` and the
        environment dbt reads are fixed per project, so they cannot go stale.
        """
        if self._parsed is None:
            self.restore_seed_file()
        fingerprint = self._fingerprint()
        if self._parsed is None or self._parsed[0] != fingerprint:
            self._parsed = (fingerprint, self.invoke(["parse"]).result)
        return self._parsed[1]

    def _fingerprint(self) -> tuple:
        root = self.settings.project_dir
        files = [self.seed_csv, *(p for name in PROJECT_INPUTS for p in _files(root / name))]
        return tuple((str(p), s.st_mtime_ns, s.st_size) for p in files if (s := _stat(p)) is not None)

    def restore_seed_file(self) -> bool:
        """Write the local copy of the loaded config from the seed table when this machine has none (a runner
        on Databricks starts on a new job cluster, with an empty local disk, at every scheduled run): the
        models ``ref`` the seed, so dbt's project needs its file. The table is what was loaded; it is not
        loaded again. True when a copy was written."""
        if self.has_seed:
            return False
        name = self.engine.table(SEED_NAME)
        if not self.engine.table_exists(name):
            return False
        frame = self.engine.spark.table(name)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(frame.columns)
        writer.writerows(["" if value is None else value for value in row] for row in frame.collect())
        self.seed_dir.mkdir(parents=True, exist_ok=True)
        replace_whole(self.seed_csv, out.getvalue())
        log.info("wrote the loaded config from %s to %s (a new machine)", name, self.seed_csv)
        return True

    def load_seed(self, normalized_csv: str) -> None:
        """Load the (already validated) config as the seed table."""
        self.seed_dir.mkdir(parents=True, exist_ok=True)
        staged = self.seed_csv.with_suffix(".csv.new")
        staged.write_text(normalized_csv, encoding="utf-8")
        previous = self.seed_csv.read_text(encoding="utf-8") if self.seed_csv.exists() else None
        os.replace(staged, self.seed_csv)
        try:
            self.invoke(["seed", "--select", SEED_NAME])
        except DbtError:
            if previous is None:
                self.seed_csv.unlink(missing_ok=True)
            else:
                self.seed_csv.write_text(previous, encoding="utf-8")
            raise
        self.engine.ensure_registered(f"{self.settings.schema}.{SEED_NAME}")

    def migrate_once(self) -> None:
        """Before this process's first build, fold or view restore: give tables an older Heartbeat made the
        columns the models gained since (lakehouse/migrations.py), so that a build fills them rather
        than drops them and views can read them. A metadata commit per such table, once; no row changes."""
        if not self._migrated:
            add_missing_columns(self.engine, self.settings.schema)
            self._migrated = True

    def _build(self, *models: str) -> None:
        """Run the runner's own models. They are derived (the MERGE recomputes every row), so a build that
        lost a Delta commit race to another writer, or hit a transient Spark Connect error, is simply run
        again."""
        self.migrate_once()
        retry_lost_commits(lambda: self.invoke(["run", "--select", *models], reuse_manifest=True),
                           f"dbt build of {', '.join(models)}", also=(EngineUnavailableError,))

    def build_control(self) -> None:
        """Rebuild the control table (incremental MERGE) and the sensor state table from the seed and the events."""
        self._build(CONTROL_MODEL, SENSOR_STATE_MODEL)

    def build_control_only(self) -> None:
        """Rebuild the control table alone (the sensor state table is left for a later build)."""
        self._build(CONTROL_MODEL)

    def macro_sql(self, macro: str, *args: str) -> str:
        """The SQL the project's ``macro`` renders to with ``args`` (names, not values: values reach such SQL
        as a temporary view's rows, see TableStore.merge_rows), for the runner to run without a dbt command.

        Rendered by ``dbt compile --inline`` once, then kept in this process and in ``<lakehouse>/dbt/``
        keyed on what it depends on: the project's files (a changed macro renders again), the vars, the target, the
        catalog and the schema (the relation names in it), never the lakehouse's paths. A cold process reads it
        back rather than start dbt for it; a new lakehouse reads it from ``HEARTBEAT_DBT_PARSE_CACHE`` when set
        (a render costs ~0.7 s)."""
        if not all(name.isidentifier() for name in (macro, *args)):
            raise ValueError(f"not a macro call of names: {macro}{args}")
        call = f"{{{{ {macro}({', '.join(repr(a) for a in args)}) }}}}"
        key = self._compiled_key(call)
        if (found := self._rendered.get(key)) is not None:
            return found
        path = self.work_dir / "rendered" / f"{'-'.join([macro, *args])}.json"  # args are names: safe in a file name
        kept = self.settings.dbt_parse_cache / "rendered" / f"{key}.json" if self.settings.dbt_parse_cache else None
        sql = saved = _saved_sql(path, key)
        if sql is None and kept is not None:
            sql = _saved_sql(kept, key)
        if sql is None:
            sql = self._render(call)
            if kept is not None:
                with contextlib.suppress(OSError):  # a cache for others: this lakehouse does without it
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    replace_whole(kept, json.dumps({"key": key, "sql": sql}))
        if saved is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_whole(path, json.dumps({"key": key, "sql": sql}))
        self._rendered[key] = sql
        return sql

    def _render(self, call: str) -> str:
        """What dbt compiles the Jinja ``call`` to, with the project's macros and relations."""
        # --log-level none: compile prints what it rendered, --quiet or not
        result = self.invoke(["compile", "--inline", call, "--no-populate-cache", "--log-level", "none"],
                             reuse_manifest=True)
        compiled: Any = result.result  # a RunExecutionResult of one inline node
        return str(compiled.results[0].node.compiled_code)

    def rebuild_from_all_events(self) -> None:
        """The full-rebuild path: re-derive every row from every event ever recorded (hot log and
        archive). It gives the same table as the normal build (tests/test_growth.py checks that);
        use it after restoring an archive, or to check a lakehouse by hand."""
        crash_point(FaultPoint.DURING_DBT_BUILD)
        self.migrate_once()
        retry_lost_commits(lambda: self.invoke(["run", "--select", CONTROL_MODEL, SENSOR_STATE_MODEL],
                                               full_history=True),
                           "dbt rebuild from all events", also=(EngineUnavailableError,))

    def build_all(self) -> None:
        """Build the control and sensor state tables and (re)create the views. Records the views' dependency
        order (from dbt's manifest) for :meth:`restore_views`; what the build includes is ControlTable's to mark.

        On a local engine, views whose SQL dbt compiled before from the same project, target, schema, catalog
        and vars (this lakehouse's, or one kept in ``HEARTBEAT_DBT_PARSE_CACHE``) are created from that SQL, as
        :meth:`restore_views` does at every start, and dbt builds the two tables alone (a view through dbt costs
        its materialization's statements; its SQL is the same)."""
        views = view_models(self.manifest())
        key = self._compiled_key()
        if self.engine.is_local and self._take_kept_views(views, key):
            self._build(CONTROL_MODEL, SENSOR_STATE_MODEL)
            replace_whole(self._view_order, json.dumps({"key": key, "views": views}))
            if self.restore_views():
                return
        self._build(CONTROL_MODEL, SENSOR_STATE_MODEL, *views)
        replace_whole(self._view_order, json.dumps({"key": key, "views": views}))
        self._keep_views(views, key)

    @property
    def _compiled_dir(self) -> Path:
        """Where dbt leaves the SQL it ran for each model (a view's: its ``create or replace view``)."""
        return self.work_dir / "target" / "run" / PROJECT_NAME / "models"

    def _kept_views_dir(self, key: str) -> Path | None:
        root = self.settings.dbt_parse_cache
        return root / "views" / key[:24] if root is not None else None

    def _take_kept_views(self, views: list[str], key: str) -> bool:
        """Whether every view's SQL compiled under ``key`` is at hand: this lakehouse's last build, or else the
        kept one (copied in)."""
        if self._compiled_views() == views and all((self._compiled_dir / f"{v}.sql").exists() for v in views):
            return True
        kept = self._kept_views_dir(key)
        if kept is None or not all((kept / f"{v}.sql").is_file() for v in views):
            return False
        self._compiled_dir.mkdir(parents=True, exist_ok=True)
        for view in views:
            shutil.copyfile(kept / f"{view}.sql", self._compiled_dir / f"{view}.sql")
        return True

    def _keep_views(self, views: list[str], key: str) -> None:
        """Keep the views' compiled SQL for new lakehouses (a folder made whole: readers see all of it or none)."""
        kept = self._kept_views_dir(key)
        if kept is None or kept.is_dir():
            return
        staged = kept.with_name(f".{kept.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            staged.mkdir(parents=True, exist_ok=True)
            for view in views:
                shutil.copyfile(self._compiled_dir / f"{view}.sql", staged / f"{view}.sql")
            os.replace(staged, kept)
        except OSError:  # another process kept it first, or the cache is not writable: a cache, not needed
            shutil.rmtree(staged, ignore_errors=True)

    @property
    def _view_order(self) -> Path:
        """The views in creation order and the key of what they were compiled from (:meth:`_compiled_key`)."""
        return self.work_dir / "view_models.json"

    def project_digest(self) -> str:
        """What the views' SQL is compiled from (dbt_project.yml, models, macros), by content: a reinstall
        of the same Heartbeat keeps it, an upgrade that changes any of them does not."""
        root = self.settings.project_dir
        digest = hashlib.sha256()
        for path in (p for name in PROJECT_INPUTS for p in _files(root / name)):
            digest.update(f"{path.relative_to(root)}\0{len(data := path.read_bytes())}\0".encode())
            digest.update(data)
        return digest.hexdigest()

    def _compiled_views(self) -> list[str] | None:
        """The views of the last :meth:`build_all`, in creation order, when their compiled SQL is from this
        project as it is now; None otherwise (never built, or built by a Heartbeat whose models differ). A
        process without the project (:attr:`available`) takes them as the process that has it last built them."""
        try:
            record = json.loads(self._view_order.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        if self.available and record.get("key") != self._compiled_key():
            return None  # compiled from other files or vars (or recorded by a Heartbeat that kept no key)
        return [str(name) for name in record.get("views", [])]

    def test_seed(self) -> None:
        self.invoke(["test", "--select", SEED_NAME], quiet=False)

    def restore_views(self) -> bool:
        """Re-create the views from dbt's last compiled SQL (the local catalog forgets them).

        Returns False when there is nothing compiled yet, or when it was compiled from another
        version of the project (an upgraded Heartbeat whose models or macros changed, a new model
        among them): build_all() is then needed, so a changed view is never re-created from its old SQL.
        """
        compiled = self._compiled_dir
        views = self._compiled_views()
        if views is None:
            return False
        self.migrate_once()  # the views may read columns an older Heartbeat's tables lack
        statements = [compiled / f"{name}.sql" for name in views]
        if not all(p.exists() for p in statements):
            return False
        self.engine.generation += 1
        for path in statements:
            self.engine.sql(path.read_text(encoding="utf-8"))
        return True


def _saved_sql(path: Path, key: str) -> str | None:
    """The SQL saved at ``path`` under ``key`` (see DbtProject.macro_sql), or None (none, or another key's)."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if isinstance(record, dict) and record.get("key") == key and isinstance(record.get("sql"), str):
        return str(record["sql"])
    return None


def view_models(manifest: Any) -> list[str]:
    """The project's view models, each after the views it reads (dbt's dependency graph, from its manifest)."""
    views = {uid: node for uid, node in manifest.nodes.items()
             if node.resource_type == "model" and node.package_name == PROJECT_NAME
             and node.config.materialized == "view"}
    order: list[str] = []
    placed: set[str] = set()

    def place(uid: str) -> None:
        if uid in placed:
            return
        placed.add(uid)
        for dependency in sorted(views[uid].depends_on.nodes):
            if dependency in views:
                place(dependency)
        order.append(views[uid].name)

    for uid in sorted(views):
        place(uid)
    return order


def merge_stage_dir(settings: Settings) -> Path:
    """Where dbt stages incremental MERGE sources (one folder per dbt invocation) on engines that do."""
    return settings.warehouse_dir / settings.schema / MERGE_SOURCES


def _remove_merge_sources(base: Path) -> None:
    """Delete the MERGE sources the last dbt command staged, and stale ones other processes left."""
    from dbt_common.invocation import get_invocation_id

    if not base.is_dir():
        return
    stale_before = time.time() - MERGE_SOURCE_MAX_AGE_S
    for entry in base.iterdir():
        with contextlib.suppress(FileNotFoundError):
            if entry.name == get_invocation_id() or entry.stat().st_mtime < stale_before:
                shutil.rmtree(entry, ignore_errors=True)


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


#: Spark Connect errors seen once in a while under load (a re-run succeeds). The last one is
#: PySpark's process-wide pool for ReleaseExecute calls, shut down by any session's ``stop()``
#: while another session of the process is between two queries (seen once in CI, in a dbt build).


def _failure_summary(args: list[str], result: object) -> str:
    lines = [f"dbt {' '.join(args)} failed"]
    exception = getattr(result, "exception", None)
    if exception is not None:
        lines.append(str(exception))
    for node in getattr(getattr(result, "result", None), "results", None) or []:
        status = str(getattr(node, "status", ""))
        if status.lower() in ("error", "fail", "runtime error"):
            name = getattr(getattr(node, "node", None), "name", "?")
            lines.append(f"  {name}: {getattr(node, 'message', '')}")
    return "\n".join(lines)
