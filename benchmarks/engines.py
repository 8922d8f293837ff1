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
local Spark driver's heap (classic: the old generation's peak over the maximum). HEARTBEAT_SPARK_DRIVER_MEMORY
chooses the driver's heap. Prints a table and writes JSON (benchmarks/results/engines.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def measure(engine: str, n: int, repeats: int, root: Path) -> dict[str, Any]:
    """One engine, in this process."""
    from heartbeat_runner.core.settings import JobsBackendKind, load_settings
    from heartbeat_runner.runner.app import open_app
    from heartbeat_runner.sensing.config import load_config

    workload = bench.Workload(root, n)
    workload.generate()
    settings = load_settings(lakehouse_dir=str(workload.lakehouse), config_csv=str(workload.config),
                             jobs_file=str(workload.jobs_file), jobs_backend=JobsBackendKind.LOCAL.value,
                             env=bench.engine_env(engine, root))
    began = time.monotonic()
    with open_app(settings) as app:
        opened = time.monotonic() - began
        registered = 0.0  # the benchmark's own setup (Spark sees the upstreams once registered): timed apart
        if not app.engine.is_local:
            started = time.monotonic()
            workload.register_upstreams(app.engine.spark)
            registered = time.monotonic() - started
        loading = time.monotonic()
        app.load_config(load_config(workload.config))
        loaded = time.monotonic() - loading
        heartbeat = app.heartbeat()
        counter = QueryCounter.install(app.engine)
        first = counter.figures(heartbeat.tick)
        cold = time.monotonic() - began - registered
        steady = [counter.figures(heartbeat.tick) for _ in range(repeats)]
        busy = []
        for rep in range(repeats):
            workload.change(workload.busy_set(rep), tag=rep)
            busy.append(counter.figures(heartbeat.tick))
            bench._settle(heartbeat)
        status = _timed_statuses(settings, app.store, STATUS_SAMPLES)
        heap = driver_heap_mib(app.engine.spark)
    return {"engine": engine, "sensors": n, "open_s": round(opened, 2), "registration_s": round(registered, 2),
            "config_load_s": round(loaded, 2), "cold_start_s": round(cold, 2),
            "driver_heap_mib": heap, "first_tick": first, "steady": bench._summarise(steady), "busy": bench._summarise(busy),
            "status_while_held": status}


def driver_heap_mib(spark) -> str | None:
    """The local Spark driver's heap: the old generation's peak since the start (what outlived collections, MiB)
    over the heap's maximum (``-Xmx``), read through py4j; None where this process has no JVM of its own (Sail, a
    Spark Connect client)."""
    jvm = getattr(spark, "_jvm", None)
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


@dataclass
class QueryCounter:
    """Counts what a tick asks the engine: SQL statements (the runner's and dbt's, one session) and,
    among the engine adapter's calls, reads of a table's version that ran as a query (not a log read)."""

    sql: int = 0
    version_queries: int = 0

    @classmethod
    def install(cls, engine) -> QueryCounter:
        counter = cls()
        spark_sql, table_version = engine.spark.sql, engine.ops.table_version

        def sql(*args, **kwargs):
            counter.sql += 1
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
        figures = bench._tick_figures(tick())
        figures.update(sql_statements=self.sql - sql, version_queries=self.version_queries - versions)
        return figures


def _in_subprocess(engine: str, n: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"hb-engines-{engine}-") as tmp:
        done = subprocess.run([sys.executable, __file__, "--one", engine, "--sensors", str(n),
                               "--repeats", str(repeats), "--root", tmp],
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
#: seconds for `status` while a runner holds the engine (Spark): the target of the median of
#: STATUS_SAMPLES commands, each a new process (a single command on 2 cores varies by +-0.5 s)
STATUS_TARGET_S = 3.0
STATUS_SAMPLES = 5


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
            figures = ("failed" if held is None else
                       f"median {_beside(held['median_s'], STATUS_TARGET_S)} s, first {held['first_s']:.2f} s, "
                       f"max {held['max_s']:.2f} s")
            print(f"{r['engine']}: `status` from another process while the runner holds the engine, "
                  f"{STATUS_SAMPLES} commands: {figures}")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--remote-sensing", type=int, default=0, metavar="TABLES",
                        help="also measure the Databricks sensing path forced on local Spark at TABLES tables "
                             "(benchmarks/remote_sensing.py: queries per steady tick, with 10 changed, after 100 OPTIMIZE)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.sensors, args.repeats, args.root)))
        return 0
    results = []
    for engine in args.engines.split(","):
        print(f"measuring {engine} ({args.sensors} sensors, {args.repeats} repeats) ...", file=sys.stderr, flush=True)
        results.append(_in_subprocess(engine, args.sensors, args.repeats))
    print_table(results)
    remote = _remote_sensing(args.remote_sensing) if args.remote_sensing else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.write_text(json.dumps({"meta": meta, "results": results,
                                    **({"remote_sensing": remote} if remote else {})}, indent=2) + "\n")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
