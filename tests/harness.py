"""A test harness around the real app: a temp lakehouse, real Sail + Delta, real dbt, real jobs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from cli_runner import run_cli

from heartbeat_runner.core.files import replace_whole
from heartbeat_runner.core.records import utcnow
from heartbeat_runner.core.settings import JobsBackendKind, load_settings
from heartbeat_runner.jobs.local import LocalJobsBackend
from heartbeat_runner.lakehouse.store import Cond
from heartbeat_runner.runner.alerting import AlertMonitor
from heartbeat_runner.runner.app import App, open_app
from heartbeat_runner.runner.lineage import LineageMonitor
from heartbeat_runner.runner.tick import Heartbeat
from heartbeat_runner.runner.tick_result import TickObservers, TickResult
from heartbeat_runner.sensing.config import COLUMNS, load_config

HEADER = ",".join(COLUMNS)
#: the engines a test marked ``engines`` runs on: the embedded default, then Apache Spark + Delta
#: in its two shapes (a classic session in this process; a local Spark Connect server)
ENGINES = ("sail", "spark-classic", "spark-connect")


def config_row(source: str, sensor_id: str, job: str, *, hard: str = "TRUE", state: str = "UNPAUSED",
               key: str = "", query: str = "", read_type: str = "batch", name: str | None = None) -> str:
    """One CSV line in the column order of COLUMNS."""
    query_cell = '"' + query.replace('"', '""') + '"' if query else ""
    return ",".join([source, sensor_id, read_type, f"{sensor_id} data", key, query_cell, job, name or f"job_{job}",
                     state, hard])


def wait_for(predicate, timeout_s: float, what: str) -> None:
    """Until ``predicate()`` is true; AssertionError naming ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def views_built_by_dbt(dbt_dir: Path) -> int:
    """How many views dbt has built in the lakehouse whose dbt folder is ``dbt_dir`` (``<lakehouse>/dbt``): its log
    has a line for each view model it ran."""
    log = dbt_dir / "logs" / "dbt.log"
    return log.read_text(encoding="utf-8", errors="replace").count("START sql view model") if log.exists() else 0


def ticks(*outcomes):
    """A tick function returning (or raising) each outcome in turn; after the last the loop is told to stop."""
    pending = list(outcomes)

    def tick(start, scope=None):
        outcome = pending.pop(0)
        if not pending:
            signal.raise_signal(signal.SIGTERM)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return tick


def _drop_trigger_file(folder: Path, name: str) -> None:
    """A new trigger file, written aside and renamed as the README asks of writers: a running loop never
    sees it half made (created, then written: a second, newer modification time)."""
    folder.mkdir(parents=True, exist_ok=True)
    replace_whole(folder / name, "ready\n")


