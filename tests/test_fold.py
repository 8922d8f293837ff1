"""A tick that triggers folds its trigger requests into the control table instead of deriving every row
again (models/heartbeat_control.sql, lakehouse/control_table.py Appended). What `status`, the page and the next tick
read must be exactly what a build from all the events gives: each folded table is compared with one."""

from __future__ import annotations

import pytest
from harness import config_row as row

from heartbeat_runner.core.records import JobStatus
from heartbeat_runner.interfaces.operations import ask_trigger

ON_SPARK = pytest.mark.engines("sail", "spark-classic")


def control_table(hb) -> list[dict]:
    """Every row of the control table, retired ones too; updated_at says when a build touched the row."""
    rows = hb.app.store.read("heartbeat_control", order_by=["trigger_job_id", "sensor_source", "sensor_id"])
    return [{k: v for k, v in r.items() if k != "updated_at"} for r in rows]


def assert_as_derived(hb) -> None:
    """The control table as it is equals the one a build from all the events makes."""
    folded = control_table(hb)
    hb.app.control.refresh(force=True)
    assert control_table(hb) == folded


@ON_SPARK
def test_a_tick_that_triggers_folds_its_requests_into_what_a_full_build_derives(hb):
    hb.jobs(J1=0, J2=1, J3=0)
    hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "b", "J1", hard="FALSE"),
            row("trigger_file", "c", "J2"),
            row("trigger_file", "d", "J3"), row("trigger_file", "e", "J3"))
    hb.tick()
    for folder in "abcd":
        hb.drop_trigger_file(folder, "1.done")

    first = hb.tick()  # J1 (hard and soft data) and J2 start; J3 waits for e
    assert sorted(first.triggered_job_ids) == ["J1", "J2"]
    assert first.control_folded
    assert hb.job_status("J1") == hb.job_status("J2") == {JobStatus.IN_PROGRESS.value}
    assert hb.job_status("J3") == {JobStatus.NEW_EVENT_AVAILABLE.value, None}
    assert_as_derived(hb)

    hb.wait_for_jobs()  # a run's end is no request: those ticks derive the table
    assert hb.job_status("J1") == {JobStatus.COMPLETED.value} and hb.job_status("J2") == {JobStatus.FAILED.value}

    ask_trigger(hb.app, "J1", by="test")  # a manual run over nothing new, asked by another process's commit
    hb.drop_trigger_file("e", "1.done")
    second = hb.tick()
    assert sorted(second.triggered_job_ids) == ["J1", "J3"]
    assert second.control_folded
    assert_as_derived(hb)


@ON_SPARK
def test_a_tick_whose_request_is_refused_derives_the_table(hb):
    """A job the jobs API does not know: its request is void (TRIGGER_ERROR), so the job is back where it
    was; the fold does not apply and the build derives it."""
    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "x", "UNKNOWN"))
    hb.tick()
    hb.drop_trigger_file("a", "1.done")
    hb.drop_trigger_file("x", "1.done")
    result = hb.tick()
    assert result.triggered_job_ids == ["J1"] and [p.job_id for p in result.trigger_errors] == ["UNKNOWN"]
    assert not result.control_folded
    assert hb.job_status("UNKNOWN") == {JobStatus.NEW_EVENT_AVAILABLE.value}
    assert_as_derived(hb)
