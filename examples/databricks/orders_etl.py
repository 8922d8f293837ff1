"""Example downstream task: process exactly the data Heartbeat says is new.

Heartbeat starts the job with two job parameters; the job passes them to this task
(see resources/example_downstream.job.yml)::

    --heartbeat-run-id  {{job.parameters.heartbeat_run_id}}   the tick that triggered the run
    --heartbeat-windows {{job.parameters.heartbeat_windows}}  JSON list of
                        {"sensor_source", "sensor_id", "from", "to"}, one per consumed source

For a ``delta_table`` source, ``from``/``to`` read ``version N``: the Delta versions the
run should cover. A run started by hand gets the defaults (no windows) and processes
the full tables. The job's last task records completion with
``python -m heartbeat_runner complete``.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass

_VERSION = re.compile(r"^\s*version\s+(\d+)\s*$")


@dataclass(frozen=True)
class Read:
    """One table read: whole table, or the Delta versions [first, last] of it."""

    table: str
    first_version: int | None = None
    last_version: int | None = None


def parse_windows(text: str | None) -> list[dict[str, str | None]]:
    """The ``heartbeat_windows`` parameter as a list; empty for a manual run."""
    windows = json.loads(text) if text and text.strip() else []
    if not isinstance(windows, list) or not all(isinstance(w, dict) and "sensor_id" in w for w in windows):
        raise ValueError(f"heartbeat_windows is not a list of windows: {text!r}")
    return windows


def plan_reads(windows: list[dict[str, str | None]], default_tables: list[str]) -> list[Read]:
    """What to read: the versions each Delta window names, or every default table in full."""
    if not windows:
        return [Read(table) for table in default_tables]
    reads = []
    for window in windows:
        if window.get("sensor_source") not in ("delta_table", "lmu_delta_table"):
            continue
        first, last = (_VERSION.match(window.get(k) or "") for k in ("from", "to"))
        reads.append(Read(str(window["sensor_id"]), int(first.group(1)) if first else None,
                          int(last.group(1)) if last else None))
    return reads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeat-run-id", default="")
    parser.add_argument("--heartbeat-windows", default="[]")
    parser.add_argument("--table", action="append", default=[], help="table to process on a manual run")
    args = parser.parse_args(argv)
    reads = plan_reads(parse_windows(args.heartbeat_windows), args.table)
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
