#!/usr/bin/env python
"""Sensing Delta tables the way it runs on Databricks, forced on local Apache Spark: queries per tick.

    python benchmarks/remote_sensing.py [--tables 1000] [--changed 10] [--optimized 100]

On Databricks no table's ``_delta_log`` is on the runner's disk, so a table's version and what its new
commits did come from queries (its history), and a bulk look at the catalog
(``information_schema.tables.last_altered``) rules out the tables not altered since their cursor. Here the
engine adapter is the one Databricks gets (``TableOps``: no log listing), on a classic local Spark session
with Delta; Unity Catalog's ``information_schema.tables`` is a Delta table the benchmark keeps as the
catalog would (a row per table, ``last_altered`` moved by every commit, data or maintenance).

Prints, beside their targets, the queries and the history rows read of: a steady tick (O(1): the look and one
spot check), a tick with ``--changed`` tables that got data (O(1) + O(changed)), ticks while one table gets a
commit every second (history rows bounded by the commits since the previous tick, not by the table's history),
and a tick after ``--optimized`` OPTIMIZE commits (none may count as new data).
Also called by benchmarks/engines.py (``--remote-sensing``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SCHEMA = "bench_upstream"
CATALOG = "spark_catalog"


class Catalog:
    """Unity Catalog's bookkeeping of the benchmark's tables: ``information_schema.tables`` as a Delta table."""

    def __init__(self, spark, names: list[str], schema: str = SCHEMA):
        self.spark = spark
        spark.sql("CREATE SCHEMA IF NOT EXISTS information_schema")
        spark.sql("CREATE TABLE IF NOT EXISTS information_schema.tables (table_catalog STRING, table_schema STRING, "
                  "table_name STRING, table_type STRING, last_altered TIMESTAMP) USING delta")
        made = datetime.now(timezone.utc) - timedelta(days=1)  # steady state: the tables were made long ago
        spark.createDataFrame([(CATALOG, schema, n, "MANAGED", made) for n in names],
                              "table_catalog string, table_schema string, table_name string, table_type string, "
                              "last_altered timestamp"
                              ).write.format("delta").mode("overwrite").saveAsTable("information_schema.tables")

    def altered(self, names: list[str]) -> None:
        """What the catalog records when these tables get a commit."""
        marks = ", ".join(f":n{i}" for i in range(len(names)))
        self.spark.sql(f"UPDATE information_schema.tables SET last_altered = current_timestamp() "
                       f"WHERE table_name IN ({marks})", args={f"n{i}": n for i, n in enumerate(names)})


def measure(tables: int, changed: int, optimized: int, root: Path, streaming_s: int = 10,
            streaming_ticks: int = 3) -> dict[str, Any]:
    import pandas as pd
    from deltalake import DeltaTable, write_deltalake

    from heartbeat_runner.core.records import SensingTarget
    from heartbeat_runner.core.settings import Target, load_settings
    from heartbeat_runner.engines.engine import Engine, TableOps
    from heartbeat_runner.engines.spark_local import open_classic_session
    from heartbeat_runner.sensing.parallel import sense_all
    from heartbeat_runner.sensing.sources.base import SenseContext

    began = time.monotonic()
    names = [f"t{i:04d}" for i in range(tables)]
    for name in names:  # two files each, so that an OPTIMIZE has something to compact
        for value in (1, 2):
            write_deltalake(str(root / "upstreams" / name), pd.DataFrame({"id": [value], "amount": [1.0]}), mode="append")
    spark = open_classic_session(root / "spark")
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    for name in names:
        spark.sql(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.{name} USING delta LOCATION '{root / 'upstreams' / name}'")
    catalog = Catalog(spark, names)
    settings = load_settings(lakehouse_dir=str(root / "lakehouse"), env={"HEARTBEAT_TARGET": Target.DATABRICKS.value,
                                                                         "HEARTBEAT_CATALOG": CATALOG})
    engine = Engine(session=spark, settings=settings, ops=TableOps())  # Databricks' adapter: no log listing
    ctx = SenseContext(engine=engine, trigger_dir=root / "triggers")
    setup_s = time.monotonic() - began

    queries = {"n": 0}
    spark_sql = spark.sql

    def counted(*args, **kwargs):
        queries["n"] += 1
        return spark_sql(*args, **kwargs)

    spark.sql = counted
    cursors: dict[str, tuple[str | None, datetime | None]] = {n: (None, None) for n in names}

    def tick() -> dict[str, Any]:
        snapshot = datetime.now(timezone.utc)
        targets = [(SensingTarget(source_key=f"delta_table:{CATALOG}.{SCHEMA}.{n}", sensor_source="delta_table",
                                  sensor_id=f"{CATALOG}.{SCHEMA}.{n}", upstream_key=None, preprocess_query=None,
                                  sensor_read_type="batch", cursor=cursors[n][0], cursor_ts=cursors[n][1]), "job")
                   for n in names]
        before, rows_before, started = queries["n"], engine.ops.history_rows, time.monotonic()
        outcomes = sense_all(targets, ctx, max_workers=8, timeout_s=120)
        errors = [o.error for o in outcomes if o.error]
        for outcome in outcomes:
            name = outcome.target.sensor_id.rsplit(".", 1)[1]
            if outcome.result is not None and outcome.result.cursor_to not in (None, outcome.target.cursor):
                cursors[name] = (outcome.result.cursor_to, snapshot)
        return {"queries": queries["n"] - before, "history_rows": engine.ops.history_rows - rows_before,
                "seconds": round(time.monotonic() - started, 2),
                "new_data": sum(1 for o in outcomes if o.result is not None and o.result.new_data),
                "errors": len(errors), "first_error": errors[0] if errors else None}

    baseline = tick()
    steady = tick()
    for name in names[:changed]:
        write_deltalake(str(root / "upstreams" / name), pd.DataFrame({"id": [3], "amount": [1.0]}), mode="append")
    catalog.altered(names[:changed])
    with_changes = tick()
    streaming = []  # one table committed every second, a tick every ``streaming_s`` seconds
    hot = names[-1]
    for _ in range(streaming_ticks):
        commits = 0
        until = time.monotonic() + streaming_s
        while time.monotonic() < until:
            write_deltalake(str(root / "upstreams" / hot), pd.DataFrame({"id": [4], "amount": [1.0]}), mode="append")
            commits += 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() % 1.0)))
        catalog.altered([hot])
        streaming.append({**tick(), "commits": commits})
    compacted = names[changed:changed + optimized]
    for name in compacted:
        DeltaTable(str(root / "upstreams" / name)).optimize.compact()
    catalog.altered(compacted)
    after_optimize = tick()
    spark.sql = spark_sql
    return {"tables": tables, "changed": changed, "optimized": optimized, "setup_s": round(setup_s, 1),
            "baseline": baseline, "steady": steady, "with_changes": with_changes, "streaming": streaming,
            "after_optimize": after_optimize}


def print_figures(r: dict[str, Any]) -> None:
    """Each figure beside its target."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    changed, optimized = r["changed"], r["optimized"]
    print(f"remote (Databricks) sensing path on local Spark, {r['tables']} tables (setup {r['setup_s']} s):")
    from heartbeat_runner.engines.engine import HISTORY_SLACK

    print(f"  baseline tick: {r['baseline']['queries']} queries, {r['baseline']['history_rows']} history rows, "
          f"{r['baseline']['seconds']} s")
    print(f"  steady tick: {r['steady']['queries']} queries, {r['steady']['history_rows']} history rows, "
          f"{r['steady']['seconds']} s (target O(1): the catalog look and one spot check; "
          f"{verdict(r['steady']['queries'] <= 2 and r['steady']['history_rows'] <= 1)})")
    limit = 2 + 2 * changed
    rows_limit = 1 + changed * (1 + 1 + HISTORY_SLACK)
    print(f"  tick with {changed} changed tables: {r['with_changes']['queries']} queries, "
          f"{r['with_changes']['history_rows']} history rows, "
          f"{r['with_changes']['new_data']} with new data, {r['with_changes']['seconds']} s "
          f"(target <= {limit} queries = 2 + 2 per changed table, <= {rows_limit} history rows, {changed} with new "
          f"data; {verdict(r['with_changes']['queries'] <= limit and r['with_changes']['history_rows'] <= rows_limit and r['with_changes']['new_data'] == changed)})")
    for n, s in enumerate(r["streaming"], 1):
        # the spot check, the version of each table changed within the catalog's 5-minute margin (read again),
        # and the hot table's version and its history since the last tick (+ HISTORY_SLACK)
        bound = 1 + changed + 1 + s["commits"] + HISTORY_SLACK
        print(f"  tick {n} with one table committed every second ({s['commits']} commits since the last tick): "
              f"{s['queries']} queries, {s['history_rows']} history rows, {s['seconds']} s "
              f"(target <= {bound} history rows: 1 spot check + {changed} versions of the tables changed within "
              f"the margin + 1 version and {s['commits']} + {HISTORY_SLACK} history rows of the committed table; "
              f"{verdict(s['history_rows'] <= bound and s['new_data'] == 1)})")
    print(f"  tick after {optimized} OPTIMIZE commits: {r['after_optimize']['queries']} queries, "
          f"{r['after_optimize']['history_rows']} history rows, "
          f"{r['after_optimize']['new_data']} with new data, {r['after_optimize']['seconds']} s "
          f"(target: 0 with new data, nothing triggered; {verdict(r['after_optimize']['new_data'] == 0)})")
    for tick in ("baseline", "steady", "with_changes", "after_optimize"):
        if r[tick]["errors"]:
            print(f"  {tick}: {r[tick]['errors']} error(s), first: {r[tick]['first_error']}")
    for n, s in enumerate(r["streaming"], 1):
        if s["errors"]:
            print(f"  streaming tick {n}: {s['errors']} error(s), first: {s['first_error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--optimized", type=int, default=100)
    parser.add_argument("--streaming-s", type=int, default=10, help="seconds between ticks while one table gets a "
                        "commit every second")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (last line)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hb-remote-sensing-") as tmp:
        result = measure(args.tables, args.changed, args.optimized, Path(tmp), args.streaming_s)
    if args.json:
        print(json.dumps(result))
    else:
        print_figures(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
