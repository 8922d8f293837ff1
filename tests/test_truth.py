"""What Heartbeat shows is true: a run's own duration, a refused trigger call, a failing source.

Real runner, CLI and ``ui`` processes on one lakehouse built by real ticks (Sail, Delta, dbt,
local job processes). Four jobs:

- SLOW sleeps 4 s, FAST exits at once; each writes the times it measured itself. The tick that
  notices their end comes seconds later, so detection latency would show as a wrong duration.
- GHOST is not in the jobs file: the jobs API (the local backend) refuses every call.
- BROKEN reads a Delta table that does not exist: its sensing fails every tick.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, serving_page
from harness import config_row as row

SELF_TIMED = ("import json, os, pathlib, sys, time; start = time.time(); time.sleep(float(sys.argv[1])); "
              "out = pathlib.Path(os.environ['HEARTBEAT_HOME']) / 'timed'; out.mkdir(exist_ok=True); "
              "(out / os.environ['HEARTBEAT_JOB_ID']).write_text(json.dumps({'start': start, 'end': time.time()}))")


def jobs_file(path: Path) -> Path:
    lines = ["jobs:"] + [f"  {job!r}: [{sys.executable!r}, '-c', {SELF_TIMED!r}, {seconds!r}]"
                         for job, seconds in (("SLOW", "4"), ("FAST", "0"), ("BROKEN", "0"))]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> CliLakehouse:
    root = tmp_path_factory.mktemp("truth")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "slow", "SLOW"), row("trigger_file", "fast", "FAST"),
                                 row("trigger_file", "ghost", "GHOST"),
                                 row("delta_table", "nowhere.missing_table", "BROKEN")]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=jobs_file(root / "jobs.yml"))
    lake.cli("seed")
    lake.cli("run", check=False)  # baselines (exit 2: BROKEN fails sensing)
    for folder in ("slow", "fast", "ghost"):
        lake.drop_trigger_file(folder, "a.ready")
    lake.cli("run", check=False)  # triggers SLOW and FAST; GHOST is refused (exit 2: some call failed)
    timed = lake.home / "timed"
    deadline = time.monotonic() + 120
    while not all((timed / job).exists() for job in ("SLOW", "FAST")):
        assert time.monotonic() < deadline, "the jobs did not finish"
        time.sleep(0.5)
    time.sleep(3)  # the end is noticed well after it happened
    lake.cli("run", check=False)
    return lake


@pytest.fixture(scope="module")
def page(lake):
    with serving_page(lake) as base:
        yield base


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def measured(lake: CliLakehouse, job: str) -> float:
    times = json.loads((lake.home / "timed" / job).read_text())
    return times["end"] - times["start"]


@pytest.mark.parametrize("job", ["SLOW", "FAST"])
def test_a_runs_duration_is_its_own_on_the_job_page_and_the_overview(lake, page, job):
    own = measured(lake, job)
    (run,) = get(f"{page}/api/jobs/{job}")["runs"]
    assert run["outcome"] == "COMPLETED"
    assert abs(run["duration_s"] - own) < 1.0, (run, own)
    (summary,) = [j for j in get(f"{page}/api/overview")["jobs"] if j["job_id"] == job]
    assert abs(summary["last_run"]["duration_s"] - own) < 1.0


def test_the_slow_run_is_longer_than_the_fast_one_by_what_they_measured(lake, page):
    durations = {job: get(f"{page}/api/jobs/{job}")["runs"][0]["duration_s"] for job in ("SLOW", "FAST")}
    assert durations["SLOW"] - durations["FAST"] == pytest.approx(measured(lake, "SLOW") - measured(lake, "FAST"),
                                                                   abs=1.0)


def test_a_refused_trigger_call_is_named_not_ready_and_never_drawn_as_running(lake, page):
    explained = json.loads(lake.cli("explain", "--job-id", "GHOST", "--json").stdout)
    assert explained["verdict"].startswith("trigger call failed: ")
    assert "same idempotency token" in explained["verdict"] and "ready: triggers" not in explained["verdict"]
    job = get(f"{page}/api/jobs/GHOST")
    assert job["phase"] == "TRIGGER_ERROR"
    assert [r["outcome"] for r in job["runs"]] and {r["outcome"] for r in job["runs"]} == {"TRIGGER_ERROR"}
    assert all(r["duration_s"] is None for r in job["runs"])


def test_a_failing_source_is_visible_in_status_and_on_the_page(lake, page):
    rows = json.loads(lake.cli("status", "--json").stdout)
    (broken,) = [r for r in rows if r["trigger_job_id"] == "BROKEN"]
    assert broken["sensing_error"] and broken["last_error"].startswith("sensing failed: ")
    assert all(r["sensing_error"] is None for r in rows if r["trigger_job_id"] != "BROKEN")
    table = lake.cli("status").stdout
    assert "sensing failed" in table
    (summary,) = [j for j in get(f"{page}/api/overview")["jobs"] if j["job_id"] == "BROKEN"]
    assert summary["phase"] == "SENSING_ERROR"


def test_whether_a_runner_is_ticking_is_shown_by_status_and_the_page(lake, page):
    """Right after a tick the runner counts as ticking; once its last tick is an hour old
    (what a stopped runner leaves behind), `status`, `status --json` and the page say it is not."""
    lake.cli("run", check=False)  # the module's earlier ticks may be older than the limit by now
    rows = json.loads(lake.cli("status", "--json").stdout)
    assert rows and all(r["runner_healthy"] is True and r["runner_last_tick_at"] for r in rows)
    assert "runner: ticking (last tick ended" in lake.cli("status").stdout
    assert get(f"{page}/api/runner")["healthy"] is True

    alive = lake.home / "locks" / "heartbeat.alive"
    recorded = alive.read_text()
    stopped = json.loads(recorded)
    stopped["ticked_at"] -= 3600
    alive.write_text(json.dumps(stopped))
    try:
        rows = json.loads(lake.cli("status", "--json").stdout)
        assert all(r["runner_healthy"] is False for r in rows)
        text = lake.cli("status").stdout
        assert "runner: NOT TICKING (last tick ended" in text and "s ago" in text
        runner = get(f"{page}/api/runner")
        assert runner["healthy"] is False and runner["message"].startswith("runner not ticking: the last tick ended")
        assert runner["age_s"] >= 3600 > runner["limit_s"]
    finally:
        alive.write_text(recorded)
