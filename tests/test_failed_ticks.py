"""Every tick is recorded, a failed one too (issue 41): a tick that raises before its first append leaves a
FAILED row in heartbeat_runs with its error's kind and redacted message, seen by `runs` and the status page;
a loop goes on past it, a one-shot `run` exits non-zero; when even the row cannot be written the loop
logs that and goes on."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, marker_jobs_file, serving_page, ticks, wait_for
from harness import config_row as row

from heartbeat_runner.core.errors import TransientError
from heartbeat_runner.core.records import RunStart, TickStatus, utcnow
from heartbeat_runner.interfaces import cli
from heartbeat_runner.runner.loop import LoopHooks, RunConfig, failed_tick_summary, record_failed_tick, run_loop
from heartbeat_runner.runner.tick_result import TickResult

INJECTED = "tick failed (unexpected): InjectedFault: injected failure at after_sensing"


def seeded_lakehouse(root: Path) -> CliLakehouse:
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "J1"))
    lake.cli("seed")
    lake.cli("run")  # baseline: a new sensor starts at its source's current end
    return lake


@pytest.fixture
def lake(tmp_path: Path, template) -> CliLakehouse:
    """J1 reads the trigger folder ``drop``; seeded, at its baseline (a copy of the module's template)."""
    return template.copy(tmp_path)


def runs(lake: CliLakehouse) -> list[dict]:
    """`runs --json`, oldest first."""
    return list(reversed(json.loads(lake.cli("runs", "--json").stdout)))




# -- the real CLI ------------------------------------------------------------------------------------

def test_a_one_shot_run_whose_tick_fails_exits_non_zero_and_records_it(lake):
    before = len(runs(lake))
    lake.drop_trigger_file("drop", "a.done")
    failed = lake.cli("run", check=False, env={"HEARTBEAT_FAIL_AT": "after_sensing"})
    assert failed.returncode == 1, failed.stderr
    assert "InjectedFault: injected failure at after_sensing" in failed.stderr
    assert "nothing was changed" in failed.stderr and "Traceback" not in failed.stderr
    [row_] = runs(lake)[before:]
    assert (row_["status"], row_["message"]) == ("FAILED", INJECTED)
    assert row_["jobs_triggered"] == 0 and lake.executions() == {}

    lake.cli("run")  # the next tick carries on: what the failed one sensed was never recorded
    lake.wait_local_runs()
    assert [r["status"] for r in runs(lake)[before:]] == ["FAILED", "OK"] and lake.executions() == {"J1": 1}


def test_a_one_shot_tick_that_fails_after_starting_a_job_says_what_it_did_in_its_row_and_exit_code(lake):
    """The tick senses new data and starts J1, then fails (before reconciliation): its FAILED row counts the
    source it sensed, the new data and the job it triggered; ``run`` prints one line naming the run it started,
    no traceback, and exits 4 ("failed after changing something", README). Before: ``sensed 0, triggered 0``,
    a traceback and exit 1 ("nothing changed"). The next tick goes on: J1 ran once."""
    before = len(runs(lake))
    lake.drop_trigger_file("drop", "a.done")
    failed = lake.cli("run", check=False, env={"HEARTBEAT_FAIL_AT": "after_triggering"})
    assert failed.returncode == 4, failed.stderr
    assert "Traceback" not in failed.stderr
    assert "InjectedFault: injected failure at after_triggering" in failed.stderr
    assert "triggered job J1 (run " in failed.stderr and "the next tick goes on from there" in failed.stderr
    [row_] = runs(lake)[before:]
    assert row_["status"] == "FAILED"
    assert (row_["sources_sensed"], row_["sources_with_new_data"], row_["jobs_triggered"]) == (1, 1, 1)
    lake.wait_local_runs()
    lake.cli("run")
    assert lake.executions() == {"J1": 1}


@pytest.mark.slow
def test_a_loop_records_its_failed_tick_goes_on_and_the_page_shows_it(lake):
    before = len(runs(lake))
    loop = lake.loop_through_failures(1)
    out, err = loop.stdout, loop.stderr
    assert loop.returncode == 0 and "stopped after" in out, err
    assert f"tick failed: {INJECTED.split(': ', 1)[1]}" in err

    shown = runs(lake)[before:]
    assert shown[0]["status"] == "FAILED" and shown[0]["message"] == INJECTED
    assert [r["status"] for r in shown[1:]] and {r["status"] for r in shown[1:]} == {"OK"}
    assert sum(r["jobs_triggered"] for r in shown[1:]) == 1  # a later tick went through and triggered J1
    assert "FAILED" in lake.cli("runs").stdout

    with serving_page(lake) as base:
        ticks = json.loads(urllib.request.urlopen(base + "/api/ticks", timeout=30).read())["runs"]
    assert [(t["status"], t["message"]) for t in ticks if t["status"] == "FAILED"] == [("FAILED", INJECTED)]


# -- the loop without an engine ----------------------------------------------------------------------

class UnreachableStore:
    """A store whose every append fails, as one whose engine went away."""

    def append_run(self, summary, evaluations) -> None:
        raise ConnectionError("the engine is gone")


def test_a_failed_tick_the_store_cannot_record_is_logged_and_the_loop_goes_on(restore_signals, capsys, caplog):
    tick = ticks(RuntimeError("engine died"), TickResult(run_id="r2", snapshot_ts=utcnow(), completed=["J1"]))

    def record(start: RunStart, exc: Exception, took_s: float) -> bool:
        return record_failed_tick(UnreachableStore(), start, exc, took_s)  # type: ignore[arg-type]

    args = argparse.Namespace(interval=0.01, json=False)
    with caplog.at_level(logging.WARNING, logger="heartbeat_runner.runner.loop"):
        code = run_loop(tick, RunConfig(interval_s=0.01, lease_wait_s=0.0), cli._LoopStatus(args),
                        LoopHooks(record_failure=record))
    out, err = capsys.readouterr()
    assert code == 0 and "stopped after 2 tick(s)" in out
    assert "tick 1 · FAILED (1 in a row)" in err and "tick 2 · OK" in err
    assert any("could not record failed tick" in r.message and "the engine is gone" in r.message
               for r in caplog.records)


def test_a_failed_ticks_row_carries_its_kind_and_a_redacted_message():
    start = RunStart.now()
    error = TransientError("no answer from https://ops:hunter2@example.com/hook/T0KEN?sig=abc\nsecond line")
    summary = failed_tick_summary(start, error, 1.5)
    assert (summary.run_id, summary.status, summary.duration_s) == (start.run_id, TickStatus.FAILED, 1.5)
    assert summary.message == "tick failed (transient): TransientError: no answer from https://example.com/***"
    assert json.loads(summary.stage_timings) == {"error_kind": "transient", "events_written": 0}


