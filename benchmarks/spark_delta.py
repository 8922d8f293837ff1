#!/usr/bin/env python
"""Apache Spark + Delta (classic / Spark Connect) next to Sail: start-up and a few Delta operations.

    python benchmarks/spark_delta.py [--modes classic,connect,sail] [--rounds 5] [--jars]

Each mode runs in its own process (one JVM at a time). Per mode: cold start (until a
session answers its first statement), a MERGE of 1000 rows (500 updated, 500 inserted)
into a 1000-row Delta table, a ``VERSION AS OF`` count, and stopping. ``--jars`` also
times the Maven resolution with an empty ~/.m2 stand-in, with a warm ~/.m2, and cached.
Prints one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MERGE = ("MERGE INTO b.t AS tgt USING (SELECT id + {offset} AS id, {round} AS v FROM range(1000)) AS src "
         "ON tgt.id = src.id WHEN MATCHED THEN UPDATE SET v = src.v WHEN NOT MATCHED THEN INSERT *")


def _timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def _operations(spark, location: str | None, rounds: int) -> dict:
    """The shared workload; ``location`` gives the table a fixed folder (Sail needs one)."""
    where = f" LOCATION '{location}'" if location else ""
    catalog_first = _timed(lambda: spark.sql("CREATE SCHEMA IF NOT EXISTS b"))  # Spark: Derby metastore boots
    spark.sql(f"CREATE TABLE b.t (id bigint, v bigint) USING delta{where}")
    spark.sql("INSERT INTO b.t SELECT id, 0 FROM range(1000)")
    merges, reads = [], []
    for n in range(1, rounds + 1):
        # each round updates the last 500 ids and adds 500 new ones
        merges.append(_timed(lambda n=n: spark.sql(MERGE.format(offset=500 * n, round=n)).collect()))
        reads.append(_timed(lambda: spark.sql("SELECT count(*) FROM b.t VERSION AS OF 1").collect()))
    rows = spark.sql("SELECT count(*), count(DISTINCT id) FROM b.t").collect()[0]
    assert tuple(rows) == (1000 + 500 * rounds,) * 2, f"unexpected table after the merges: {rows}"
    return {"first_catalog_statement_s": catalog_first,
            "merge_1000_s": statistics.median(merges), "merge_1000_first_s": merges[0],
            "version_as_of_s": statistics.median(reads), "version_as_of_first_s": reads[0]}


def run_classic(lakehouse: Path, rounds: int) -> dict:
    from heartbeat_runner.engines.spark_local import open_classic_session, stop_classic_session

    started = time.monotonic()
    spark = open_classic_session(lakehouse)
    session_s = time.monotonic() - started
    spark.sql("SELECT 1").collect()
    first = time.monotonic() - started
    result = {"session_s": session_s, "cold_start_s": first, **_operations(spark, None, rounds)}
    result["stop_s"] = _timed(lambda: stop_classic_session(spark))
    return result


def run_connect(lakehouse: Path, rounds: int) -> dict:
    from pyspark.sql import SparkSession

    from heartbeat_runner.engines.spark_local import SparkConnectProcess

    server = SparkConnectProcess(lakehouse)
    started = time.monotonic()
    server.start()
    listening = time.monotonic() - started
    spark = SparkSession.builder.remote(server.url).create()
    spark.sql("SELECT 1").collect()
    result = {"listening_s": listening, "cold_start_s": time.monotonic() - started,
              **_operations(spark, None, rounds)}
    spark.stop()
    result["stop_s"] = _timed(server.stop)
    return result


def run_sail(lakehouse: Path, rounds: int) -> dict:
    from pysail.spark import SparkConnectServer
    from pyspark.sql import SparkSession

    os.environ.setdefault("RUST_LOG", "error")
    started = time.monotonic()
    server = SparkConnectServer("127.0.0.1", 0)
    server.start(background=True)
    host, port = server.listening_address
    spark = SparkSession.builder.remote(f"sc://{host}:{port}").create()
    spark.sql("SELECT 1").collect()
    result = {"cold_start_s": time.monotonic() - started,
              **_operations(spark, str(lakehouse / "warehouse" / "b" / "t"), rounds)}
    spark.stop()
    result["stop_s"] = _timed(server.stop)
    return result


def run_jars() -> dict:
    """Resolution with nothing cached (fresh ~/.m2 stand-in), with a warm ~/.m2, and from the cache."""
    from heartbeat_runner.engines import spark_jars

    timings = {}
    with tempfile.TemporaryDirectory() as m2, tempfile.TemporaryDirectory() as cache:
        os.environ["HEARTBEAT_SPARK_JARS_DIR"] = cache
        os.environ["MAVEN_OPTS"] = f"-Dmaven.repo.local={m2}"
        timings["cold_m2_s"] = _timed(spark_jars.spark_jars)
    with tempfile.TemporaryDirectory() as cache:
        os.environ.pop("MAVEN_OPTS")
        os.environ["HEARTBEAT_SPARK_JARS_DIR"] = cache
        timings["warm_m2_s"] = _timed(spark_jars.spark_jars)
        timings["cached_s"] = _timed(spark_jars.spark_jars)
    return timings


MODES = {"classic": run_classic, "connect": run_connect, "sail": run_sail}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="classic,connect,sail")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jars", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as lakehouse:
            result = run_jars() if args.child == "jars" else MODES[args.child](Path(lakehouse), args.rounds)
        print(json.dumps({"mode": args.child, **{k: round(v, 3) for k, v in result.items()}}), flush=True)
        return
    children = (["jars"] if args.jars else []) + args.modes.split(",")
    for child in children:
        subprocess.run([sys.executable, __file__, "--child", child, "--rounds", str(args.rounds)], check=True,
                       stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
