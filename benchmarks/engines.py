#!/usr/bin/env python
"""The same workload on every engine Heartbeat runs on here, measured in one run.

    python benchmarks/engines.py [--sensors 100] [--repeats 3] [--engines sail,spark-classic,spark-connect]

Per engine, in a fresh process: cold start (open the lakehouse, load the config, first
tick: what a scheduled one-shot runner pays), then the median of ``--repeats`` steady ticks
(nothing new) and busy ticks (10% of the sources changed, jobs settled in between). The
workload is benchmarks/run.py's: ~2/3 Delta tables, ~1/3 trigger folders, ~N/3 jobs. The
Delta upstreams are written with the ``deltalake`` package; Spark sees them as external
tables registered at their paths: that registration is the benchmark's own setup, timed apart and left out
of the cold start. Each figure is printed beside its target for the size (Spark's, SIZE_TARGETS), with the
local Spark driver's heap (the old generation's peak over the maximum: the classic driver's through py4j,
the Connect server's sampled each second with the JDK's jstat). HEARTBEAT_SPARK_DRIVER_MEMORY
chooses the driver's heap. Prints a table and writes JSON (benchmarks/results/engines.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402 - the shared workload

ENGINES = bench.ENGINES
DEFAULT_OUT = bench.REPO / "benchmarks" / "results" / "engines.json"


def measure(engine: str, n: int, repeats: int, root: Path, status_samples: int = 5,
            history: int = 0) -> dict[str, Any]:
    """One engine, in this process; ``status_samples`` timed `status` commands after the ticks (0: none);
    ``history`` events of an old runner's history added after the first tick (benchmarks/run.py's), before the
    steady and busy ticks."""
    from heartbeat_runner.core.settings import JobsBackendKind, load_settings
    from heartbeat_runner.runner.app import open_app
    from heartbeat_runner.sensing.config import load_config

    workload = bench.Workload(root, n)
    workload.generate()
    cluster = DatabricksShaped.start(root) if engine == DATABRICKS_SHAPED else None
    settings = load_settings(lakehouse_dir=str(workload.lakehouse), config_csv=str(workload.config),
                             jobs_file=str(workload.jobs_file), jobs_backend=JobsBackendKind.LOCAL.value,
                             env=cluster.env if cluster else bench.engine_env(engine, root))
    began = time.monotonic()
    with open_app(settings) as app:
        opened = time.monotonic() - began
        registered = 0.0  # the benchmark's own setup (Spark sees the upstreams once registered): timed apart
        if not app.engine.is_local:
            started = time.monotonic()
            workload.register_upstreams(app.engine.spark)
            if cluster:
                cluster.keep_catalog(workload)
            forget_the_setup(app.engine.spark)
            registered = time.monotonic() - started
        server_heap = ServerHeap.of_child_jvm() if not app.engine.is_local and _jvm_of(app.engine.spark) is None else None
        loading = time.monotonic()
        app.load_config(load_config(workload.config))
        loaded = time.monotonic() - loading
        heartbeat = app.heartbeat()
        counter = QueryCounter.install(app.engine)
        first = counter.figures(heartbeat.tick)
        cold = time.monotonic() - began - registered
        aged = bench._add_history(app, heartbeat, history) if history else None
        steady = [counter.figures(heartbeat.tick) for _ in range(repeats)]
        busy = []
        for rep in range(repeats):
            workload.change(workload.busy_set(rep), tag=rep)
            if cluster:
                cluster.altered(workload.busy_set(rep))
            busy.append(counter.figures(heartbeat.tick))
            bench._settle(heartbeat)
        status = _timed_statuses(settings, app.store, status_samples) if status_samples and not cluster else None
        heap = server_heap.figure() if server_heap is not None else heap_of(app.engine.spark)
    return {"engine": engine, "sensors": n, "status_samples": status_samples, "open_s": round(opened, 2),
            "registration_s": round(registered, 2), "config_load_s": round(loaded, 2), "cold_start_s": round(cold, 2),
            "driver_heap_mib": heap, "first_tick": first, "steady": bench._summarise(steady), "busy": bench._summarise(busy),
            "status_while_held": status, **({"history": aged} if aged else {})}


#: the ``databricks`` target's code paths on this machine (DatabricksShaped); not among the default engines
DATABRICKS_SHAPED = "databricks-shaped"


class DatabricksShaped:
    """The ``databricks`` target's whole tick on this machine: a job cluster's session, started as the
    Databricks-shaped test leg starts it (``tests/databricks_runtime.py``: Apache Spark classic with Delta, a
    Hive metastore standing in for Unity Catalog under ``spark_catalog``) and active before the app opens, as a
    cluster's is; Unity Catalog's ``information_schema.tables`` is a Delta table the benchmark keeps
    (``remote_sensing.Catalog``). So sensing asks the catalog and the tables' history, never a ``_delta_log``,
    and dbt runs on the cluster's session. The upstreams' catalog rows are the benchmark's setup, timed apart."""

    env = {"HEARTBEAT_TARGET": "databricks", "HEARTBEAT_CATALOG": "spark_catalog"}

    def __init__(self, spark):
        self.spark = spark
        self.catalog: Any = None

    @classmethod
    def start(cls, root: Path) -> DatabricksShaped:
        sys.path.insert(0, str(bench.REPO / "tests"))
        from databricks_runtime import start_runtime_session

        from heartbeat_runner.engines.spark_jars import spark_jars

        return cls(start_runtime_session(root / "cluster", [str(jar) for jar in spark_jars()]))

    def keep_catalog(self, workload: bench.Workload) -> None:
        import remote_sensing

        self.catalog = remote_sensing.Catalog(self.spark, self._tables(workload.sensors), schema=bench.UPSTREAM_SCHEMA)

    def altered(self, sensors: list[bench.Sensor]) -> None:
        """What Unity Catalog records when these upstreams get a commit."""
        self.catalog.altered(self._tables(sensors))

    @staticmethod
    def _tables(sensors: list[bench.Sensor]) -> list[str]:
        return [s.sensor_id.split(".")[1] for s in sensors if s.kind == "delta_table"]


