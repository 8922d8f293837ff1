"""Example downstream task: process exactly the data Heartbeat says is new.

Heartbeat starts the job with job parameters; the job passes two to this task
(see resources/example_downstream.job.yml)::

    --heartbeat-run-id {{job.parameters.heartbeat_run_id}}  the tick that triggered the run
    --heartbeat-params {{job.parameters.heartbeat_params}}  the run's windows as JSON (version 1):
        {"version": 1, "run_id": ..., "window": ..., "catch_up": ...,
         "sources": [{"sensor_source", "sensor_id", "kind", "from", "until", "rows", ...}]}

For a ``delta_table`` source without ``upstream_key`` the kind is ``delta_version``: the run
covers the Delta versions after ``from`` up to ``until`` (``from`` null: from the first). No
text is parsed. A run started by hand gets the default (empty) and processes the full
tables. The job's last task records completion with ``python -m heartbeat_runner complete``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

#: the versions of the ``heartbeat_params`` schema this job understands
SUPPORTED_VERSIONS = (1,)


@dataclass(frozen=True)
class Read:
    """One table read: whole table, or the Delta versions [first, last] of it."""

    table: str
    first_version: int | None = None
    last_version: int | None = None


def parse_params(text: str | None) -> list[dict[str, Any]]:
    """The sources of the ``heartbeat_params`` parameter; empty for a manual run."""
    if not text or not text.strip():
        return []
    params = json.loads(text)
    if not isinstance(params, dict) or params.get("version") not in SUPPORTED_VERSIONS:
        raise ValueError(f"heartbeat_params: expected a JSON object of version {SUPPORTED_VERSIONS}: {text!r}")
    return list(params["sources"])


def plan_reads(sources: list[dict[str, Any]], default_tables: list[str]) -> list[Read]:
    """What to read: the versions each Delta window covers, or every default table in full."""
    if not sources:
        return [Read(table) for table in default_tables]
    return [Read(str(s["sensor_id"]), None if s["from"] is None else int(s["from"]) + 1, int(s["until"]))
            for s in sources if s["kind"] == "delta_version"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeat-run-id", default="")
    parser.add_argument("--heartbeat-params", default="")
    parser.add_argument("--table", action="append", default=[], help="table to process on a manual run")
    args = parser.parse_args(argv)
    reads = plan_reads(parse_params(args.heartbeat_params), args.table)
    print(f"heartbeat run {args.heartbeat_run_id or '(manual run)'}: {len(reads)} read(s)")

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    for read in reads:
        if read.first_version is None:
            frame = spark.read.table(read.table)
        else:  # needs delta.enableChangeDataFeed on the upstream table
            frame = (spark.read.option("readChangeFeed", "true")
                     .option("startingVersion", read.first_version)
                     .option("endingVersion", read.last_version if read.last_version is not None else read.first_version)
                     .table(read.table))
        print(f"{read.table} versions {read.first_version}..{read.last_version}: {frame.count()} row(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
