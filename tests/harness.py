"""A test harness around the real app: a temp lakehouse, real Sail + Delta, real dbt, real jobs."""

from __future__ import annotations

import sys
import textwrap
import time
from contextlib import ExitStack
from pathlib import Path

from heartbeat_runner.app import App, open_app
from heartbeat_runner.config import COLUMNS, load_config
from heartbeat_runner.jobs.local import LocalJobsBackend
from heartbeat_runner.records import Event, EventType, utcnow
from heartbeat_runner.settings import load_settings
from heartbeat_runner.tick import Heartbeat, TickResult

HEADER = ",".join(COLUMNS)


def config_row(source: str, sensor_id: str, job: str, *, hard: str = "TRUE", state: str = "UNPAUSED",
               key: str = "", query: str = "", read_type: str = "batch", name: str | None = None) -> str:
    """One CSV line in the column order of COLUMNS."""
    query_cell = '"' + query.replace('"', '""') + '"' if query else ""
    return ",".join([source, sensor_id, read_type, f"{sensor_id} data", key, query_cell, job, name or f"job_{job}",
                     state, hard])


class Harness:
    """Drives Heartbeat in-process on a temporary lakehouse."""

    def __init__(self, root: Path, **settings_env: str):
        self.root = root
        self.home = root / "lakehouse"
        self.config_path = root / "config.csv"
        self.jobs_path = root / "heartbeat_jobs.yml"
        self.jobs_path.write_text("jobs: {}\n")
        self.settings = load_settings(lakehouse_dir=str(self.home), config_csv=str(self.config_path),
                                      jobs_file=str(self.jobs_path), jobs_backend="local",
                                      env={**settings_env})
        self._stack = ExitStack()
        self.app: App | None = None
        self._heartbeat: Heartbeat | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> "Harness":
        self.app = self._stack.enter_context(open_app(self.settings))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    @property
    def spark(self):
        return self.app.engine.spark

    # -- config and jobs ----------------------------------------------------------------------

    def seed(self, *rows: str) -> None:
        """Write the config CSV and load it the way `seed` does."""
        self.config_path.write_text("\n".join([HEADER, *rows]) + "\n")
        config = load_config(self.config_path)
        self.app.dbt.load_seed(config.to_csv())
        self.app.store.append_events([Event(event_type=EventType.CONFIG_LOADED.value, run_id="seed",
                                            snapshot_ts=utcnow())])
        self.app.dbt.build_all()
        self._heartbeat = None

    def jobs(self, **exit_codes: int) -> None:
        """Define local jobs: job id -> exit code (each job records it ran in <root>/ran/<job>)."""
        ran = self.root / "ran"
        ran.mkdir(exist_ok=True)
        lines = ["jobs:"]
        for job, code in exit_codes.items():
            script = f"import pathlib; p = pathlib.Path({str(ran / job)!r}); p.write_text(p.read_text() + 'x' if p.exists() else 'x'); raise SystemExit({code})"
            lines.append(f"  {job!r}:")
            lines.append(f"    command: [{sys.executable!r}, '-c', {script!r}]")
        self.jobs_path.write_text("\n".join(lines) + "\n")
        self._heartbeat = None

    def runs_of(self, job: str) -> int:
        path = self.root / "ran" / job
        return len(path.read_text()) if path.exists() else 0

    # -- upstream data ------------------------------------------------------------------------

    def create_table(self, name: str, columns: str) -> None:
        schema = name.split(".")[0]
        location = self.app.engine.local_location(name)
        self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} ({columns}) USING delta LOCATION '{location}'")

    def insert(self, name: str, values: str) -> None:
        self.spark.sql(f"INSERT INTO {name} VALUES {values}")

    def drop_trigger_file(self, folder: str, name: str) -> None:
        path = self.settings.effective_trigger_dir / folder
        path.mkdir(parents=True, exist_ok=True)
        (path / name).write_text("ready\n")

    # -- ticks and state ----------------------------------------------------------------------

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            backend = LocalJobsBackend(self.jobs_path, self.home / "jobs", self.home)
            self._heartbeat = self.app.heartbeat(backend=backend)
        return self._heartbeat

    def tick(self) -> TickResult:
        return self.heartbeat.tick()

    def status(self) -> dict[tuple[str, str, str], str | None]:
        self.app.dbt.refresh_control(self.app.store.events_version())
        return {(r["sensor_source"], r["sensor_id"], r["trigger_job_id"]): r["status"]
                for r in self.app.store.control_rows()}

    def job_status(self, job: str) -> set[str | None]:
        return {s for (_, _, j), s in self.status().items() if j == job}

    def rows(self, job: str | None = None) -> list[dict]:
        self.app.dbt.refresh_control(self.app.store.events_version())
        return self.app.store.control_rows(job)

    def events(self, kind: str | None = None) -> list[dict]:
        where = f"WHERE event_type = '{kind}'" if kind else ""
        return self.app.store.query(f"SELECT * FROM {self.app.store.name('heartbeat_events')} {where} ORDER BY event_ts")

    def wait_for_jobs(self, timeout: float = 30.0) -> None:
        """Tick until nothing is IN_PROGRESS (jobs are real processes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "IN_PROGRESS" not in set(self.status().values()):
                return
            time.sleep(0.3)
            self.tick()
        raise AssertionError(f"jobs still running after {timeout}s: {self.status()}")


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()
