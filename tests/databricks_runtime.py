"""A Databricks job cluster's driver, as close as this machine gets: run with the task environment's Python.

Run as ``python databricks_runtime.py PLAN.json`` by ``tests/test_databricks_runtime.py``, with the Python of
a fresh virtual environment holding only what a cluster holds: the runtime's PySpark and delta-spark, the
wheel the bundle builds, and the libraries the job YAML declares. Nothing of Heartbeat is imported here.

What the runtime does before a ``python_wheel_task`` runs, and so does this script, in order:

1. sets the cluster's ``spark_env_vars`` (the plan's ``env``; ``{{secrets/...}}`` references were resolved
   by the caller, as the cluster manager resolves them at cluster start);
2. creates the Spark session with Delta built in (here: Apache Spark with delta-spark's jars, a Hive
   metastore on local disk standing in for Unity Catalog, ``spark_catalog`` as the catalog), so that
   ``SparkSession.getActiveSession()`` finds it;
3. calls the task's entry point (``package_name`` / ``entry_point``, looked up in the installed wheel's
   metadata) with ``sys.argv`` = ``[package_name, *parameters]``. What the entry point returns is ignored:
   returning (whatever the value) or a ``SystemExit`` of 0 or None is a successful task; an exception or a
   non-zero ``SystemExit`` fails it.

The plan also holds SQL steps between tasks: what other workloads on the workspace do meanwhile (an upstream
table gets rows, predictive optimization compacts it). Each step's outcome is printed as one JSON line
prefixed ``STEP `` on stdout, for the test to read.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from importlib.metadata import distributions
from pathlib import Path


def start_runtime_session(root: Path, jars: list[str]):
    """The cluster's session: Delta's extension and catalog, a Derby metastore and warehouse under ``root``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.appName("databricks-runtime")
               .config("spark.master", "local[2]")
               .config("spark.jars", ",".join(jars))
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.sql.catalogImplementation", "hive")
               .config("spark.sql.sources.default", "delta")
               .config("spark.sql.warehouse.dir", str(root / "warehouse"))
               .config("spark.hadoop.javax.jdo.option.ConnectionURL",
                       f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true")
               # a job cluster's JVM here lives for one plan: compiling hot code with the JIT's first tier only
               # and the parallel collector cost less CPU than they save on 2 cores, as does replaying Delta's log
               # in one partition. The cluster's tuning is not under test (measured: the runner job's test took
               # 299 s without these three, 226 s with them, one after the other)
               .config("spark.driver.extraJavaOptions",
                       f"-Dderby.system.home={root} -Duser.timezone=UTC -XX:+UseParallelGC -XX:TieredStopAtLevel=1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "1")
               # a small machine's Spark pays more for compiling code than these small queries save (as the
               # local engine measured, engines/spark_local.py); the runtime's settings are not under test
               .config("spark.sql.codegen.wholeStage", "false")
               .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
               .config("spark.sql.autoBroadcastJoinThreshold", "-1")
               .config("spark.databricks.delta.snapshotPartitions", "1")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
               .config("spark.databricks.delta.retentionDurationCheck.enabled", "false"))
    spark = builder.enableHiveSupport().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wheel_entry_point(package_name: str, name: str, path: list[str] | None = None):
    """The ``name`` console-script entry point of the installed distribution ``package_name`` (as the runtime
    finds it); ``path`` searches those folders' distributions instead of ``sys.path``."""
    wanted = package_name.replace("_", "-").lower()
    found = distributions(path=path) if path is not None else distributions()
    for dist in found:
        if dist.metadata["Name"].replace("_", "-").lower() != wanted:
            continue
        for point in dist.entry_points:
            if point.group == "console_scripts" and point.name == name:
                return point.load()
    raise SystemExit(f"no entry point {name!r} in {package_name}")


def run_task(package_name: str, name: str, parameters: list[str], path: list[str] | None = None) -> int:
    """Run a ``python_wheel_task`` as the runtime does and return the task's outcome as an exit code (0: the
    run is SUCCESS, else FAILED). The entry point's return value is ignored, as the runtime ignores it."""
    main = wheel_entry_point(package_name, name, path)
    sys.argv = [package_name, *parameters]
    try:
        main()  # whatever it returns, the task succeeded
    except SystemExit as exc:
        code = exc.code
        return 0 if code in (0, None) else (code if isinstance(code, int) else 1)
    except Exception:  # noqa: BLE001 - the runtime fails the task with the traceback
        traceback.print_exc()
        return 1
    return 0


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    os.environ.update(plan["env"])
    spark = start_runtime_session(Path(plan["root"]), plan["jars"])
    for step in plan["steps"]:
        began = time.monotonic()
        if "sql" in step:
            try:
                spark.sql(step["sql"]).collect()
                outcome = {"sql": step["sql"], "ok": True}
            except Exception as exc:  # noqa: BLE001 - reported to the test
                outcome = {"sql": step["sql"], "ok": False, "error": str(exc).splitlines()[0]}
        else:
            task = step["task"]
            code = run_task(task["package_name"], task["entry_point"], task["parameters"])
            outcome = {"task": task["parameters"], "exit": code}
        outcome["seconds"] = round(time.monotonic() - began, 1)  # for the test's report of where time goes
        print("STEP " + json.dumps(outcome), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
