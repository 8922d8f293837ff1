"""Bounded catch-up: a backlog becomes a sequence of runs of at most ``max_window``, oldest first,
each triggered exactly once with its own window, the next only after the previous succeeded.

Real Sail + Delta + dbt and real local job processes; the crash tests kill real runner
processes (``python -m heartbeat_runner run``) between the steps of a sequence.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from cli_runner import run_cli
from harness import HEADER, CliLakehouse, Harness
from harness import config_row as row
from services import postgres  # noqa: F401 (fixture)
from test_source_sap_chain import chain_log  # noqa: F401 (fixture)
from test_source_sap_chain import run as chain_run

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.faults import CRASH_EXIT_CODE
from heartbeat_runner.core.records import EventType
from heartbeat_runner.core.windows import SourceWindow, WindowLimit
from heartbeat_runner.interfaces.operations import explain, record_job_event
from heartbeat_runner.policies.catch_up import CatchUpPolicy
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.sensing.sources.delta_table import DeltaTableSource
from heartbeat_runner.sensing.sources.kafka import KafkaSource
from heartbeat_runner.sensing.sources.sap_chain import SapChainSource

#: A local job that records the parameters of each run it gets (and fails once when told to).
RECORDER = (
    "import json, os, pathlib, sys, time; out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True); "
    "p = json.loads(os.environ['HEARTBEAT_PARAMETERS']); "
    "(out / f'{time.time_ns()}.json').write_text(json.dumps(p)); "
    "flag = out.parent / 'fail_run'; "
    "run = json.loads(p.get('heartbeat_catch_up', '{}')).get('run') or p.get('window_start', '')[11:16]; "
    "sys.exit(1 if flag.exists() and flag.read_text() == str(run) and not flag.unlink() else 0)"
)


def recorder_jobs(path: Path, out: Path, *jobs: str) -> None:
    lines = ["jobs:"]
    for job in jobs:
        lines += [f"  {job!r}:", f"    command: [{sys.executable!r}, '-c', {RECORDER!r}, {str(out / job)!r}]"]
    path.write_text("\n".join(lines) + "\n")


def recorded(out: Path, job: str) -> list[dict]:
    """The parameters of every run of ``job``, in the order they started."""
    return [json.loads(p.read_text()) for p in sorted((out / job).glob("*.json"), key=lambda p: int(p.stem))]


def windows(params: dict) -> list[tuple[str, str]]:
    return [(w["from"], w["to"]) for w in json.loads(params["heartbeat_windows"])]


def settle(hb: Harness, ticks: int = 12) -> None:
    """Tick until nothing runs and no run of a sequence is due (bounded)."""
    for _ in range(ticks):
        hb.wait_for_jobs()
        hb.tick()
        if not hb.app.store.next_windows_due() and "IN_PROGRESS" not in set(hb.status().values()):
            return
    raise AssertionError(f"not settled: {hb.status()}")


def policy_file(root: Path, text: str) -> Path:
    path = root / "policies.yml"
    path.write_text(text)
    return path


# -- cutting backlogs (no engine) ----------------------------------------------------------------

def test_sources_cut_a_backlog_into_windows_in_their_own_terms():
    delta = SourceWindow("delta_table", "up.t", '{"version":3}', '{"version":8}', "version 4", "version 8")
    assert [(w.window_from, w.window_to) for w in DeltaTableSource().split(delta, WindowLimit.parse(2), None)] == \
        [("version 4", "version 5"), ("version 6", "version 7"), ("version 8", "version 8")]
    keyed = SourceWindow("delta_table", "up.t", '{"value":"2026-05-01","version":1}',
                         '{"value":"2026-05-18","version":4}', "day > 2026-05-01", "day <= 2026-05-18")
    pieces = DeltaTableSource().split(keyed, WindowLimit.parse("7d"), "day")
    assert [(w.window_from, w.window_to) for w in pieces] == [
        ("day > 2026-05-01", "day <= 2026-05-08"), ("day > 2026-05-08", "day <= 2026-05-15"),
        ("day > 2026-05-15", "day <= 2026-05-18")]
    kafka = SourceWindow("kafka", "p: t", '{"0":10,"1":0}', '{"0":35,"1":5}', "0:10,1:0", "0:35,1:5")
    assert [(w.window_from, w.window_to) for w in KafkaSource().split(kafka, WindowLimit.parse(10), None)] == [
        ("0:10,1:0", "0:20,1:5"), ("0:20,1:5", "0:30,1:5"), ("0:30,1:5", "0:35,1:5")]
    with pytest.raises(SourceError, match="Delta versions"):
        DeltaTableSource().split(delta, WindowLimit.parse("7d"), None)
    ends = [f'{{"load_date":"2026010{d}010000"}}' for d in range(2, 7)]  # five green runs sensing saw
    chain = SourceWindow("sap_b4", "ZCHAIN", '{"load_date":"20260101010000"}', ends[-1], None, None, tuple(ends))
    assert [(w.window_from, w.window_to) for w in SapChainSource().split(chain, WindowLimit.parse(2), None)] == [
        ("LOAD_DATE > 20260101010000", "LOAD_DATE <= 20260103010000"),
        ("LOAD_DATE > 20260103010000", "LOAD_DATE <= 20260105010000"),
        ("LOAD_DATE > 20260105010000", "LOAD_DATE <= 20260106010000")]
    with pytest.raises(SourceError, match="green runs"):
        SapChainSource().split(chain, WindowLimit.parse("7d"), None)


def test_a_bad_policy_is_a_clear_error_naming_the_file(tmp_path):
    from heartbeat_runner.core.errors import ConfigError

    assert load_run_policies(policy_file(tmp_path, 'jobs: {"7": {catch_up: {max_window: 7d}}}')).catch_up["7"] == \
        CatchUpPolicy(WindowLimit.parse("7d"))
    for text, words in [('jobs: {"7": {catch_up: {max_window: soon}}}', "max_window 'soon'"),
                        ('jobs: {"7": {catch_up: {max_window: 3, max_in_flight: 2}}}', "only 1 is supported"),
                        ('jobs: {"7": {catch_up: {size: 3}}}', "unknown catch_up setting")]:
        with pytest.raises(ConfigError, match="policies.yml") as raised:
            load_run_policies(policy_file(tmp_path, text))
        assert words in str(raised.value)


# -- sequences on a real lakehouse ---------------------------------------------------------------

@contextlib.contextmanager
def events_lakehouse(tmp_path: Path, policy: str) -> Iterator[Harness]:
    """Job J reads the Delta table up.events under ``policy``; its runs are recorded in <tmp>/out/J."""
    with Harness(tmp_path, HEARTBEAT_RUN_POLICY=str(policy_file(tmp_path, policy))) as hb:
        hb.create_table("up.events", "id INT")
        hb.seed(row("delta_table", "up.events", "J"))
        recorder_jobs(hb.jobs_path, tmp_path / "out", "J")
        hb.tick()  # baseline
        yield hb


def test_a_backlog_of_delta_versions_after_a_pause_runs_window_by_window_in_order(tmp_path):
    out = tmp_path / "out"
    with events_lakehouse(tmp_path, 'jobs: {"J": {max_retries: 1, backoff_s: 0, catch_up: {max_window: 2}}}') as hb:
        record_job_event(hb.app, "J", EventType.JOB_PAUSED)
        for i in range(5):
            hb.insert("up.events", f"({i})")
        hb.tick()  # paused: nothing sensed, nothing triggered
        record_job_event(hb.app, "J", EventType.JOB_RESUMED)
        out.mkdir()
        (out / "fail_run").write_text("2")  # run 2 fails once; its automatic retry succeeds
        first = hb.tick()
        assert first.triggered_job_ids == ["J"]
        verdict = explain(hb.app.store, "J").verdict
        assert "catch-up run 1 of 3" in verdict and "version 1" in verdict, verdict
        settle(hb)

        runs = recorded(out, "J")
        assert [windows(p) for p in runs] == [[("version 1", "version 2")], [("version 3", "version 4")],
                                              [("version 3", "version 4")], [("version 5", "version 5")]]
        assert [json.loads(p["heartbeat_catch_up"])["run"] for p in runs] == [1, 2, 2, 3]
        structured = [json.loads(p["heartbeat_params"]) for p in runs]  # the same windows, no text to parse
        assert [[(s["kind"], s["from"], s["until"]) for s in p["sources"]] for p in structured] == [
            [("delta_version", 0, 2)], [("delta_version", 2, 4)], [("delta_version", 2, 4)], [("delta_version", 4, 5)]]
        assert [p["catch_up"] for p in structured] == [{"run": 1, "runs": 3}, {"run": 2, "runs": 3},
                                                       {"run": 2, "runs": 3}, {"run": 3, "runs": 3}]
        assert not any(k.startswith("_") for p in runs for k in p), "the plan is Heartbeat's, not the job's"
        assert len(hb.events("TRIGGER_REQUESTED")) == 1 and len(hb.events("NEXT_WINDOW_REQUESTED")) == 2
        assert len(hb.events("RETRY_REQUESTED")) == 1 and len(hb.events("FAILED")) == 1
        assert hb.job_status("J") == {"COMPLETED"}

        hb.insert("up.events", "(9)")  # after the sequence, new data triggers as usual: one run
        settle(hb)
        assert windows(recorded(out, "J")[-1]) == [("version 6", "version 6")]
        assert "heartbeat_catch_up" not in recorded(out, "J")[-1]


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_a_minimum_interval_spaces_the_runs_of_a_sequence_and_each_window_still_runs_once(tmp_path):
    """Trigger shaping (issue 57) on a catch-up sequence: each next run keeps the job's minimum interval (it is
    held, not recorded, until the interval has passed since the run before it started) and each window runs
    exactly once, in order."""
    out, interval = tmp_path / "out", 3
    policy = f'jobs: {{"J": {{catch_up: {{max_window: 2}}, trigger: {{min_interval: {interval}s}}}}}}'
    with events_lakehouse(tmp_path, policy) as hb:
        record_job_event(hb.app, "J", EventType.JOB_PAUSED)
        for i in range(5):
            hb.insert("up.events", f"({i})")
        hb.tick()
        record_job_event(hb.app, "J", EventType.JOB_RESUMED)
        assert hb.tick().triggered_job_ids == ["J"]                # run 1 of 3: never ran, nothing to wait for
        held: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (hb.app.store.next_windows_due()
                                               or "IN_PROGRESS" in set(hb.status().values())):
            held += [p.message for p in hb.tick().held]            # the tick that records a run's end decides
            time.sleep(0.2)
        assert any(h.startswith("held by min_interval until") for h in held), held
        assert [windows(p) for p in recorded(out, "J")] == [[("version 1", "version 2")], [("version 3", "version 4")],
                                                           [("version 5", "version 5")]]
        starts = [e["event_ts"] for e in hb.events() if e["event_type"] in ("TRIGGER_REQUESTED", "NEXT_WINDOW_REQUESTED")]
        assert len(starts) == 3 and all(b - a >= timedelta(seconds=interval) for a, b in zip(starts, starts[1:])), starts


def test_a_failure_stops_the_sequence_until_the_window_succeeds(tmp_path):
    out = tmp_path / "out"
    with events_lakehouse(tmp_path, 'jobs: {"J": {catch_up: {max_window: 1}}}') as hb:
        for i in range(3):
            hb.insert("up.events", f"({i})")
        out.mkdir()
        (out / "fail_run").write_text("2")
        hb.tick()
        for _ in range(4):
            hb.wait_for_jobs()
            hb.tick()
        assert hb.job_status("J") == {"FAILED"}
        assert [json.loads(p["heartbeat_catch_up"])["run"] for p in recorded(out, "J")] == [1, 2]  # no run 3
        assert explain(hb.app.store, "J").verdict.startswith("blocked by failure")
        env = {**os.environ, "HEARTBEAT_HOME": str(hb.home), "HEARTBEAT_CONFIG": str(hb.config_path)}
        status = run_cli(["status", "--wide"], env=env, cwd=hb.root, timeout=180)
        assert "Catch-up sequences" in status.stdout and "version 2" in status.stdout, status.stdout + status.stderr
        compact = run_cli(["status"], env={**env, "COLUMNS": "80"}, cwd=hb.root, timeout=180).stdout  # the on-call view
        lines = compact.splitlines()
        assert "catch-up sequences: 1" in lines and max(map(len, lines)) <= 80, compact
        (sequence,) = [line for line in lines if line.startswith("  J: run 2 of 3 failed")]
        assert "version 2" in sequence, compact                                  # run 2's window

        record_job_event(hb.app, "J", EventType.COMPLETED, message="window 2 fixed by hand")  # the operator
        hb.app.control.refresh()
        assert "run 3 is requested at the next tick" in explain(hb.app.store, "J").verdict
        settle(hb)
        assert [windows(p) for p in recorded(out, "J")][-1] == [("version 3", "version 3")]
        assert len(recorded(out, "J")) == 3


def test_a_date_key_backlog_runs_in_spans_of_seven_days(tmp_path):
    out = tmp_path / "out"
    policy = policy_file(tmp_path, 'jobs: {"D": {catch_up: {max_window: 7d}}}')
    with Harness(tmp_path, HEARTBEAT_RUN_POLICY=str(policy)) as hb:
        hb.create_table("up.daily", "day DATE, amount INT")
        hb.insert("up.daily", "(DATE'2026-05-01', 1)")
        hb.seed(row("delta_table", "up.daily", "D", key="day"))
        recorder_jobs(hb.jobs_path, out, "D")
        hb.tick()  # baseline: day 2026-05-01
        hb.insert("up.daily", ", ".join(f"(DATE'2026-05-{d:02d}', {d})" for d in range(2, 20)))
        settle(hb)
        assert [windows(p) for p in recorded(out, "D")] == [
            [("day > 2026-05-01", "day <= 2026-05-08")], [("day > 2026-05-08", "day <= 2026-05-15")],
            [("day > 2026-05-15", "day <= 2026-05-19")]]


def test_an_sap_chain_backlog_runs_green_run_by_green_run(tmp_path, postgres, chain_log, monkeypatch):
    """Three green runs (and a red one) while the job was paused: three runs, one chain run each."""
    out, chain = tmp_path / "out", f"ZCHAIN_{uuid.uuid4().hex[:8].upper()}"
    chain_run(postgres, chain, "20260101", "230000")
    sources = tmp_path / "sources.yml"
    sources.write_text("sap:\n  default: {url: {env: TEST_SAP_URL}, schema: SAPABAP1}\n")
    monkeypatch.setenv("TEST_SAP_URL", postgres.url())
    policy = policy_file(tmp_path, 'jobs: {"S": {catch_up: {max_window: 1}}}')
    with Harness(tmp_path, HEARTBEAT_RUN_POLICY=str(policy), HEARTBEAT_SOURCES_FILE=str(sources)) as hb:
        hb.seed(row("sap_b4", chain, "S"))
        recorder_jobs(hb.jobs_path, out, "S")
        hb.tick()  # baseline: the 23:00 run
        record_job_event(hb.app, "S", EventType.JOB_PAUSED)
        for day, clock, status in [("20260102", "010000", "G"), ("20260102", "020000", "G"),
                                   ("20260102", "030000", "R"), ("20260103", "010000", "G")]:
            chain_run(postgres, chain, day, clock, status)
        hb.tick()
        record_job_event(hb.app, "S", EventType.JOB_RESUMED)
        settle(hb)
        assert [windows(p) for p in recorded(out, "S")] == [
            [("LOAD_DATE > 20260101230000", "LOAD_DATE <= 20260102010000")],
            [("LOAD_DATE > 20260102010000", "LOAD_DATE <= 20260102020000")],
            [("LOAD_DATE > 20260102020000", "LOAD_DATE <= 20260103010000")]]


def test_a_policy_the_source_cannot_apply_leaves_the_job_waiting_with_the_reason(tmp_path):
    with events_lakehouse(tmp_path, 'jobs: {"J": {catch_up: {max_window: 7d}}}') as hb:
        hb.insert("up.events", "(1)")
        result = hb.tick()
        assert result.triggered_job_ids == [] and recorded(tmp_path / "out", "J") == []
        assert "time span" in str(result.trigger_errors[0]) and result.exit_code == 2
        assert hb.job_status("J") == {"NEW_EVENT_AVAILABLE"}  # nothing consumed: fix the policy and it runs


# -- crashes inside a sequence (real runner processes) -------------------------------------------

@dataclass(frozen=True)
class CrashOutcome:
    """What a runner killed at ``point`` and then ticked to the end left behind."""

    crash_exit: int
    windows: list[list[tuple[str, str]]]
    tokens: list[str]


def crash_scenario(root: Path, point: str) -> CrashOutcome:
    """Three single-version windows; the runner is killed at ``point`` when run 1 has succeeded."""
    out = root / "out"
    root.mkdir(parents=True)
    config, jobs = root / "config.csv", root / "jobs.yml"
    config.write_text("\n".join([HEADER, row("delta_table", "up.orders", "101")]) + "\n")
    recorder_jobs(jobs, out, "101")
    policy = policy_file(root, 'jobs: {"101": {catch_up: {max_window: 1}}}')
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=jobs, env={"HEARTBEAT_RUN_POLICY": str(policy)})
    lake.home.mkdir(parents=True)
    lake.append_ids("up.orders", 1)
    lake.cli("seed")
    lake.cli("run")  # baseline
    for i in (2, 3, 4):
        lake.append_ids("up.orders", i)
    lake.cli("run")  # run 1 of 3
    lake.wait_local_runs()
    crashed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": point})  # run 1 done -> run 2 requested
    for _ in range(6):
        lake.cli("run")
        lake.wait_local_runs()
    tokens = [e["idempotency_token"] for e in lake.events() if e["event_type"] in
              ("TRIGGER_REQUESTED", "NEXT_WINDOW_REQUESTED")]
    return CrashOutcome(crashed.returncode, [windows(p) for p in recorded(out, "101")], tokens)


@pytest.mark.slow
def test_a_crash_inside_a_sequence_neither_skips_nor_repeats_a_window(tmp_path):
    """Killed after run 2 is recorded and before the jobs API call, or after the call and before its run id
    is recorded: each window still runs exactly once. (One scenario after the other, in this process but for the
    killed command: side by side, each thread's commands would be processes, ~2x the CPU on a busy CI machine.)"""
    points = ("after_next_window_requested", "after_trigger_call")
    outcomes = {point: crash_scenario(tmp_path / point, point) for point in points}
    for point, outcome in outcomes.items():
        assert outcome.crash_exit == CRASH_EXIT_CODE, point
        assert outcome.windows == [[("version 1", "version 1")], [("version 2", "version 2")],
                                   [("version 3", "version 3")]], point
        assert len(outcome.tokens) == len(set(outcome.tokens)) == 3, point
