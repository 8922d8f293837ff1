"""What Heartbeat shows is true in both ways a runner runs: a tick per process (cron, a systemd timer, a
Databricks scheduled job: ``python -m heartbeat_runner run`` once per tick) and one ``run --loop``.

Every test runs once per mode (the ``mode`` fixture), on lakehouses built by real CLI processes (Sail,
Delta, dbt, local job processes):

- durations: the control table's ``job_end_timestamp`` is the run's own completion time. The spec
  (heartbeat_sensor.md): ``job_start_timestamp`` is set when the job is triggered, ``job_end_timestamp`` to
  the job's completion time. FAST exits at once, MID sleeps 2 s; their end is noticed seconds later.
  ``status --json``, ``runs --json`` and ``explain --json`` tell each run's own duration. Comparisons are
  against the times the jobs backend recorded (the launcher's ``result.json``) or the job measured itself,
  so the machine's speed does not matter.
- stale verdicts: after idle ticks, ``explain`` (text and JSON) and the page tell the latest tick's
  sensing, not the warning of the tick that skipped the source while its jobs ran ("FAST in progress").
- errors: a source whose sensing fails and a job whose trigger call is refused are named as such.
"""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, serving_page
from harness import config_row as row

from heartbeat_runner.runner.alerting import liveness_path

#: every test runs a `run` process per tick or a `run --loop`: several real processes each, so CI's leg only
#: (tests/README.md, "How to add a test"); the README's test command stays the everyday one
pytestmark = pytest.mark.slow

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


def _wait_ticks(lake: CliLakehouse, loop: subprocess.Popen, count: int) -> None:
    """Wait until the loop has finished ``count`` more ticks (its liveness file moves once per tick)."""
    deadline = time.monotonic() + 300
    for _ in range(count):
        before = _ticked_at(lake)
        while _ticked_at(lake) <= before:
            assert loop.poll() is None, loop.stderr.read() if loop.stderr else loop.returncode
            assert time.monotonic() < deadline, "the loop did not tick"
            time.sleep(0.2)


class Ticks:
    """The ticks of one mode: ``once`` runs a ``run`` process per tick; ``loop`` runs one ``run --loop``
    (started on entry, stopped on exit) and waits for its ticks."""

    def __init__(self, lake: CliLakehouse, mode: str):
        self.lake, self.mode = lake, mode
        self.loop: subprocess.Popen | None = None

    def __enter__(self) -> Ticks:
        if self.mode == "loop":
            self.loop = self.lake.start("run", "--loop", "--interval", "1")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None:
            self.loop.terminate()
            self.loop.wait(timeout=120)

    def tick(self, count: int = 1) -> None:
        """``count`` more ticks, each begun after this call (a loop's tick under way when called is not one)."""
        if self.loop is None:
            for _ in range(count):
                self.lake.cli("run", check=False)
        else:
            _wait_ticks(self.lake, self.loop, count + 1)


def _lakehouse(root: Path, *rows: str) -> CliLakehouse:
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, *rows]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=_jobs_file(root / "jobs.yml"))
    lake.cli("seed")
    return lake


@pytest.fixture(scope="module", params=["once", "loop"])
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def lake(mode, tmp_path_factory) -> CliLakehouse:
    """FAST and MID triggered, their end noticed seconds later, then idle ticks."""
    lake = _lakehouse(tmp_path_factory.mktemp(f"truth-{mode}"), row("trigger_file", "fast", "FAST"),
                      row("trigger_file", "mid", "MID"))
    with Ticks(lake, mode) as ticks:
        ticks.tick()  # baselines
        for folder in ("fast", "mid"):
            lake.drop_trigger_file(folder, "a.ready")
        ticks.tick()  # triggers both
        _wait_for_runs(lake)
        time.sleep(2)  # the end is noticed well after it happened
        ticks.tick()  # notices their end (their sources skipped: "FAST in progress")
        ticks.tick(2)  # idle: nothing new
    return lake


@pytest.fixture(scope="module")
def errors_lake(mode, tmp_path_factory) -> CliLakehouse:
    """GHOST is not in the jobs file (the jobs API refuses every call); BROKEN's source does not exist."""
    lake = _lakehouse(tmp_path_factory.mktemp(f"errors-{mode}"), row("trigger_file", "ghost", "GHOST"),
                      row("delta_table", "nowhere.missing_table", "BROKEN"))
    with Ticks(lake, mode) as ticks:
        ticks.tick()  # baselines (BROKEN fails)
        lake.drop_trigger_file("ghost", "a.ready")
        ticks.tick(2)  # GHOST refused, asked again
    return lake




def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def _latest_sensing(lake: CliLakehouse) -> datetime:
    """When the latest tick sensed (an idle tick's, from the liveness file every tick rewrites)."""
    idle = json.loads(liveness_path(lake.home).read_text())["idle_sensing"]
    assert idle is not None, "the latest tick was not idle"
    return _ts(idle["sensed_at"])


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


# -- stale verdicts after idle ticks ----------------------------------------------------------------

