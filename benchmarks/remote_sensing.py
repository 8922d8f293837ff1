#!/usr/bin/env python
"""Sensing Delta tables the way it runs on Databricks, forced on local Apache Spark: queries per tick.

    python benchmarks/remote_sensing.py [--tables 1000] [--changed 10] [--optimized 100]

On Databricks no table's ``_delta_log`` is on the runner's disk, so a table's version and what its new
commits did come from queries (its history), and a bulk look at the catalog
(``information_schema.tables.last_altered``) rules out the tables not altered since their cursor. Here the
engine adapter is the one Databricks gets (``TableOps``: no log listing), on a classic local Spark session
with Delta; Unity Catalog's ``information_schema.tables`` is a Delta table the benchmark keeps as the
catalog would (a row per table, ``last_altered`` moved by every commit, data or maintenance).

Prints, beside their targets: queries of a steady tick (O(1)), of a tick with ``--changed`` tables that got
data (O(1) + O(changed)), and of a tick after ``--optimized`` OPTIMIZE commits (none may count as new data).
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

    def __init__(self, spark, names: list[str]):
        self.spark = spark
        spark.sql("CREATE SCHEMA IF NOT EXISTS information_schema")
        spark.sql("CREATE TABLE IF NOT EXISTS information_schema.tables (table_catalog STRING, table_schema STRING, "
                  "table_name STRING, last_altered TIMESTAMP) USING delta")
        made = datetime.now(timezone.utc) - timedelta(days=1)  # steady state: the tables were made long ago
        spark.createDataFrame([(CATALOG, SCHEMA, n, made) for n in names],
                              "table_catalog string, table_schema string, table_name string, last_altered timestamp"
                              ).write.format("delta").mode("overwrite").saveAsTable("information_schema.tables")

    def altered(self, names: list[str]) -> None:
        """What the catalog records when these tables get a commit."""
        self.spark.sql("UPDATE information_schema.tables SET last_altered = current_timestamp() "
                       "WHERE table_name IN (" + ", ".join(f"'{n}'" for n in names) + ")")


def measure(tables: int, changed: int, optimized: int, root: Path) -> dict[str, Any]:
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
        before, started = queries["n"], time.monotonic()
        outcomes = sense_all(targets, ctx, max_workers=8, timeout_s=120)
        errors = [o.error for o in outcomes if o.error]
        for outcome in outcomes:
            name = outcome.target.sensor_id.rsplit(".", 1)[1]
            if outcome.result is not None and outcome.result.cursor_to not in (None, outcome.target.cursor):
                cursors[name] = (outcome.result.cursor_to, snapshot)
        return {"queries": queries["n"] - before, "seconds": round(time.monotonic() - started, 2),
                "new_data": sum(1 for o in outcomes if o.result is not None and o.result.new_data),
                "errors": len(errors), "first_error": errors[0] if errors else None}

    baseline = tick()
    steady = tick()
    for name in names[:changed]:
        write_deltalake(str(root / "upstreams" / name), pd.DataFrame({"id": [3], "amount": [1.0]}), mode="append")
    catalog.altered(names[:changed])
    with_changes = tick()
    compacted = names[changed:changed + optimized]
    for name in compacted:
        DeltaTable(str(root / "upstreams" / name)).optimize.compact()
    catalog.altered(compacted)
    after_optimize = tick()
    spark.sql = spark_sql
    return {"tables": tables, "changed": changed, "optimized": optimized, "setup_s": round(setup_s, 1),
            "baseline": baseline, "steady": steady, "with_changes": with_changes, "after_optimize": after_optimize}


def print_figures(r: dict[str, Any]) -> None:
    """Each figure beside its target."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    changed, optimized = r["changed"], r["optimized"]
    print(f"remote (Databricks) sensing path on local Spark, {r['tables']} tables (setup {r['setup_s']} s):")
    print(f"  baseline tick: {r['baseline']['queries']} queries, {r['baseline']['seconds']} s")
    print(f"  steady tick: {r['steady']['queries']} queries, {r['steady']['seconds']} s "
          f"(target O(1): one catalog query; {verdict(r['steady']['queries'] <= 1)})")
    limit = 1 + 2 * changed
    print(f"  tick with {changed} changed tables: {r['with_changes']['queries']} queries, "
          f"{r['with_changes']['new_data']} with new data, {r['with_changes']['seconds']} s "
          f"(target <= {limit} = 1 + 2 per changed table, {changed} with new data; "
          f"{verdict(r['with_changes']['queries'] <= limit and r['with_changes']['new_data'] == changed)})")
    print(f"  tick after {optimized} OPTIMIZE commits: {r['after_optimize']['queries']} queries, "
          f"{r['after_optimize']['new_data']} with new data, {r['after_optimize']['seconds']} s "
          f"(target: 0 with new data, nothing triggered; {verdict(r['after_optimize']['new_data'] == 0)})")
    for tick in ("baseline", "steady", "with_changes", "after_optimize"):
        if r[tick]["errors"]:
            print(f"  {tick}: {r[tick]['errors']} error(s), first: {r[tick]['first_error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--optimized", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (last line)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hb-remote-sensing-") as tmp:
        result = measure(args.tables, args.changed, args.optimized, Path(tmp))
    if args.json:
        print(json.dumps(result))
    else:
        print_figures(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
