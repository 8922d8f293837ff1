#!/usr/bin/env python
"""The same workload on every engine Heartbeat runs on here, measured in one run.

    python benchmarks/engines.py [--sensors 100] [--repeats 3] [--engines sail,spark-classic,spark-connect]

Per engine, in a fresh process: cold start (open the lakehouse, load the config, first
tick: what a scheduled one-shot runner pays), then the median of ``--repeats`` steady ticks
(nothing new) and busy ticks (10% of the sources changed, jobs settled in between). The
workload is benchmarks/run.py's: ~2/3 Delta tables, ~1/3 trigger folders, ~N/3 jobs. The
Delta upstreams are written with the ``deltalake`` package; Spark sees them as external
tables registered at their paths. Prints a table and writes JSON (benchmarks/results/engines.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402 - the shared workload

ENGINES = ("sail", "spark-classic", "spark-connect")
DEFAULT_OUT = bench.REPO / "benchmarks" / "results" / "engines.json"


def _settings_env(engine: str, root: Path) -> dict[str, str]:
    if engine == "sail":
        return {}
    return {"HEARTBEAT_TARGET": "spark-local", "HEARTBEAT_SPARK_MODE": engine.removeprefix("spark-"),
            "HEARTBEAT_SPARK_DIR": str(root / "spark")}


def measure(engine: str, n: int, repeats: int, root: Path) -> dict[str, Any]:
    """One engine, in this process."""
    from heartbeat_runner.core.settings import JobsBackendKind, load_settings
    from heartbeat_runner.runner.app import open_app
    from heartbeat_runner.sensing.config import load_config

    workload = bench.Workload(root, n)
    workload.generate()
    settings = load_settings(lakehouse_dir=str(workload.lakehouse), config_csv=str(workload.config),
                             jobs_file=str(workload.jobs_file), jobs_backend=JobsBackendKind.LOCAL.value,
                             env=_settings_env(engine, root))
    began = time.monotonic()
    with open_app(settings) as app:
        opened = time.monotonic() - began
        if not app.engine.is_local:
            _register_upstreams(app.engine.spark, workload)
        app.load_config(load_config(workload.config))
        heartbeat = app.heartbeat()
        first = bench._tick_figures(heartbeat.tick())
        cold = time.monotonic() - began
        steady = [bench._tick_figures(heartbeat.tick()) for _ in range(repeats)]
        busy = []
        for rep in range(repeats):
            workload.change(workload.busy_set(rep), tag=rep)
            busy.append(bench._tick_figures(heartbeat.tick()))
            bench._settle(heartbeat)
    return {"engine": engine, "sensors": n, "open_s": round(opened, 2), "cold_start_s": round(cold, 2),
            "first_tick": first, "steady": bench._summarise(steady), "busy": bench._summarise(busy)}


def _register_upstreams(spark, workload: bench.Workload) -> None:
    """Spark's catalog is a metastore: the path-written upstreams become external tables."""
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {bench.UPSTREAM_SCHEMA}")
    for sensor in workload.sensors:
        if sensor.kind == "delta_table":
            spark.sql(f"CREATE TABLE IF NOT EXISTS {sensor.sensor_id} USING delta "
                      f"LOCATION '{workload.table_dir(sensor)}'")


def _in_subprocess(engine: str, n: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"hb-engines-{engine}-") as tmp:
        done = subprocess.run([sys.executable, __file__, "--one", engine, "--sensors", str(n),
                               "--repeats", str(repeats), "--root", tmp],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"engine": engine, "error": done.stderr.strip().splitlines()[-5:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'engine':<15} {'cold start s':>12} {'steady tick s':>14} {'busy tick s':>12}")
    for r in results:
        if "error" in r:
            print(f"{r['engine']:<15} failed: {' | '.join(r['error'])}")
            continue
        print(f"{r['engine']:<15} {r['cold_start_s']:>12.2f} {r['steady']['wall_s']:>14.2f} {r['busy']['wall_s']:>12.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
