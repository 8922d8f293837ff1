"""Lakehouses made by an older Heartbeat: the control table gains the columns its model added since.

The older table is made here from a current one: the same Delta table, rewritten without those
columns (as the ``deltalake`` package can on every engine whose files are on this machine).
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable, write_deltalake
from harness import config_row as row

from heartbeat_runner.lakehouse.migrations import ADDED_COLUMNS, add_missing_columns

CONTROL = "heartbeat.heartbeat_control"
ADDED = [c.name for c in ADDED_COLUMNS["heartbeat_control"]]


def as_an_older_heartbeat_left_it(hb) -> None:
    """Rewrite the control table without the added columns; then open it as a process starting on this
    lakehouse does (the embedded engine starts again: it registers its tables and restores the views)."""
    folder = str(hb.app.engine.delta_log_dir(CONTROL))
    older = DeltaTable(folder).to_pyarrow_table().drop_columns(ADDED)
    write_deltalake(folder, older, mode="overwrite", schema_mode="overwrite")
    assert not set(ADDED) & {field.name for field in DeltaTable(folder).schema().fields}
    hb.app.dbt._migrated = False
    if hb.app.engine.can_recycle:
        hb.app.recycle_engine()


@pytest.mark.engines("sail", "spark-classic")
def test_an_older_control_table_gains_the_new_columns_keeps_its_rows_and_triggers_as_before(hb):
    hb.create_table("up.t", "id int")
    hb.seed(row("delta_table", "up.t", "J1"))
    hb.jobs(J1=0)
    hb.tick()
    hb.insert("up.t", "(1)")
    assert hb.tick().triggered_job_ids == ["J1"]
    hb.wait_for_jobs()
    hb.tick()
    before = {(r["trigger_job_id"], r["status"], r["row_created_timestamp"]) for r in hb.rows()}
    as_an_older_heartbeat_left_it(hb)

    hb.insert("up.t", "(2)")
    assert hb.tick().triggered_job_ids == ["J1"]  # the dependency rule reads the added columns
    assert set(ADDED) <= set(hb.spark.table(CONTROL).columns)
    hb.wait_for_jobs()
    hb.tick()
    after = {(r["trigger_job_id"], r["status"], r["row_created_timestamp"]) for r in hb.rows()}
    assert after == before == {("J1", "COMPLETED", next(iter(before))[2])}
    assert {r["last_lifecycle_event"] for r in hb.rows()} == {"COMPLETED"}
    assert hb.runs_of("J1") == 2


@pytest.mark.engines("sail", "spark-classic")
def test_a_process_that_lost_the_race_to_add_the_columns_goes_on_and_a_real_failure_still_raises(hb, monkeypatch):
    """Two processes start on an older lakehouse at once: both read the control table without the
    columns, one adds them, the other's ALTER then fails on the engine. That one goes on (the columns
    are there); a failure that leaves them missing is raised. (Spark's ALTER refuses a column that
    exists; the deltalake package, the embedded engine's way, was seen to accept it.)"""
    hb.seed(row("trigger_file", "drops", "J1"))
    hb.tick()
    as_an_older_heartbeat_left_it(hb)
    hb.app.dbt.migrate_once()  # the other process adds the columns (the embedded engine's restart did)
    engine = hb.app.engine
    assert set(ADDED) <= set(engine.columns(CONTROL))
    seen_before = [c for c in engine.columns(CONTROL) if c not in ADDED]

    read = iter([seen_before])  # this process read the table before the other one's commit
    monkeypatch.setattr(engine, "columns", lambda name: next(read, None) or type(engine).columns(engine, name))
    add_missing_columns(engine, "heartbeat")  # its ALTER fails for real: the columns exist
    monkeypatch.undo()
    assert engine.columns(CONTROL).count(ADDED[0]) == 1

    monkeypatch.setattr(engine, "columns", lambda name: seen_before)  # still missing after the failure
    monkeypatch.setattr(type(engine.ops), "add_columns", lambda *args: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        add_missing_columns(engine, "heartbeat")
