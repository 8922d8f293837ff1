"""Wiring: open the engine and build the pieces a command needs, from settings."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from heartbeat_runner.core.errors import HeartbeatError, describe
from heartbeat_runner.core.records import Event, EventType, utcnow
from heartbeat_runner.core.secrets import SecretResolver, redact
from heartbeat_runner.core.settings import Settings, Target
from heartbeat_runner.engines.engine import Engine, open_engine
from heartbeat_runner.jobs.base import JobsBackend
from heartbeat_runner.jobs.registry import build_backend
from heartbeat_runner.lakehouse.control_table import ControlTable
from heartbeat_runner.lakehouse.dbt_invoke import DbtProject
from heartbeat_runner.lakehouse.maintenance import Maintenance
from heartbeat_runner.lakehouse.store import CONTROL, SENSOR_CONFIG, SENSOR_STATE, TABLE_COLUMNS, TableStore
from heartbeat_runner.runner.tick import Heartbeat
from heartbeat_runner.runner.tick_result import TickObserver, TickObservers
from heartbeat_runner.sensing.config import LoadedConfig
from heartbeat_runner.sensing.sources.base import LineageNaming, SenseContext

log = logging.getLogger(__name__)

@dataclass
class App:
    """An open engine plus the table store, dbt project and control table bound to it."""

    settings: Settings
    engine: Engine
    store: TableStore
    dbt: DbtProject
    control: ControlTable

    def require_config(self) -> None:
        if not self.store.exists("heartbeat_control"):
            raise HeartbeatError(
                f"no sensor config is loaded in {self.settings.lakehouse_dir}; run `python -m heartbeat_runner seed` first"
            )

    def lakehouse_problem(self) -> str | None:
        """Why the lakehouse cannot be used any more (the engine does not answer, or one of Heartbeat's
        own tables is gone or unreadable), or None when it can. Asked after a failed tick only.

        Invariant: every table a tick reads or writes is checked: the runner's own, the control table, and the
        dbt-built config seed and sensor state table (those two when they were built: a lakehouse that never
        built one is not unusable for it; moved away after, the catalog still names it and its read fails)."""
        built = [table for table in (SENSOR_CONFIG, SENSOR_STATE) if self.store.exists(table)]
        for table in (*TABLE_COLUMNS, CONTROL, *built):
            if not self.store.exists(table):
                return f"table {self.store.name(table)} does not exist"
            try:
                self.store.probe(table)
            except Exception as exc:  # noqa: BLE001 - any engine error: the table cannot be read
                return f"table {self.store.name(table)} cannot be read: {describe(exc)}"
        return None

    def load_config(self, config: LoadedConfig, *, progress: Callable[[str], None] = lambda message: None) -> None:
        """Load a validated config: the seed, a CONFIG_LOADED audit event, then the models and views."""
        progress(f"loading {len(config.rows)} config row(s)")
        self.dbt.load_seed(config.to_csv())
        self.store.append_events([Event(event_type=EventType.CONFIG_LOADED, run_id="seed",
                                        snapshot_ts=utcnow(), message=str(config.path), rows=len(config.rows))])
        progress("building the control table and views")
        self.control.build_with_views()

    def ensure_views(self) -> bool:
        """The local catalog forgets views at every start: re-create them. True when they were re-created
        from dbt's last compiled SQL (or there is nothing to re-create), False when dbt had to build."""
        if not self.engine.is_local or self.dbt.restore_views():
            return True
        self.dbt.build_all()
        return False

    def recycle_engine(self) -> float:
        """Replace the embedded engine's process with a fresh one (tables registered again, views
        restored by :meth:`restore_after_restart`); return the seconds it took, 0.0 where the engine
        cannot be recycled. Only between ticks: nothing Heartbeat keeps lives in the engine's memory."""
        return self.engine.recycle()

    def restore_after_restart(self) -> bool:
        """What a new embedded engine process must be told besides the tables: the views (the engine
        calls this after each recycle and each wake from parking). True when they were re-created from
        the same compiled SQL, False when dbt had to build them."""
        return not self.store.exists(CONTROL) or self.ensure_views()

    def jobs_backend(self) -> JobsBackend:
        """The backend the settings name: a built-in or an installed plugin (``jobs.registry``)."""
        return build_backend(self.settings)

    def secrets(self) -> SecretResolver:
        """How ``{secret: scope/key}`` is read here: on the databricks target through the session's SQL function
        ``secret()`` (the cluster's own route; the REST route where the session lacks it), elsewhere through
        the REST route with the SDK's auth chain (a client only when a reference is first read)."""
        from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets, SessionSecrets

        if self.settings.target is not Target.DATABRICKS:
            return DatabricksSecrets()
        return SessionSecrets(lambda text, args: self.engine.sql(text, args).collect(), DatabricksSecrets())

    def sense_context(self) -> SenseContext:
        from heartbeat_runner.sensing.connections import load_connections

        return SenseContext(
            engine=self.engine,
            trigger_dir=self.settings.effective_trigger_dir,
            replay_new_sensors=self.settings.replay_new_sensors,
            connections=load_connections(self.settings.effective_sources_file),
            secrets=self.secrets(),
        )

    def heartbeat(self, progress: Callable[[str], None] | None = None, backend: JobsBackend | None = None,
                  before_trigger: Callable[[], None] | None = None) -> Heartbeat:
        """The runner's ticks, with its alert and lineage observers; ``before_trigger`` runs before any jobs API
        call (a loop checks there that it still holds the lease)."""
        self.require_config()
        self.ensure_views()
        from heartbeat_runner.policies.run_policies import check_alert_destinations, load_run_policies
        from heartbeat_runner.runner.alerting import AlertMonitor
        from heartbeat_runner.runner.sequences import Sequences

        policies = load_run_policies(self.settings.run_policy_file)
        check_alert_destinations(self.settings.run_policy_file, policies.alerts)  # before any tick
        jobs = backend or self.jobs_backend()
        ctx = self.sense_context()
        alerts = AlertMonitor(self.store, self.control, jobs, policies.alerts, self.settings.lakehouse_dir,
                              ui_url=self.settings.ui_url)
        lineage = self.lineage_monitor(ctx)
        return Heartbeat(self.store, self.control, jobs, ctx,
                         progress=progress, policies=policies.retry,
                         sequences=Sequences(self.store, policies.catch_up, policies.windows),
                         shaping=policies.trigger,
                         maintenance=self.maintenance(progress) if self.settings.auto_maintenance else None,
                         before_trigger=before_trigger,
                         observer=alerts if lineage is None else TickObservers([alerts, lineage]))

    def lineage_monitor(self, ctx: SenseContext) -> TickObserver | None:
        """The OpenLineage monitor when OpenLineage is configured (docs/lineage.md); None (nothing, no import of
        the client) when it is not."""
        from heartbeat_runner.senders.lineage import lineage_configured

        if not lineage_configured():
            return None
        from heartbeat_runner.runner.lineage import lineage_monitor

        naming = LineageNaming(connections=ctx.connections, trigger_dir=ctx.trigger_dir,
                               table_namespace=table_namespace(self.settings))
        try:
            return lineage_monitor(self.store, self.control, naming, job_namespace=self.settings.lineage_namespace,
                                   backend=self.settings.effective_jobs_backend)
        except ImportError:
            log.warning("OpenLineage is configured but its client is not installed (pip install "
                        "'heartbeat-runner[lineage]'): no lineage is sent")
        except Exception as exc:  # noqa: BLE001 - the client's own configuration (its transport) is unusable
            log.warning("OpenLineage configuration unusable, no lineage is sent: %s", redact(describe(exc)))
        return None

    def maintenance(self, progress: Callable[[str], None] | None = None) -> Maintenance:
        """Maintenance of this lakehouse with the settings' policy."""
        return Maintenance(self.store, self.settings.maintenance, progress=progress or (lambda message: None))


def table_namespace(settings: Settings) -> str:
    """The OpenLineage namespace of upstream tables named by catalog name: the Databricks workspace
    (``databricks://<host>``) on that target, else the engine's catalog (``spark_catalog``)."""
    from urllib.parse import urlsplit

    host = os.environ.get("DATABRICKS_HOST", "")
    if settings.target is Target.DATABRICKS and host:
        return f"databricks://{urlsplit(host if '://' in host else f'https://{host}').hostname or host}"
    return "spark_catalog"


@contextlib.contextmanager
def open_app(settings: Settings, *, port: int = 0, session_id: str | None = None) -> Iterator[App]:
    """Open the engine, make sure the runner's tables exist (the holder of a joined engine did), and
    close everything after."""
    engine = open_engine(settings, port=port, session_id=session_id)
    try:
        store = TableStore(engine)
        if not engine.joined:
            store.ensure_tables()
        dbt = DbtProject(engine)
        app = App(settings=settings, engine=engine, store=store, dbt=dbt, control=ControlTable(store, dbt, folding=settings.folds))
        engine.on_restart = app.restore_after_restart
        yield app
    finally:
        engine.close()
