"""The tick benchmark runs end to end and writes valid JSON (quick, 10 sensors; timings are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


@pytest.mark.slow
def test_the_benchmark_runs_and_writes_its_figures(tmp_path):
    out = tmp_path / "latest.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--sizes", "10", "--quick", "--out", str(out),
                           "--work-dir", str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-8000:]
    results = json.loads(out.read_text())
    size = results["sizes"]["10"]
    assert size["sensors"] == 10 and size["steady"]["runs"] and size["busy"]["runs"]
    assert size["busy"]["runs"][0]["new_data"] >= 1 and size["baseline"]["queries"] == 10
    assert results["cold_start"]["sensors"] == 10 and results["loop_latency"]["samples"]
    assert {row["metric"] for row in results["summary"]} >= {"loop_latency_s", "cold_start_10_s"}
    assert "targets:" in done.stdout


@pytest.mark.slow
def test_the_scale_benchmark_runs_and_prints_every_figure_beside_its_target(tmp_path):
    """benchmarks/scale.py at a small size: the copied upstreams are real Delta tables the runner senses (the busy
    tick finds the changed ones and starts their jobs, which end), files are counted per table, and every target
    of issue 44's table is printed (those of sizes not run say so)."""
    out = tmp_path / "scale.json"
    done = subprocess.run([sys.executable, str(BENCHMARK.with_name("scale.py")), "--sizes", "60", "--latency-at", "",
                           "--out", str(out), "--work-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-8000:]
    size = json.loads(out.read_text())["sizes"]["60"]
    assert size["busy"]["new_data"] == size["changed"] == 6 and size["busy"]["triggered"] >= 1
    assert size["steady"]["runs"] and all(run["new_data"] == 0 for run in size["steady"]["runs"])
    assert size["files_per_table"]["heartbeat_control"] >= 1 and size["seed_s"] > 0
    for metric in ("steady_tick_10000_s", "busy_tick_10000_s", "loop_latency_10000_s", "seed_100000_s",
                   "steady_tick_100000_s", "busy_tick_100000_s", "peak_rss_100000_mib"):
        assert metric in done.stdout
