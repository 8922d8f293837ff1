#!/usr/bin/env python
"""Minimal reproduction of the embedded engine's memory growth per SQL parse (pysail 0.7.2).

    python docs/sail_leak_repro.py [PARSES]

Starts Sail in this process, then measures this process's RSS around PARSES (default 2,000) calls
of each kind: a plain SQL text, a read of a view nested four deep (each read re-parses the four
view definitions), and a DataFrame without SQL. Then it stops Sail and starts it again in the same
process. Figures and context: docs/memory.md. Drop this file once a pysail release frees the memory
(upstream: lakehq/sail#2528); the expected output then is ~0 KiB per call for every kind.
"""

from __future__ import annotations

import os
import sys


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def per_call_kib(label: str, call, count: int) -> None:
    for _ in range(50):  # warm-up: caches, thread pools
        call()
    before = rss_mib()
    for _ in range(count):
        call()
    grown = rss_mib() - before
    print(f"{label:<36} {grown:8.1f} MiB over {count:,} calls = {grown * 1024 / count:6.1f} KiB per call", flush=True)


def main(count: int) -> None:
    os.environ.setdefault("RUST_LOG", "error")
    from pysail.spark import SparkConnectServer
    from pyspark.sql import SparkSession

    for start in (1, 2):
        server = SparkConnectServer("127.0.0.1", 0)
        server.start(background=True)
        host, port = server.listening_address
        spark = SparkSession.builder.remote(f"sc://{host}:{port}").create()
        print(f"-- Sail start {start} in this process: RSS {rss_mib():.0f} MiB", flush=True)
        spark.sql("CREATE OR REPLACE VIEW v1 AS SELECT id FROM range(10)")
        for level in (2, 3, 4):
            spark.sql(f"CREATE OR REPLACE VIEW v{level} AS SELECT id FROM v{level - 1} WHERE id >= 0")
        per_call_kib("spark.sql('SELECT 1').collect()", lambda: spark.sql("SELECT 1").collect(), count)
        per_call_kib("spark.table('v4').collect() (4 views)", lambda: spark.table("v4").collect(), count)
        per_call_kib("spark.range(1).collect() (no SQL)", lambda: spark.range(1).collect(), count)
        spark.stop()
        server.stop()
        print(f"-- Sail stopped: RSS {rss_mib():.0f} MiB (nothing given back)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
