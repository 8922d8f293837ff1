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