@pytest.mark.parametrize("job", list(SECONDS))
def test_after_idle_ticks_explain_tells_the_latest_sensing_not_a_finished_runs_skip(lake, job):
    """The tick that noticed the end skipped the job's source ("MID in progress"); the idle ticks after it
    sensed it with nothing new. `explain` (JSON and text) tells the latest of these, with no warning."""
    latest = _latest_sensing(lake)
    answer = lake.cli("explain", "--job-id", job, "--json").stdout
    explained = json.loads(answer)
    (shown,) = explained["rows"]
    assert shown["status"] == "COMPLETED"
    assert "in progress" not in answer, explained
    assert shown["last_outcome"] == "NO_NEW_DATA" and shown["last_outcome_detail"] is None
    assert _ts(shown["last_evaluated_at"]) == latest
    assert shown["row_state"] == "no new data yet"
    assert explained["verdict"] == f"waiting for new data on hard dependency trigger_file:{job.lower()}"
    text = lake.cli("explain", "--job-id", job).stdout
    assert "in progress" not in text and "warning" not in text
    assert f"{latest:%Y-%m-%d %H:%M:%S}" in text


def test_after_idle_ticks_the_page_tells_the_latest_sensing(lake):
    latest = _latest_sensing(lake)
    with serving_page(lake) as page:
        overview = _get(f"{page}/api/overview")["jobs"]
        pages = {job: _get(f"{page}/api/jobs/{job}") for job in SECONDS}
    assert {j["job_id"] for j in overview} == set(SECONDS)
    assert "in progress" not in json.dumps(overview) and "in progress" not in json.dumps(pages)
    for job, shown in pages.items():
        (dependency,) = shown["rows"]
        assert dependency["last_outcome"] == "NO_NEW_DATA" and _ts(dependency["last_evaluated_at"]) == latest, job


# -- errors ------------------------------------------------------------------------------------------

def test_a_refused_trigger_call_is_named_in_explain_and_on_theserving_page(errors_lake):
    explained = json.loads(errors_lake.cli("explain", "--job-id", "GHOST", "--json").stdout)
    assert explained["verdict"].startswith("trigger call failed: ")
    assert "same idempotency token" in explained["verdict"]
    assert "trigger call failed: " in errors_lake.cli("explain", "--job-id", "GHOST").stdout
    with serving_page(errors_lake) as page:
        assert _get(f"{page}/api/jobs/GHOST")["phase"] == "TRIGGER_ERROR"


def test_a_failing_source_is_named_in_status_explain_and_on_theserving_page(errors_lake):
    rows = json.loads(errors_lake.cli("status", "--json").stdout)
    (broken,) = [r for r in rows if r["trigger_job_id"] == "BROKEN"]
    assert broken["sensing_error"] and broken["last_error"].startswith("sensing failed: ")
    (shown,) = json.loads(errors_lake.cli("explain", "--job-id", "BROKEN", "--json").stdout)["rows"]
    assert shown["sensing_error"] and shown["last_outcome"] == "ERROR"
    assert "sensing failed" in errors_lake.cli("status").stdout
    with serving_page(errors_lake) as page:
        (summary,) = [j for j in _get(f"{page}/api/overview")["jobs"] if j["job_id"] == "BROKEN"]
    assert summary["phase"] == "SENSING_ERROR"


# -- alerts ------------------------------------------------------------------------------------------

def test_a_tick_per_process_raises_sensing_and_trigger_error_alerts_once_past_their_thresholds(tmp_path):
    """`sensing_error_after` and `trigger_error_after` count from the first failure in a tick per process as
    in a loop: each process reads since when the source fails (the run report) and since when the job's
    trigger call is refused (its events), instead of starting the count at its own tick."""
    from alert_receivers import AlertReceiver

    with AlertReceiver() as receiver:
        policy = tmp_path / "run_policies.yml"
        policy.write_text("alerts:\n  group_interval: off\n  default:\n    source: {sensing_error_after: 6s}\n"
                          "    job: {trigger_error_after: 6s}\n"
                          "  destinations:\n    hook: {type: webhook, url_env: HB_TRUTH_HOOK}\n")
        lake = _lakehouse(tmp_path, row("delta_table", "nowhere.missing_table", "BROKEN"),
                          row("trigger_file", "ghost", "GHOST"))
        env = {"HEARTBEAT_RUN_POLICY": str(policy), "HB_TRUTH_HOOK": f"{receiver.url}/hook"}
        assert lake.cli("run", check=False, env=env).returncode == 2  # BROKEN's first failure
        lake.drop_trigger_file("ghost", "a.ready")
        began = time.monotonic()
        assert lake.cli("run", check=False, env=env).returncode == 2  # GHOST's first refusal
        while time.monotonic() - began < 8:
            assert lake.cli("run", check=False, env=env).returncode == 2
        assert lake.cli("run", check=False, env=env).returncode == 2  # more than 6 s after both began
        raised = {json.loads(e["payload"])["kind"]: json.loads(e["payload"]) for e in lake.events("ALERT_RAISED")}
    assert set(raised) == {"SENSING_ERROR", "TRIGGER_ERROR"}, raised
    assert raised["SENSING_ERROR"]["subject"] == "source delta_table:nowhere.missing_table"
    assert raised["TRIGGER_ERROR"]["subject"] == "job GHOST"
    first_failure = min(_ts(e["snapshot_ts"].isoformat()) for e in lake.table("heartbeat_run_report"))
    assert _ts(raised["SENSING_ERROR"]["since"]) == first_failure
    first_refusal = min(e["event_ts"] for e in lake.events("TRIGGER_ERROR"))
    assert _ts(raised["TRIGGER_ERROR"]["since"]) == _ts(first_refusal.isoformat())
