"""The control table's job_end_timestamp is the run's own completion time, in a tick per process and in a loop.

The spec (heartbeat_sensor.md): ``job_start_timestamp`` is set when the job is triggered, ``job_end_timestamp``
to the job's completion time. Two local jobs, FAST (exits at once) and MID (sleeps 2 s), are triggered by
real ticks (``python -m heartbeat_runner run`` once per tick, or one ``run --loop``), and their end is
noticed seconds later. ``status --json``, ``runs --json`` and ``explain --json`` must tell each run's own
duration, never the time a tick took to notice it. Every comparison is against the times the jobs backend
recorded (the launcher's ``result.json``) or the job measured itself, so the machine's speed does not matter.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse
from harness import config_row as row

from heartbeat_runner.runner.alerting import liveness_path

SELF_TIMED = ("import json, os, pathlib, sys, time; start = time.time(); time.sleep(float(sys.argv[1])); "
              "out = pathlib.Path(os.environ['HEARTBEAT_HOME']) / 'timed'; out.mkdir(exist_ok=True); "
              "(out / os.environ['HEARTBEAT_JOB_ID']).write_text(json.dumps({'start': start, 'end': time.time()}))")
SECONDS = {"FAST": "0", "MID": "2"}
#: seconds of clock rounding allowed between two records of the same instant (the tables keep microseconds)
SAME_INSTANT_S = 0.002


def _jobs_file(path: Path) -> Path:
    lines = ["jobs:"] + [f"  {job!r}: [{sys.executable!r}, '-c', {SELF_TIMED!r}, {seconds!r}]"
                         for job, seconds in SECONDS.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _results(lake: CliLakehouse) -> dict[str, dict]:
    """The local backend's own record of each finished run (result.json), by job id."""
    found = {}
    for run_dir in (lake.home / "jobs" / "runs").glob("*"):
        meta, result = run_dir / "meta.json", run_dir / "result.json"
        if meta.exists() and result.exists():
            found[json.loads(meta.read_text())["job_id"]] = {"run_id": run_dir.name, **json.loads(result.read_text())}
    return found


def _wait_for_runs(lake: CliLakehouse) -> None:
    deadline = time.monotonic() + 180
    while set(_results(lake)) != set(SECONDS):
        assert time.monotonic() < deadline, "the jobs did not finish"
        time.sleep(0.3)


def _ticked_at(lake: CliLakehouse) -> float:
    try:
        return float(json.loads(liveness_path(lake.home).read_text())["ticked_at"])
    except (OSError, ValueError, KeyError):
        return 0.0


def _wait_ticks(lake: CliLakehouse, loop, count: int) -> None:
    """Wait until the loop has finished ``count`` more ticks (its liveness file moves once per tick)."""
    deadline = time.monotonic() + 300
    for _ in range(count):
        before = _ticked_at(lake)
        while _ticked_at(lake) <= before:
            assert loop.poll() is None, loop.stderr.read()
            assert time.monotonic() < deadline, "the loop did not tick"
            time.sleep(0.2)


@pytest.fixture(scope="module", params=["once", "loop"])
def lake(request, tmp_path_factory) -> CliLakehouse:
    root = tmp_path_factory.mktemp(f"durations-{request.param}")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "fast", "FAST"), row("trigger_file", "mid", "MID")]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=_jobs_file(root / "jobs.yml"))
    lake.cli("seed")
    if request.param == "once":
        lake.cli("run")  # baselines
        for folder in ("fast", "mid"):
            lake.drop_trigger_file(folder, "a.ready")
        lake.cli("run")  # triggers both
        _wait_for_runs(lake)
        time.sleep(2)  # the end is noticed well after it happened
        lake.cli("run")
        return lake
    loop = lake.start("run", "--loop", "--interval", "1")
    try:
        _wait_ticks(lake, loop, 1)  # baselines
        for folder in ("fast", "mid"):
            lake.drop_trigger_file(folder, "a.ready")
        _wait_for_runs(lake)
        _wait_ticks(lake, loop, 2)  # one of them noticed both ends
    finally:
        loop.terminate()
        loop.wait(timeout=120)
    return lake


def _ts(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed


def _seconds(later: str, earlier: str) -> float:
    return (_ts(later) - _ts(earlier)).total_seconds()


def _measured(lake: CliLakehouse, job: str) -> float:
    times = json.loads((lake.home / "timed" / job).read_text())
    return times["end"] - times["start"]


@pytest.mark.parametrize("job", list(SECONDS))
def test_job_end_timestamp_is_the_runs_own_end_and_start_the_trigger(lake, job):
    """status --json: end − start is the run's duration plus only the wait before it started, not the tick
    that noticed the end; the end is the instant the job's process exited, as its backend recorded it."""
    own = _results(lake)[job]
    (status,) = [r for r in json.loads(lake.cli("status", "--json").stdout) if r["trigger_job_id"] == job]
    assert status["status"] == "COMPLETED"
    assert abs(_seconds(status["job_end_timestamp"], own["ended_at"])) < SAME_INSTANT_S, (status, own)
    (request,) = [e for e in lake.events("TRIGGER_REQUESTED") if e["trigger_job_id"] == job]
    assert abs(_seconds(status["job_start_timestamp"], request["event_ts"].isoformat())) < SAME_INSTANT_S
    duration = _seconds(own["ended_at"], own["started_at"])
    waited = _seconds(own["started_at"], status["job_start_timestamp"])
    assert waited >= 0
    assert _seconds(status["job_end_timestamp"], status["job_start_timestamp"]) == pytest.approx(
        duration + waited, abs=SAME_INSTANT_S)
    assert duration == pytest.approx(_measured(lake, job), abs=1.0)


@pytest.mark.parametrize("job", list(SECONDS))
def test_runs_and_explain_json_give_each_runs_own_duration(lake, job):
    own = _results(lake)[job]
    duration = _seconds(own["ended_at"], own["started_at"])
    ticks = json.loads(lake.cli("runs", "--json").stdout)
    (run,) = [r for t in ticks for r in t["job_runs"] if r["trigger_job_id"] == job]
    explained = json.loads(lake.cli("explain", "--job-id", job, "--json").stdout)
    (latest,) = explained["runs"]
    for shown in (run, latest):
        assert shown["job_run_id"] == own["run_id"] and shown["outcome"] == "COMPLETED"
        assert shown["duration_s"] == pytest.approx(duration, abs=SAME_INSTANT_S)
        assert abs(_seconds(shown["ended_at"], own["ended_at"])) < SAME_INSTANT_S
        assert shown["queued_s"] is None  # a local job waits in no queue


def test_the_mid_run_outlasts_the_fast_one_by_what_they_measured_in_every_output(lake):
    status = {r["trigger_job_id"]: r for r in json.loads(lake.cli("status", "--json").stdout)}
    own = _results(lake)
    lag = {job: _seconds(own[job]["started_at"], status[job]["job_start_timestamp"]) for job in SECONDS}
    span = {job: _seconds(status[job]["job_end_timestamp"], status[job]["job_start_timestamp"]) - lag[job]
            for job in SECONDS}
    assert span["MID"] - span["FAST"] == pytest.approx(_measured(lake, "MID") - _measured(lake, "FAST"), abs=1.0)