def forget_the_setup(spark) -> None:
    """Registering the upstreams loads each table's Delta log into Delta's cache in this driver: 6,667 of them at
    10,000 sources, enough to keep a 2g driver collecting all through the first tick (docs/engines.md, "The driver
    heap"). A runner that starts on an existing metastore holds none, so the benchmark's setup leaves none
    behind, and the heap's peaks are counted from here (Spark classic: py4j)."""
    jvm = _jvm_of(spark)
    if jvm is None:
        return
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    jvm.java.lang.System.gc()
    for pool in jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans():
        pool.resetPeakUsage()


def _jvm_of(spark) -> Any:
    """The py4j view of this process's own JVM: a classic session's; None for a Spark Connect client or Sail."""
    return getattr(spark, "_jvm", None)


def heap_of(spark) -> str | None:
    """The classic Spark driver's heap: the old generation's peak since the start (what outlived collections, MiB)
    over the heap's maximum (``-Xmx``), read through py4j; None where this process has no JVM of its own (Sail, a
    Spark Connect client: ServerHeap samples the server's)."""
    jvm = _jvm_of(spark)
    if jvm is None:
        return None
    management = jvm.java.lang.management.ManagementFactory
    old = [pool.getPeakUsage().getUsed() for pool in management.getMemoryPoolMXBeans()
           if "Old Gen" in str(pool.getName())]
    return f"{round(sum(old) / 2**20)}/{round(jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20)}"


def _timed_statuses(settings, store, samples: int) -> dict[str, Any] | None:
    """``samples`` runs of `status --json`, each a new process, while this one holds the engine and, as a
    running `run` does, the tick lease (so `status` reads the control table, not rebuilds it).

    The first is the first command to reach this engine from outside (it pays for the engine's first
    use of that door); the median is what a command costs while a runner loops. None: one failed."""
    from heartbeat_runner.runner.lease import tick_lease

    env = {**os.environ, **settings.lakehouse_env(), "HEARTBEAT_CONFIG": str(settings.effective_config_csv)}
    seconds = []
    with tick_lease(store).held(600.0):
        for _ in range(samples):
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "heartbeat_runner", "status", "--json"], env=env,
                                  capture_output=True, text=True, check=False)
            seconds.append(round(time.monotonic() - began, 2))
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return None
    return {"first_s": seconds[0], "median_s": bench._median(seconds), "max_s": max(seconds), "runs": seconds}


