"""The production engine at production size (issue 55): a thousand sources tick on Spark classic with a 1 GiB
driver, the size that used to kill the driver on its first tick.

The workload is benchmarks/engines.py's (benchmarks/run.py's ``Workload``), run as the benchmark runs it, in a
process of its own with the heap set: timings are the benchmark's business, this test checks what a user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SOURCES = 1000


def _first_busy_tick(root: Path) -> tuple[set[int], set[str]]:
    """The benchmark's first busy tick: the sources it changes (``Workload.busy_set(0)``) and the jobs it must
    start, those whose every hard source got data (soft ones never start a job)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import run as bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    workload = bench.Workload(root, SOURCES)
    changed = {sensor.index for sensor in workload.busy_set(0)}
    hard: dict[str, set[int]] = {}
    for sensor in workload.sensors:
        if sensor.hard:
            hard.setdefault(sensor.job, set()).add(sensor.index)
    return changed, {job for job, indexes in hard.items() if indexes <= changed}


@pytest.mark.spark
@pytest.mark.timeout(1500)
def test_a_thousand_sources_tick_on_spark_classic_with_a_1g_driver(tmp_path):
    """1,000 sources (667 Delta tables, 333 trigger folders, 333 jobs) on Spark classic with
    HEARTBEAT_SPARK_DRIVER_MEMORY=1g: the first tick senses every source without an error (it used to end in
    ``OutOfMemoryError: Java heap space``), a steady tick finds nothing and starts nothing, a busy tick finds
    exactly the 100 changed sources and starts exactly the jobs whose hard sources all changed, each once, and
    the driver's old generation stayed below its maximum. One JVM start."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYSPARK_SUBMIT_ARGS")}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "engines.py"), "--one", "spark-classic",
                           "--sensors", str(SOURCES), "--repeats", "1", "--status-samples", "0", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=1400, cwd=tmp_path,
                          env={**env, "HEARTBEAT_SPARK_DRIVER_MEMORY": "1g"})
    assert proc.returncode == 0, f"exit {proc.returncode}\nstderr:{proc.stderr[-6000:]}"
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    first, steady, busy = figures["first_tick"], figures["steady"]["runs"][0], figures["busy"]["runs"][0]

    assert (first["sensed"], first["errors"]) == (SOURCES, 0), first
    assert (steady["sensed"], steady["errors"], steady["new_data"], steady["triggered"]) == (SOURCES, 0, 0, 0), steady
    changed, expected = _first_busy_tick(tmp_path)
    assert (busy["errors"], busy["new_data"]) == (0, len(changed)), busy
    assert busy["triggered"] == len(expected), busy
    ran = {stamp.name: len(stamp.read_text().split()) for stamp in (tmp_path / "stamps").iterdir()}
    assert ran == dict.fromkeys(expected, 1), "each job whose hard sources changed ran once, no other job ran"

    peak, maximum = (int(part) for part in figures["driver_heap_mib"].split("/"))
    assert 0 < peak < maximum <= 1024, figures["driver_heap_mib"]
