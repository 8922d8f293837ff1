"""Idle ticks record nothing in the tables, yet what Heartbeat shows about sensing stays current.

- ``explain`` (CLI and ``--json``) and the job page show each source's latest sensing: after an idle
  streak, the streak's latest tick (carried by the runner's liveness file), not the last recorded tick.
- A source that senses again after failing clears its error at once: that tick is recorded even when
  nothing else happened (by the same process, and by a new process that learns of the failure from the
  tables).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone

from cli_runner import run_cli
from harness import Harness
from harness import config_row as row

from heartbeat_runner.core.records import Outcome
from heartbeat_runner.interfaces.operations import explain, with_idle_sensing, with_sensing_errors
from heartbeat_runner.interfaces.ui.data import job_page
from heartbeat_runner.runner.alerting import IdleSensing, idle_sensing


def _cli_explain(hb: Harness, job_id: str) -> dict:
    env = {**os.environ, "HEARTBEAT_HOME": str(hb.home), "HEARTBEAT_CONFIG": str(hb.config_path),
           "HEARTBEAT_JOBS_FILE": str(hb.jobs_path)}
    done = run_cli(["explain", "--job-id", job_id, "--json"], env=env, cwd=hb.root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_explain_and_the_job_page_show_the_latest_idle_sensing_not_the_last_recorded_tick(tmp_path):
    with Harness(tmp_path, HEARTBEAT_IDLE_FLUSH="3600") as hb:
        hb.create_table("shop.orders", "id bigint")
        hb.jobs(J1=0)
        hb.seed(row("delta_table", "shop.orders", "J1"))
        baseline = hb.tick()  # writes the source's cursor: recorded
        lakehouse = hb.settings.lakehouse_dir
        assert not baseline.is_idle and idle_sensing(lakehouse) is None
        for _ in range(3):
            last = hb.tick()
            assert last.is_idle
        idle = idle_sensing(lakehouse)
        assert idle is not None and idle.sensed_at == last.snapshot_ts

        (recorded,) = explain(hb.app.store, "J1").rows  # what the tables alone say
        assert recorded["last_evaluated_at"] == baseline.snapshot_ts
        (shown,) = explain(hb.app.store, "J1", idle).rows
        assert shown["last_evaluated_at"] == last.snapshot_ts and shown["last_outcome"] == Outcome.NO_NEW_DATA
        (on_page,) = job_page(hb.app.store, "J1", lakehouse_dir=lakehouse)["rows"]
        assert on_page["last_evaluated_at"] == last.snapshot_ts.isoformat()
        (by_cli,) = _cli_explain(hb, "J1")["rows"]
        assert by_cli["last_evaluated_at"] == last.snapshot_ts.isoformat()

        hb.insert("shop.orders", "(1)")
        busy = hb.tick()
        assert busy.triggered_job_ids == ["J1"] and idle_sensing(lakehouse) is None
        (after,) = explain(hb.app.store, "J1", idle_sensing(lakehouse)).rows
        assert after["last_evaluated_at"] == busy.snapshot_ts and after["last_outcome"] == Outcome.NEW_DATA


def test_a_source_that_senses_again_clears_its_error_at_once_though_nothing_else_happened(tmp_path):
    with Harness(tmp_path, HEARTBEAT_IDLE_FLUSH="3600") as hb:
        hb.create_table("shop.orders", "id bigint")
        hb.jobs(J1=0)
        hb.seed(row("delta_table", "shop.orders", "J1"))
        hb.tick()  # baseline
        table = hb.app.engine.local_location("shop.orders")
        assert table is not None
        moved = table.with_name("orders.away")

        def failing_sources() -> list[str]:
            rows = with_sensing_errors(hb.app.store, hb.app.store.control_rows("J1"))
            return [r["source_key"] for r in rows if r["sensing_error"]]

        for new_process in (False, True):
            shutil.move(table, moved)
            assert hb.tick().sensor_errors
            assert failing_sources() == ["delta_table:shop.orders"]
            if new_process:  # a runner that starts learns of the failure from the tables
                hb._heartbeat = None
            shutil.move(moved, table)
            back = hb.tick()
            assert back.recovered == ["delta_table:shop.orders"] and not back.is_idle
            assert failing_sources() == []
            assert hb.tick().is_idle  # and only that tick is recorded


def test_a_newer_idle_sensing_clears_a_recorded_warning_from_the_row_and_the_verdict():
    """A sensing warning recorded at one tick, then an idle tick that sensed the source clean: `explain` and the
    page show the idle tick's evaluation, and neither the row's state nor the job's verdict keeps the warning.
    An error stays (a recovery is never idle: its tick is recorded)."""
    recorded, later = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc), datetime(2026, 1, 1, 12, 5, tzinfo=timezone.utc)
    warning = "follow key 'x' matches no row"
    verdict = f"waiting for new data on hard dependencies delta_table:a (warning: {warning}), delta_table:b"
    rows = [
        {"source_key": "delta_table:a", "sensor_source": "delta_table", "sensor_id": "a", "verdict": verdict,
         "last_evaluated_at": recorded, "last_outcome": Outcome.NO_NEW_DATA.value, "last_outcome_detail": warning,
         "sensing_warning": warning, "row_state": f"no new data yet (warning: {warning})"},
        {"source_key": "delta_table:b", "sensor_source": "delta_table", "sensor_id": "b", "verdict": verdict,
         "last_evaluated_at": recorded, "last_outcome": Outcome.ERROR.value, "last_outcome_detail": "boom",
         "sensing_error": "boom", "row_state": "sensing failed: boom"},
    ]
    idle = IdleSensing(later, frozenset({"delta_table:a", "delta_table:b"}))
    fresh, failing = with_idle_sensing(rows, idle)
    assert fresh["last_evaluated_at"] == later and fresh["last_outcome"] == Outcome.NO_NEW_DATA.value
    assert fresh["row_state"] == "no new data yet" and fresh["sensing_warning"] is None
    assert fresh["verdict"] == failing["verdict"] == "waiting for new data on hard dependencies delta_table:a, delta_table:b"
    assert failing["last_evaluated_at"] == recorded and failing["row_state"] == "sensing failed: boom"