class ServerHeap:
    """The Spark Connect server's heap, which py4j cannot reach: the JDK's ``jstat`` samples the server JVM (a
    child of this process) once a second. ``figure()`` stops sampling and gives the old generation's sampled peak
    over the heap's maximum (young + old capacity), in MiB, as :func:`heap_of` gives the classic driver's; a
    collection-free spike shorter than a second can fall between two samples."""

    def __init__(self, pid: int):
        self.pid = pid
        self._sampler = subprocess.Popen(["jstat", "-gc", str(pid), "1000"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)

    @classmethod
    def of_child_jvm(cls) -> ServerHeap | None:
        """The sampler of this process's one child JVM; None without one or without ``jstat``."""
        import shutil

        import psutil

        jvms = [p.pid for p in psutil.Process().children(recursive=True) if p.name() == "java"]
        return cls(jvms[0]) if len(jvms) == 1 and shutil.which("jstat") else None

    def figure(self) -> str | None:
        self._sampler.terminate()
        samples, _ = self._sampler.communicate()
        capacity = subprocess.run(["jstat", "-gccapacity", str(self.pid)], capture_output=True, text=True,
                                  check=False).stdout
        old = _column(samples, "OU")
        maximum = [sum(pair) for pair in zip(_column(capacity, "NGCMX"), _column(capacity, "OGCMX"))]
        if not old or not maximum:
            return None
        return f"{round(max(old) / 1024)}/{round(maximum[0] / 1024)}"


def _column(jstat_output: str, name: str) -> list[float]:
    """One column of ``jstat``'s output (KiB), over its rows; the header repeats and is skipped."""
    rows = [line.split() for line in jstat_output.splitlines() if line.strip()]
    if not rows or name not in rows[0]:
        return []
    at = rows[0].index(name)
    return [float(row[at]) for row in rows[1:] if len(row) > at and row[at].replace(".", "", 1).isdigit()]


#: a relation of Heartbeat's that a statement names: its label in the rows-scanned figures
_RELATION = re.compile(r"\b(heartbeat_\w+|jobs_ready_to_trigger\w*|jobs_trigger_explanation)\b", re.IGNORECASE)


def statement_label(statement: str) -> str:
    """``<first keyword> <first relation of Heartbeat's it names>``: how rows scanned are told apart."""
    words = statement.split(None, 1)
    relation = _RELATION.search(statement)
    return f"{words[0].lower() if words else '?'} {relation.group(1).lower() if relation else '(other)'}"


def _statement_of(description: str) -> str:
    """The label a stage's job ran under: Delta describes the jobs a statement starts (a MERGE's phases, its file
    filtering) as ``Delta: <the statement's description>: <phase>`` or ``<description> - <phase>``."""
    while description.startswith("Delta: "):
        description = description.removeprefix("Delta: ")
    return re.split(r":| - ", description, maxsplit=1)[0].strip()


class ScanCounter:
    """Rows each kind of statement read from storage, on Spark classic: every statement runs its jobs under
    its label (``statement_label``, the job description), and the driver's status store gives each stage's
    input records. Spark Connect's server and Sail keep theirs out of reach: no figures there. The store
    keeps the last 1,000 stages (Spark's ``spark.ui.retainedStages``): a tick that ran more is undercounted."""

    def __init__(self, spark):
        self._context = spark.sparkContext
        self._store = self._context._jsc.sc().statusStore()
        self._jvm = self._context._jvm
        self._seen: set[int] = set()
        self.since()  # stages before the counter count for nothing

    @classmethod
    def of(cls, spark) -> ScanCounter | None:
        return cls(spark) if _jvm_of(spark) is not None else None

    def describe(self, statement: str) -> None:
        self._context.setJobDescription(statement_label(statement))

    def since(self) -> dict[str, int]:
        """Input records by label of the stages completed since the last call."""
        rows: dict[str, int] = {}
        stages = self._store.stageList(None, False, False, self._context._gateway.new_array(self._jvm.double, 0),
                                       self._jvm.java.util.ArrayList())
        for stage in self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(stages):
            if stage.stageId() in self._seen or stage.completionTime().isEmpty():
                continue
            self._seen.add(stage.stageId())
            label = _statement_of(stage.description().get()) if stage.description().isDefined() else "(other)"
            rows[label] = rows.get(label, 0) + stage.inputRecords()
        return rows


@dataclass
class QueryCounter:
    """Counts what a tick asks the engine: SQL statements (the runner's and dbt's, one session) and,
    among the engine adapter's calls, reads of a table's version that ran as a query (not a log read);
    on Spark classic also the rows each kind of statement scanned (ScanCounter)."""

    sql: int = 0
    version_queries: int = 0
    scans: ScanCounter | None = None

    @classmethod
    def install(cls, engine) -> QueryCounter:
        counter = cls(scans=ScanCounter.of(engine.spark))
        spark_sql, table_version = engine.spark.sql, engine.ops.table_version

        def sql(*args, **kwargs):
            counter.sql += 1
            if counter.scans is not None and args:
                counter.scans.describe(str(args[0]))
            return spark_sql(*args, **kwargs)

        def version(*args, **kwargs):
            counter.version_queries += 1
            return table_version(*args, **kwargs)

        engine.spark.sql = sql
        if not engine.ops.manages_locations:  # the embedded engine's adapter reads the log: no query
            engine.ops.table_version = version
        return counter

    def figures(self, tick) -> dict[str, Any]:
        """``bench._tick_figures`` of one tick, with the queries it made."""
        sql, versions = self.sql, self.version_queries
        if self.scans is not None:
            self.scans.since()  # what ran between two measured ticks (jobs settling) is not this tick's
        figures = bench._tick_figures(tick())
        figures.update(sql_statements=self.sql - sql, version_queries=self.version_queries - versions)
        if self.scans is not None:
            figures["rows_scanned"] = self.scans.since()
        return figures


def _in_subprocess(engine: str, n: int, repeats: int, status_samples: int, history: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"hb-engines-{engine}-") as tmp:
        done = subprocess.run([sys.executable, __file__, "--one", engine, "--sensors", str(n),
                               "--repeats", str(repeats), "--status-samples", str(status_samples),
                               "--history", str(history), "--root", tmp],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"engine": engine, "error": done.stderr.strip().splitlines()[-5:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Spark's targets by size: sensors -> (cold start s, steady tick s, busy tick s); issue 22 set 100's (no cold
#: start target), issue 55 1,000's and 10,000's (Spark classic); the cold start leaves out the benchmark's own
#: registration of the upstream tables
SIZE_TARGETS = {100: (None, 1.5, 10.0), 1000: (120.0, 2.0, 15.0), 10000: (None, 10.0, 60.0)}
SPARK = ("spark-classic", "spark-connect")


def targets(engine: str, sensors: int) -> tuple[float | None, float | None, float | None]:
    """The targets of the largest size at or below ``sensors`` (Spark only; none for Sail here)."""
    sizes = [size for size in SIZE_TARGETS if size <= sensors]
    if engine not in SPARK or not sizes:
        return None, None, None
    return SIZE_TARGETS[max(sizes)]
#: seconds for `status` while a runner holds the engine (Spark): the target of the median of ``--status-samples``
#: commands (5), each a new process (a single command on 2 cores varies by +-0.5 s)
STATUS_TARGET_S = 3.0


def print_table(results: list[dict[str, Any]]) -> None:
    """Each figure beside its target (Spark's); queries are per tick: SQL statements / version reads by query."""
    print(f"{'engine':<15} {'sensors':>7} {'cold start s (target)':>22} {'steady tick s (target)':>24} "
          f"{'busy tick s (target)':>22} {'steady queries':>15} {'busy queries':>13} {'old gen peak/max MiB':>21}")
    for r in results:
        if "error" in r:
            print(f"{r['engine']:<15} failed: {' | '.join(r['error'])}")
            continue
        cold_target, steady_target, busy_target = targets(r["engine"], r["sensors"])
        heap = r.get("driver_heap_mib")
        print(f"{r['engine']:<15} {r['sensors']:>7} {_beside(r['cold_start_s'], cold_target):>22} "
              f"{_beside(r['steady']['wall_s'], steady_target):>24} {_beside(r['busy']['wall_s'], busy_target):>22} "
              f"{_queries(r['steady']):>15} {_queries(r['busy']):>13} {'-' if heap is None else heap:>21}")
        if r.get("registration_s"):
            print(f"{'':<15} (not in the cold start: the benchmark registered its upstream tables in "
                  f"{r['registration_s']:.1f} s; the config load took {r['config_load_s']:.1f} s of it)")
    for r in results:
        if "error" not in r and r["engine"] in SPARK:
            held = r.get("status_while_held")
            if held is None and not r.get("status_samples"):
                continue
            figures = ("failed" if held is None else
                       f"median {_beside(held['median_s'], STATUS_TARGET_S)} s, first {held['first_s']:.2f} s, "
                       f"max {held['max_s']:.2f} s")
            print(f"{r['engine']}: `status` from another process while the runner holds the engine, "
                  f"{r['status_samples']} commands: {figures}")


def _beside(value: float, target: float | None) -> str:
    if target is None:
        return f"{value:.2f} (-)"
    return f"{value:.2f} ({'<=' if value <= target else 'MISSED'} {target:g})"


def _queries(summary: dict[str, Any]) -> str:
    """Median SQL statements / version reads by query of a summary's ticks."""
    runs = summary.get("runs", [])
    if not runs or "sql_statements" not in runs[0]:
        return "-"
    return (f"{bench._median([r['sql_statements'] for r in runs]):g} / "
            f"{bench._median([r['version_queries'] for r in runs]):g}")


#: rows scanned per kind of statement at 10x the history, at most this many times those at 1x (issue 55)
SCAN_GROWTH_TARGET = 1.2


def print_scans_by_history(results: list[dict[str, Any]]) -> None:
    """Per kind of statement of the last steady and busy tick: rows scanned at each history size, and the
    largest over the smallest beside SCAN_GROWTH_TARGET (Spark classic only: ScanCounter)."""
    for engine in dict.fromkeys(r["engine"] for r in results):
        measured = [r for r in results if r["engine"] == engine and "error" not in r
                    and "rows_scanned" in r["steady"]["runs"][-1]]
        if len(measured) > 1:
            _print_scans(engine, measured)


def _print_scans(engine: str, measured: list[dict[str, Any]]) -> None:
    sizes = [r.get("history", {}).get("events", 0) for r in measured]
    for tick in ("steady", "busy"):
        scans = [r[tick]["runs"][-1]["rows_scanned"] for r in measured]
        print(f"{engine}: rows scanned per {tick} tick by statement, history "
              f"{' / '.join(f'{n:,}' for n in sizes)} events:")
        for label in sorted({label for scan in scans for label in scan}):
            rows = [scan.get(label, 0) for scan in scans]
            growth = rows[-1] / rows[0] if rows[0] else (1.0 if not rows[-1] else float("inf"))
            print(f"  {label:<45} {' / '.join(f'{n:>10,}' for n in rows)}   x{_beside(growth, SCAN_GROWTH_TARGET)}")


def _remote_sensing(tables: int) -> dict[str, Any] | None:
    """benchmarks/remote_sensing.py in a process of its own (a classic Spark JVM), its figures printed beside
    their targets; None when it failed."""
    import remote_sensing

    print(f"measuring the remote (Databricks) sensing path at {tables} tables ...", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("remote_sensing.py")), "--tables", str(tables),
                           "--json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"remote sensing failed: {done.stderr.strip().splitlines()[-3:]}")
        return None
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    remote_sensing.print_figures(figures)
    return figures


def _sizes(text: str) -> list[int]:
    """``100000,1e6`` -> [100000, 1000000] (argparse's type: a bad size is a usage error, not a traceback)."""
    try:
        return [int(float(size)) for size in text.split(",") if size.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes separated by commas, e.g. 100000,1000000") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"of {', '.join((*ENGINES, DATABRICKS_SHAPED))} ({DATABRICKS_SHAPED}: the databricks "
                             "target's tick on a job cluster's session here, its catalog kept by the benchmark)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--remote-sensing", type=int, default=0, metavar="TABLES",
                        help="also measure the Databricks sensing path forced on local Spark at TABLES tables "
                             "(benchmarks/remote_sensing.py: queries per steady tick, with 10 changed, after 100 OPTIMIZE)")
    parser.add_argument("--status-samples", type=int, default=5,
                        help="`status` commands timed while the runner holds the engine (Spark; 0: none)")
    parser.add_argument("--history", type=int, default=0, metavar="EVENTS",
                        help="age the lakehouse with EVENTS events of history after the first tick")
    parser.add_argument("--by-history", type=_sizes, default=[], metavar="A,B",
                        help="one run per history size (events), then the rows each kind of statement scanned "
                             "at each, beside the growth target (Spark classic)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.sensors, args.repeats, args.root, args.status_samples,
                                 args.history)))
        return 0
    results = []
    histories = args.by_history or [args.history]
    for engine in args.engines.split(","):
        for history in histories:
            print(f"measuring {engine} ({args.sensors} sensors, {args.repeats} repeats, {history:,} events of "
                  f"history) ...", file=sys.stderr, flush=True)
            results.append(_in_subprocess(engine, args.sensors, args.repeats, args.status_samples, history))
    print_table(results)
    if len(histories) > 1:
        print_scans_by_history(results)
    remote = _remote_sensing(args.remote_sensing) if args.remote_sensing else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.write_text(json.dumps({"meta": meta, "results": results,
                                    **({"remote_sensing": remote} if remote else {})}, indent=2) + "\n")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
