"""Heartbeat ticks on a real temporary lakehouse with the Databricks backend against the stand-in Jobs API."""

from __future__ import annotations

import json

import pytest
from databricks_jobs_server import UNAVAILABLE_AFTER_RUN, JobsApiServer
from harness import config_row as row

from heartbeat_runner.jobs.databricks import DatabricksJobsBackend
from heartbeat_runner.runner.tick import TriggeredJob


@pytest.fixture
def api():
    with JobsApiServer() as server:
        yield server


@pytest.fixture
def beat(hb, api):
    """The harness's lakehouse, ticking with the Databricks backend."""
    hb.create_table("sales.orders", "id int, amount double")
    hb.insert("sales.orders", "(1, 10.0)")
    return hb


def heartbeat_for(hb, api):
    return hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(http_timeout_s=0.5, retry_timeout_s=2)))


def new_data_then_tick(hb, heartbeat, value: int):
    hb.insert("sales.orders", f"({value}, 1.0)")
    return heartbeat.tick()


def test_failed_run_blocks_the_job_until_a_manual_success(beat, api):
    job = api.add_job()
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()
    new_data_then_tick(beat, heartbeat, 2)
    (run,) = api.runs_of(job)
    api.finish_run(run.run_id, "FAILED", "Task etl failed with message: boom")

    assert heartbeat.tick().failed == [str(job)]
    (control,) = beat.rows(str(job))
    assert control["status"] == "FAILED"

    assert new_data_then_tick(beat, heartbeat, 3).triggered == []  # blocked: no new run
    assert len(api.runs_of(job)) == 1

    api.create_manual_run(job, "SUCCESS")  # someone fixed it and re-ran the job by hand
    assert heartbeat.tick().completed == [str(job)]
    assert beat.job_status(str(job)) != {"FAILED"}

    # The data that arrived while the job was blocked is sensed now and triggers it.
    assert heartbeat.tick().triggered_job_ids == [str(job)] and len(api.runs_of(job)) == 3


def test_trigger_reconcile_completed_and_an_unknown_job_fails_alone(beat, api):
    good = api.add_job("orders_etl")
    missing = 777000111  # not (yet) a job in the workspace
    beat.seed(row("delta_table", "sales.orders", str(good)), row("delta_table", "sales.orders", str(missing)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()  # baseline

    result = new_data_then_tick(beat, heartbeat, 2)
    (run,) = api.runs_of(good)
    assert result.triggered == [TriggeredJob(str(good), str(run.run_id))]
    assert run.parameters["heartbeat_run_id"] == result.run_id
    (window,) = json.loads(run.parameters["heartbeat_windows"])
    assert window["sensor_source"] == "delta_table" and window["sensor_id"] == "sales.orders"
    assert beat.job_status(str(good)) == {"IN_PROGRESS"}
    assert [p.job_id for p in result.trigger_errors] == [str(missing)] and result.exit_code == 2
    assert "does not exist" in result.trigger_errors[0].message
    (control,) = beat.rows(str(missing))
    assert control["status"] == "NEW_EVENT_AVAILABLE" and "does not exist" in (control["last_error"] or "")

    api.start_run(run.run_id)
    api.add_job("deployed later", job_id=missing)
    retried = heartbeat.tick()  # the good run is still running; the missing job now exists
    assert retried.completed == [] and beat.job_status(str(good)) == {"IN_PROGRESS"}
    assert retried.triggered_job_ids == [str(missing)] and beat.job_status(str(missing)) == {"IN_PROGRESS"}

    api.finish_run(run.run_id, "SUCCESS")
    api.finish_run(api.runs_of(missing)[0].run_id, "SUCCESS")
    assert sorted(heartbeat.tick().completed) == sorted([str(good), str(missing)])
    (control,) = beat.rows(str(good))
    assert control["status"] == "COMPLETED" and control["job_run_id"] == str(run.run_id)
    assert len(api.runs_of(good)) == 1 and len(api.runs_of(missing)) == 1


def test_unknown_outcome_is_retried_next_tick_into_the_same_run(beat, api):
    job = api.add_job()
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()
    api.inject("run-now", UNAVAILABLE_AFTER_RUN, times=1000)  # the run starts, every answer is lost

    result = new_data_then_tick(beat, heartbeat, 2)
    assert result.triggered == [] and [p.job_id for p in result.trigger_errors] == [str(job)]
    assert beat.job_status(str(job)) == {"IN_PROGRESS"}  # requested, run id unknown yet

    api.clear_faults()
    resumed = heartbeat.tick()
    (run,) = api.runs_of(job)
    assert resumed.triggered == [TriggeredJob(str(job), str(run.run_id))]
    (control,) = beat.rows(str(job))
    assert control["job_run_id"] == str(run.run_id)