class Harness:
    """Drives Heartbeat in-process on a temporary lakehouse."""

    def __init__(self, root: Path, *, engine: str = "sail", spark_dir: Path | None = None, **settings_env: str):
        """``engine``: one of ENGINES. The Spark ones share one JVM per process (``spark_dir``) and a
        persistent metastore: a harness drops the schemas it used (its own and the upstream ones) at exit."""
        self.root = root
        self.engine_kind = engine
        self._schemas: set[str] = set()
        if engine != "sail":
            settings_env = {"HEARTBEAT_TARGET": "spark-local", "HEARTBEAT_SPARK_MODE": engine.removeprefix("spark-"),
                            "HEARTBEAT_SPARK_DIR": str(spark_dir or root / "spark"), **settings_env}
        self.home = root / "lakehouse"
        self.config_path = root / "config.csv"
        self.jobs_path = root / "heartbeat_jobs.yml"
        self.jobs_path.write_text("jobs: {}\n")
        # the run's kept dbt parse (tests/conftest.py) serves this lakehouse too; only the given variables else
        cache = os.environ.get("HEARTBEAT_DBT_PARSE_CACHE")
        kept = {"HEARTBEAT_DBT_PARSE_CACHE": cache} if cache else {}
        self.settings = load_settings(lakehouse_dir=str(self.home), config_csv=str(self.config_path),
                                      jobs_file=str(self.jobs_path), jobs_backend=JobsBackendKind.LOCAL.value,
                                      env={**kept, **settings_env})
        self._stack = ExitStack()
        self.app: App | None = None
        self._heartbeat: Heartbeat | None = None
        self._runners: list[Heartbeat] = []

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Harness:
        self.app = self._stack.enter_context(open_app(self.settings))
        self._track_runners(self.app)
        self._stack.callback(self._stop_deliveries)
        if self.engine_kind != "sail":
            self._schemas.add(self.settings.schema)
            self._stack.callback(self._drop_schemas)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _drop_schemas(self) -> None:
        for schema in sorted(self._schemas):
            if schema == "default":
                for table in self.spark.catalog.listTables("default"):
                    self.spark.sql(f"DROP TABLE IF EXISTS default.{table.name}")
            else:
                self.spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    @property
    def spark(self):
        return self.app.engine.spark

    # -- config and jobs ----------------------------------------------------------------------

    def seed(self, *rows: str) -> None:
        """Write the config CSV and load it the way `seed` does."""
        self.config_path.write_text("\n".join([HEADER, *rows]) + "\n")
        config = load_config(self.config_path)
        self.app.load_config(config)
        self._heartbeat = None

    def jobs(self, *, prints: dict[str, str] | None = None, **exit_codes: int) -> None:
        """Define local jobs: job id -> exit code (each job records it ran in <root>/ran/<job>); a job named
        in ``prints`` prints that line to its output before it exits."""
        ran = self.root / "ran"
        ran.mkdir(exist_ok=True)
        lines = ["jobs:"]
        for job, code in exit_codes.items():
            said = f"print({(prints or {})[job]!r}); " if job in (prints or {}) else ""
            script = f"import pathlib; {said}p = pathlib.Path({str(ran / job)!r}); p.write_text(p.read_text() + 'x' if p.exists() else 'x'); raise SystemExit({code})"
            lines.append(f"  {job!r}:")
            lines.append(f"    command: [{sys.executable!r}, '-c', {script!r}]")
        self.jobs_path.write_text("\n".join(lines) + "\n")
        self._heartbeat = None

    def runs_of(self, job: str) -> int:
        path = self.root / "ran" / job
        return len(path.read_text()) if path.exists() else 0

    # -- upstream data ------------------------------------------------------------------------

    def create_table(self, name: str, columns: str, properties: str = "") -> None:
        """An upstream Delta table (at a fixed location on Sail, managed on Spark)."""
        self._schemas.add(name.split(".")[0] if "." in name else "default")
        self.app.engine.create_delta_table(name, columns, properties)

    def insert(self, name: str, values: str) -> None:
        # a page served from this app may have recycled the engine: upstream tables register again on use
        self.app.engine.ensure_registered(name)
        self.spark.sql(f"INSERT INTO {name} VALUES {values}")

    def drop_trigger_file(self, folder: str, name: str) -> None:
        _drop_trigger_file(self.settings.effective_trigger_dir / folder, name)

    # -- ticks and state ----------------------------------------------------------------------

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            backend = LocalJobsBackend(self.jobs_path, self.home / "jobs", self.home, self.settings.lakehouse_env())
            self._heartbeat = self.app.heartbeat(backend=backend)
        return self._heartbeat

    def _track_runners(self, app: App) -> None:
        """Keep every runner ``app.heartbeat`` makes (the harness's and those a test asks the app for itself)."""
        make = app.heartbeat

        def made(*args, **kwargs) -> Heartbeat:
            runner = make(*args, **kwargs)
            self._runners.append(runner)
            return runner

        app.heartbeat = made  # type: ignore[method-assign]

    def _stop_deliveries(self) -> None:
        """Stop the alert and lineage delivery threads of every runner this harness made, as their process's exit
        would (what still waits is neither sent nor recorded). A thread left retrying a refused destination would
        log into the output of the worker's later tests (conftest's _no_delivery_thread_left_running)."""
        for runner in self._runners:
            observers = runner.observer.observers if isinstance(runner.observer, TickObservers) else [runner.observer]
            for observer in observers:
                outbox = observer.outbox if isinstance(observer, (AlertMonitor, LineageMonitor)) else None
                if outbox is not None:
                    outbox.close()
        self._runners.clear()

    def new_runner(self) -> Heartbeat:
        """A runner started afresh on this lakehouse, as a new process is: what it copies to tables once (window
        and trigger policies) it copies at its first tick."""
        self._heartbeat = None
        return self.heartbeat

    def tick(self) -> TickResult:
        return self.heartbeat.tick()

    def status(self) -> dict[tuple[str, str, str], str | None]:
        self.app.control.refresh()
        return {(r["sensor_source"], r["sensor_id"], r["trigger_job_id"]): r["status"]
                for r in self.app.store.control_rows()}

    def job_status(self, job: str) -> set[str | None]:
        return {s for (_, _, j), s in self.status().items() if j == job}

    def rows(self, job: str | None = None) -> list[dict]:
        self.app.control.refresh()
        return self.app.store.control_rows(job)

    def events(self, kind: str | None = None) -> list[dict]:
        where = [Cond("event_type", kind)] if kind else []
        return self.app.store.read("heartbeat_events", *where, order_by=["event_ts"])

    def wait_for_jobs(self, timeout: float | None = None) -> None:
        """Tick until nothing is IN_PROGRESS (jobs are real processes). The default bound is generous
        for the engine: 30 s on Sail; 300 s on Spark, where one tick of a loaded JVM can take a minute."""
        timeout = timeout if timeout is not None else (30.0 if self.engine_kind == "sail" else 300.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "IN_PROGRESS" not in set(self.status().values()):
                return
            time.sleep(0.3)
            self.tick()
        raise AssertionError(f"jobs still running after {timeout}s: {self.status()}")


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


# -- driving the runner as separate processes (crash, concurrency and operations tests) --------------

#: A local job that leaves one marker file per execution under <lakehouse>/ran/ (counts runs at the backend).
MARKER_JOB = ("import os, pathlib; d = pathlib.Path(os.environ['HEARTBEAT_HOME']) / 'ran'; d.mkdir(exist_ok=True); "
              "(d / (os.environ['HEARTBEAT_JOB_ID'] + '~' + os.environ['HEARTBEAT_JOB_RUN_ID'])).touch()")


def marker_jobs_file(path: Path, *job_ids: str) -> Path:
    """A local jobs file whose jobs each just leave a marker (see MARKER_JOB)."""
    lines = ["jobs:"] + [f"  {job!r}: [{sys.executable!r}, '-c', {MARKER_JOB!r}]" for job in job_ids]
    path.write_text("\n".join(lines) + "\n")
    return path


class CliLakehouse:
    """A lakehouse driven through ``python -m heartbeat_runner`` processes; state read from the Delta files."""

    def __init__(self, home: Path, *, config: Path, jobs_file: Path, env: dict[str, str] | None = None):
        self.home = home
        self.env = {**os.environ, "HEARTBEAT_HOME": str(home), "HEARTBEAT_CONFIG": str(config),
                    "HEARTBEAT_JOBS_FILE": str(jobs_file), **(env or {})}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "heartbeat_runner", *args]

    def cli(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = run_cli(args, env={**self.env, **(env or {})}, cwd=self.home.parent)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}")
        return proc

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args), env={**self.env, **(env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.home.parent)

    def loop_through_failures(self, failures: int) -> subprocess.CompletedProcess:
        """``run --loop`` whose first ``failures`` ticks fail (an injected fault after sensing), until job J1
        of a trigger file dropped in ``drop`` ran once; stopped with SIGTERM, its output read."""
        import signal

        loop = self.start("run", "--loop", "--interval", "0.2", env={"HEARTBEAT_FAIL_AT": f"after_sensing:{failures}"})
        try:
            self.drop_trigger_file("drop", "a.done")
            wait_for(lambda: self.executions().get("J1") == 1 or loop.poll() is not None, 120, "the job to run")
            assert loop.poll() is None, loop.communicate()
        finally:
            loop.send_signal(signal.SIGTERM)
            out, err = loop.communicate(timeout=60)
        return subprocess.CompletedProcess(loop.args, loop.returncode, out, err)

    # -- upstream data ----------------------------------------------------------------------

    def append_ids(self, table: str, *ids: int) -> None:
        """Append rows to the upstream Delta table ``schema.table`` (one commit)."""
        import pyarrow as pa
        from deltalake import write_deltalake

        write_deltalake(str(self.home / "warehouse" / Path(*table.split("."))), pa.table({"id": list(ids)}),
                        mode="append")

    def drop_trigger_file(self, folder: str, name: str) -> None:
        _drop_trigger_file(self.home / "triggers" / folder, name)

    # -- state ------------------------------------------------------------------------------

    def table(self, name: str) -> list[dict]:
        from deltalake import DeltaTable

        return DeltaTable(str(self.home / "warehouse" / "heartbeat" / name)).to_pyarrow_table().to_pylist()

    def events(self, kind: str | None = None) -> list[dict]:
        """Distinct events (by event id), oldest first."""
        unique = {e["event_id"]: e for e in sorted(self.table("heartbeat_events"), key=lambda e: e["event_ts"],
                                                   reverse=True)}
        return sorted((e for e in unique.values() if kind in (None, e["event_type"])), key=lambda e: e["event_ts"])

    def control(self) -> set[tuple]:
        """The active control rows, without timestamps and run ids (comparable across lakehouses)."""
        return {(r["sensor_source"], r["sensor_id"], r["trigger_job_id"], r["status"], r["job_state"],
                 r["pending_events"], r["last_error"]) for r in self.table("heartbeat_control") if r["is_active"]}

    def executions(self) -> dict[str, int]:
        """How many times each local job actually ran (MARKER_JOB markers)."""
        counts: dict[str, int] = {}
        for marker in (self.home / "ran").glob("*~*"):
            job = marker.name.split("~")[0]
            counts[job] = counts.get(job, 0) + 1
        return counts

    def wait_local_runs(self, timeout: float = 60.0) -> None:
        """Wait until every local job run started so far has finished."""
        deadline = time.monotonic() + timeout
        runs = self.home / "jobs" / "runs"
        while any(_run_going(d) for d in runs.glob("*")):
            if time.monotonic() > deadline:
                raise AssertionError(f"local job runs still going after {timeout}s")
            time.sleep(0.1)


class LakehouseTemplate:
    """A lakehouse built once (seeded, at its baseline: ``build(root)`` makes it under ``root``) and copied into
    each test that wants a fresh one. Copying its files takes milliseconds; seeding (a dbt parse, seed and build)
    and a baseline tick take 5-15 s a test. Equal to a fresh build as long as ``build`` writes no absolute path
    of ``root`` into the config or the data (the environment's paths are moved with the copy), as a lakehouse
    moved to another folder is (tests/test_crash.py has always run on such copies)."""

    def __init__(self, root: Path, build: Callable[[Path], CliLakehouse]):
        self._root, self._build = root, build
        self._lake: CliLakehouse | None = None

    def copy(self, dest: Path) -> CliLakehouse:
        """A copy of the template under ``dest`` (a test's ``tmp_path``), with its config and jobs file."""
        if self._lake is None:
            self._lake = self._build(self._root)
        shutil.copytree(self._root, dest, symlinks=True, dirs_exist_ok=True)
        root, moved = str(self._root), str(dest)
        env = {key: value.replace(root, moved) for key, value in self._lake.env.items() if os.environ.get(key) != value}
        return CliLakehouse(dest / self._lake.home.relative_to(self._root), config=Path(env["HEARTBEAT_CONFIG"]),
                            jobs_file=Path(env["HEARTBEAT_JOBS_FILE"]), env=env)


def _run_going(run_dir: Path) -> bool:
    """A local job run that will still end: claimed by its launcher and not finished, or not claimed yet
    while the launcher the runner started lives (a run whose runner died before starting it is not)."""
    from heartbeat_runner.core.processes import pid_alive

    if (run_dir / "result.json").exists():
        return False
    if (run_dir / "launched").exists():
        return True
    try:
        pid = json.loads((run_dir / "meta.json").read_text()).get("pid")
    except (OSError, ValueError):
        return False
    return bool(pid) and pid_alive(int(pid))


def sense_and_record(hb: Harness) -> TickResult:
    """The first half of a tick: sense, append the events and rebuild; no triggering."""
    from heartbeat_runner.core.records import new_run_id
    from heartbeat_runner.sensing.parallel import sense_all

    result = TickResult(run_id=new_run_id(utcnow()), snapshot_ts=utcnow())
    result.sensed = sense_all(hb.app.store.sensors_due(), hb.heartbeat.ctx, max_workers=2, timeout_s=30)
    hb.app.store.append_events(hb.heartbeat.sensed_events(result))
    hb.heartbeat.refresh_models()
    return result


@contextlib.contextmanager
def serving_page(lake: CliLakehouse, *options: str) -> Iterator[str]:
    """The status page (`ui` with ``options``) of ``lake`` on a free loopback port, once it answers; its base URL."""
    with page_process(lake, *options) as (base, _):
        yield base


@contextlib.contextmanager
def page_process(lake: CliLakehouse, *options: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`serving_page` with the server's process too (its log is on its stderr once it ended)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = lake.start("ui", "--port", str(port), *options)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                urllib.request.urlopen(base + "/api/meta", timeout=10)
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "the page did not start"
                time.sleep(0.5)
        yield base, process
    finally:
        process.terminate()
        process.wait(timeout=60)


def project_copy(root: Path) -> Path:
    """The dbt project as an installed Heartbeat ships it, in a folder a test may change."""
    import shutil

    repo = Path(__file__).resolve().parents[1]
    project = root / "project"
    project.mkdir()
    for name in ("dbt_project.yml", "profiles.example.yml"):
        shutil.copyfile(repo / name, project / name)
    for name in ("models", "macros", "seeds"):
        shutil.copytree(repo / name, project / name)
    return project


@dataclass
class LoopStop:
    """How a ``run --loop`` ended after one stop signal: its exit code and output, the seconds from the signal
    to its exit, and the engine child processes it had that were still running after it (none expected)."""

    returncode: int
    stdout: str
    stderr: str
    stop_s: float
    #: the runner's descendants (their command lines) just before the signal
    engine_children: list[str]
    #: those still running after the runner's exit (``pid command``)
    left_behind: list[str]


def still_running(pids) -> list[int]:
    """The pids of ``pids`` that still run: a process that ended, even if not yet reaped (a zombie), does not."""
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return [pid for pid in pids if running(pid)]


def live_descendants(pid: int) -> dict[int, str]:
    """The command lines of ``pid``'s descendants that still run, by pid. A child that ended and is not yet
    reaped (a zombie) or that went between the listing and the read is not one: it holds nothing."""
    import psutil

    found = {}
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            found[child.pid] = " ".join(child.cmdline())
    return found


def stop_loop(lake: CliLakehouse, sig: int, *, to_group: bool, mid_tick: bool, marker: Path,
              interval: str = "30", start_timeout: float = 120) -> LoopStop:
    """Start ``run --loop`` in its own process group (as a terminal or systemd starts it), wait until it is
    between ticks (its first tick finished) or mid-tick (paused after sensing: HEARTBEAT_PAUSE_AT), send ``sig``
    to the whole group (Ctrl-C, ``timeout``, KillMode=control-group) or to the runner alone, let a paused tick
    go on, and wait for the exit. The runner's descendants seen before the signal must all be gone after."""
    import psutil

    env = {**lake.env, "HEARTBEAT_PAUSE_AT": f"after_sensing:{marker}"} if mid_tick else lake.env
    loop = subprocess.Popen(lake.command("run", "--loop", "--interval", interval), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=lake.home.parent, start_new_session=True)
    err: list[str] = []
    out: list[str] = []
    readers = [threading.Thread(target=lambda: err.extend(loop.stderr or ()), daemon=True),
               threading.Thread(target=lambda: out.extend(loop.stdout or ()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        if mid_tick:
            wait_for(lambda: marker.exists() or loop.poll() is not None, start_timeout,
                     "the tick to pause after sensing")
        else:
            wait_for(lambda: any(line.startswith("tick 1 ") for line in err) or loop.poll() is not None,
                     start_timeout, "the first tick to finish")
        assert loop.poll() is None, "".join(err)
        children = live_descendants(loop.pid)
        began = time.monotonic()
        if to_group:
            os.killpg(loop.pid, sig)
        else:
            loop.send_signal(sig)
        if mid_tick:
            time.sleep(0.3)  # the signal is in before the tick goes on
            marker.unlink()
        loop.wait(timeout=120)
        took = time.monotonic() - began
    finally:
        if loop.poll() is None:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()
    for reader in readers:
        reader.join(timeout=10)

    # the engine is stopped and reaped before the runner exits; helpers (multiprocessing's resource tracker)
    # end when they see the runner's pipe close: a moment after it
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not still_running(children), 5, "the runner's children to end")
    left = [f"{pid} {children[pid]}" for pid in still_running(children)]
    for pid in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    return LoopStop(loop.returncode, "".join(out), "".join(err), took, list(children.values()), left)
