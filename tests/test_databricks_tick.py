"""Heartbeat ticks on a real temporary lakehouse with the Databricks backend against the stand-in Jobs API."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from databricks_jobs_server import TOKEN, UNAVAILABLE_AFTER_RUN, JobsApiServer
from harness import HEADER, CliLakehouse
from harness import config_row as row

from heartbeat_runner.core.faults import CRASH_EXIT_CODE
from heartbeat_runner.core.records import as_utc
from heartbeat_runner.core.settings import JobsApiLimits
from heartbeat_runner.jobs.databricks import DatabricksJobsBackend
from heartbeat_runner.lakehouse.store import Cond
from heartbeat_runner.policies.alerts import AlertPolicies, HotState
from heartbeat_runner.runner.alerting import AlertMonitor, fold_control_rows
from heartbeat_runner.runner.tick_result import TriggeredJob

LIMITS = JobsApiLimits(concurrency=8, rate_per_s=10_000)


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
    # The tick that sees the success unblocks the job, and senses its sources at once (the tick that records a
    # run's end also senses that job's sources): the data that arrived while it was blocked triggers it.
    unblocked = heartbeat.tick()
    assert unblocked.completed == [str(job)] and unblocked.triggered_job_ids == [str(job)]
    assert len(api.runs_of(job)) == 3
    assert heartbeat.tick().triggered_job_ids == []  # once


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


# -- at scale: parallel calls, the tick's API budget, incremental recovery ------------------------


def trigger_file_jobs(hb, api, count: int) -> list[int]:
    """``count`` Databricks jobs, each fed by its own trigger-file folder; baseline tick done."""
    jobs = [api.add_job(f"job_{i}") for i in range(count)]
    hb.seed(*(row("trigger_file", f"drop_{i}", str(job)) for i, job in enumerate(jobs)))
    return jobs


def test_what_does_not_fit_the_api_budget_is_carried_to_the_next_ticks_in_order(hb, api):
    jobs = trigger_file_jobs(hb, api, 40)
    heartbeat = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(), limits=LIMITS))
    heartbeat.settings = heartbeat.settings.with_(jobs_api=replace(LIMITS, max_calls=15))
    heartbeat.tick()
    for i in range(40):
        hb.drop_trigger_file(f"drop_{i}", "batch.done")

    first = heartbeat.tick()
    ordered = sorted(map(str, jobs))  # requests are made in job order
    assert first.triggered_job_ids == ordered[:15] and first.carried == ordered[15:]
    assert api.calls("run-now") == 15
    summary = hb.app.store.read("heartbeat_runs", Cond("run_id", first.run_id))[0]
    assert "carried to the next tick" in summary["message"] and ordered[15] in summary["message"]

    second = heartbeat.tick()  # the carried requests go first, in order, with their recorded tokens
    assert second.triggered_job_ids == ordered[15:30] and second.carried == ordered[30:]
    third = heartbeat.tick()
    assert third.triggered_job_ids == ordered[30:] and third.carried == []

    assert all(len(api.runs_of(job)) == 1 for job in jobs) and api.calls("run-now") == 40
    tokens = {e["idempotency_token"] for e in hb.events("TRIGGER_REQUESTED")}
    assert len(tokens) == 40 and all(run.token in tokens for run in api.runs.values())
    assert hb.job_status(ordered[0]) == {"IN_PROGRESS"} and hb.job_status(ordered[-1]) == {"IN_PROGRESS"}


def test_a_failed_job_is_unblocked_by_a_manual_run_without_reading_its_history_each_tick(beat, api):
    job = api.add_job()
    long_ago = int(time.time() * 1000) - 3_600_000
    for i in range(100):  # earlier runs of the job, within the 7 days a first look reads
        api.create_manual_run(job, "SUCCESS", start_ms=long_ago + i, end_ms=long_ago + i + 1)
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()
    new_data_then_tick(beat, heartbeat, 2)
    (run,) = [r for r in api.runs_of(job) if r.token]
    api.finish_run(run.run_id, "FAILED", "Task etl failed")
    assert heartbeat.tick().failed == [str(job)]

    heartbeat.tick()  # the first look at the failed job reads its history once
    history_reads = per_job_listings(api)
    assert history_reads >= 1
    api.reset_counts()
    for _ in range(3):
        assert heartbeat.tick().completed == []
    assert per_job_listings(api) == history_reads  # never again
    assert api.calls("runs/list") == 3 * 2  # active + completed listing a tick
    assert api.calls("runs/get") == 3  # and its failed run, in case it was repaired (REPAIR_CHECKS a tick)

    api.create_manual_run(job, "SUCCESS")
    api.reset_counts()
    assert heartbeat.tick().completed == [str(job)]
    assert api.calls("runs/list") == 2 and per_job_listings(api) == history_reads
    assert beat.job_status(str(job)) != {"FAILED"}


def per_job_listings(api: JobsApiServer) -> int:
    return sum(1 for _, path, query in api.requests if path.endswith("/runs/list") and "job_id" in query)


@pytest.mark.slow
def test_300_jobs_triggered_in_one_tick_once_each_under_429s_and_a_kill_midway(tmp_path, api):
    """``run`` dies after half of the parallel run-now calls answered (every 3rd call throttled); the next
    run resumes the other requests with their recorded tokens: one run per job, none lost."""
    jobs = [api.add_job(f"job_{i}") for i in range(300)]
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, *(row("trigger_file", f"drop_{i}", str(job)) for i, job in enumerate(jobs))])
                      + "\n")
    env = {"DATABRICKS_HOST": api.host, "DATABRICKS_TOKEN": TOKEN, "HEARTBEAT_JOBS_BACKEND": "databricks"}
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=tmp_path / "jobs.yml", env=env)
    lake.home.mkdir()
    lake.cli("seed")
    lake.cli("run")
    for i in range(300):
        lake.drop_trigger_file(f"drop_{i}", "batch.done")
    api.throttle_every("run-now", 3, retry_after=0)

    killed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": "during_trigger_calls"})
    assert killed.returncode == CRASH_EXIT_CODE, killed.stderr
    started = len(api.runs)
    assert 150 <= started < 300  # killed in the middle: half answered, the rest not yet called or in flight
    assert api.calls("run-now") > started  # throttled calls were retried

    lake.cli("run")
    assert all(len(api.runs_of(job)) == 1 for job in jobs) and len(api.runs) == 300
    requests = lake.events("TRIGGER_REQUESTED")
    assert len(requests) == 300 and {r.token for r in api.runs.values()} == {e["idempotency_token"] for e in requests}
    triggered = lake.events("TRIGGERED")
    assert sorted(int(e["job_run_id"]) for e in triggered) == sorted(api.runs)
    assert {r[3] for r in lake.control()} == {"IN_PROGRESS"}


def test_a_skipped_run_never_loses_its_data_the_job_is_asked_again_with_a_new_token(beat, api):
    """A run-now answered with a run the workspace skipped (max concurrent runs reached, queueing off) was
    recorded FAILED and the data it was to consume never asked for again."""
    job = api.add_job(max_concurrent_runs=1, queue=False)
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()
    manual = api.create_manual_run(job, "SUCCESS")
    api.runs[manual].lifecycle, api.runs[manual].fate = "RUNNING", None  # someone's run holds the only slot
    assert new_data_then_tick(beat, heartbeat, 2).triggered_job_ids == [str(job)]
    (skipped,) = [r for r in api.runs_of(job) if r.token]
    assert skipped.lifecycle == "SKIPPED"

    result = heartbeat.tick()
    assert result.failed == [] and [p.job_id for p in result.runs_skipped] == [str(job)]
    assert "MAX_CONCURRENT_RUNS_EXCEEDED" in result.runs_skipped[0].message
    (event,) = beat.events("RUN_SKIPPED")
    assert event["idempotency_token"] == skipped.token and event["job_run_id"] == str(skipped.run_id)
    assert beat.job_status(str(job)) == {"NEW_EVENT_AVAILABLE"}  # the windows are pending again

    api.finish_run(manual, "SUCCESS")  # the slot is free
    again = heartbeat.tick()
    assert again.triggered_job_ids == [str(job)]
    (_, asked) = [r for r in api.runs_of(job) if r.token]
    assert asked.token != skipped.token and asked.lifecycle == "QUEUED"
    assert json.loads(asked.parameters["heartbeat_windows"]) == json.loads(skipped.parameters["heartbeat_windows"])
    assert beat.job_status(str(job)) == {"IN_PROGRESS"}

    api.finish_run(asked.run_id, "SUCCESS")
    assert heartbeat.tick().completed == [str(job)]
    assert len([r for r in api.runs_of(job) if r.token]) == 2


def test_a_process_per_tick_carries_the_look_for_failed_jobs_in_the_run_summary(hb, api):
    """The failed-job watermark lived in process memory: with a process per tick every tick re-read each failed
    job's history (one runs/list per job). It is carried in the run summary and read back once per process."""
    jobs = trigger_file_jobs(hb, api, 3)
    first = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(), limits=LIMITS))
    first.tick()
    for i in range(3):
        hb.drop_trigger_file(f"drop_{i}", "batch.done")
    assert len(first.tick().triggered) == 3
    for job in jobs:
        (run,) = api.runs_of(job)
        api.finish_run(run.run_id, "FAILED")
    assert sorted(first.tick().failed) == sorted(map(str, jobs))
    first.tick()  # the first look at the failed jobs reads their history once
    assert per_job_listings(api) == 3
    first.close()  # the process ends

    api.reset_counts()
    second = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(), limits=LIMITS))  # the next process
    assert second.tick().completed == []
    assert per_job_listings(api) == 3 and api.calls("runs/list") == 2  # the same two listings, no history
    manual = api.create_manual_run(jobs[1], "SUCCESS")
    second.close()

    api.reset_counts()
    third = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(), limits=LIMITS))
    assert third.tick().completed == [str(jobs[1])] and api.calls("runs/list") == 2
    assert per_job_listings(api) == 3
    (done,) = [e for e in hb.events("COMPLETED") if e["trigger_job_id"] == str(jobs[1])]
    assert done["job_run_id"] == str(manual)


@pytest.mark.parametrize("fate", ["SUCCESS", "FAILED"])
def test_job_end_timestamp_is_the_end_time_the_jobs_api_gives_not_the_tick_that_noticed(beat, api, fate):
    """The spec: job_start_timestamp when the job was triggered, job_end_timestamp its completion time. The
    run ends 1.234 s after it started, by the Jobs API's clock; the tick that notices comes later."""
    job = api.add_job()
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()
    requested = new_data_then_tick(beat, heartbeat, 2)
    (run,) = api.runs_of(job)
    api.finish_run(run.run_id, fate, end_ms=run.start_ms + 1234)
    time.sleep(max(0.0, (run.start_ms + 1234) / 1000 - time.time()) + 0.5)  # noticed well after the end
    noticed = heartbeat.tick()
    assert (noticed.completed if fate == "SUCCESS" else noticed.failed) == [str(job)]
    (control,) = beat.rows(str(job))
    ended = datetime.fromtimestamp((run.start_ms + 1234) / 1000, timezone.utc)
    assert as_utc(control["job_end_timestamp"]) == ended < noticed.snapshot_ts
    assert requested.snapshot_ts < as_utc(control["job_start_timestamp"]) < ended
    # the alert monitor of a loop (folding the tick) holds the time a new process loads from the table
    looping = AlertMonitor(beat.app.store, beat.app.control, heartbeat.backend, AlertPolicies(), beat.root)
    looping.fold(noticed)
    loaded = fold_control_rows(HotState(), beat.rows(str(job)), times=True).job(str(job))
    folded = looping.state.job(str(job))
    if fate == "SUCCESS":
        assert as_utc(folded.last_completed) == as_utc(loaded.last_completed) == ended
    else:
        assert as_utc(folded.failed_at) == as_utc(loaded.failed_at) == ended


# -- runs the workspace never executed, and successes with failures (one rule per termination code) -------


def not_executed(code: str, fate: str) -> float:
    from heartbeat_runner.core.metrics import metrics

    return metrics().registry.get_sample_value("heartbeat_job_runs_not_executed_total",
                                               {"code": code, "fate": fate}) or 0.0


def test_a_run_stopped_by_a_workspace_limit_is_asked_again_after_a_back_off_shown_in_explain(beat, api,
                                                                                             monkeypatch):
    """WORKSPACE_RUN_LIMIT_EXCEEDED was recorded FAILED and blocked the job; now its data is pending again and
    asked for only after a back-off, which a tick reports, ``explain`` shows and the metrics count."""
    from heartbeat_runner.core.backoff import Backoff
    from heartbeat_runner.interfaces.operations import explain
    from heartbeat_runner.runner import triggering
    from heartbeat_runner.runner.observability import count_tick

    job = api.add_job()
    api.jobs[job].refuse = "WORKSPACE_RUN_LIMIT_EXCEEDED"
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.tick()
    assert new_data_then_tick(beat, heartbeat, 2).triggered_job_ids == [str(job)]
    (limited,) = api.runs_of(job)

    before = not_executed("WORKSPACE_RUN_LIMIT_EXCEEDED", "limited"), \
        not_executed("WORKSPACE_RUN_LIMIT_EXCEEDED", "deferred")
    skipped = heartbeat.tick()
    count_tick(skipped, "databricks")
    assert skipped.failed == [] and [p.job_id for p in skipped.runs_skipped] == [str(job)]
    assert "back-off" in skipped.runs_skipped[0].message
    (event,) = beat.events("RUN_SKIPPED")
    assert json.loads(event["payload"])["backoff"] is True
    assert beat.job_status(str(job)) == {"NEW_EVENT_AVAILABLE"}

    held = heartbeat.tick()  # within the back-off: not asked again
    count_tick(held, "databricks")
    assert held.triggered == [] and len(api.runs_of(job)) == 1
    assert [p.job_id for p in held.runs_deferred] == [str(job)] and "WORKSPACE_RUN_LIMIT_EXCEEDED" in \
        held.runs_deferred[0].message
    assert not_executed("WORKSPACE_RUN_LIMIT_EXCEEDED", "limited") == before[0] + 1
    assert not_executed("WORKSPACE_RUN_LIMIT_EXCEEDED", "deferred") >= before[1] + 1
    verdict = explain(beat.app.store, str(job)).verdict
    assert "workspace limit (WORKSPACE_RUN_LIMIT_EXCEEDED)" in verdict and "back-off" in verdict

    api.jobs[job].refuse = None
    monkeypatch.setattr(triggering, "LIMIT_BACKOFF", Backoff(first_s=0.2, max_s=0.2))
    time.sleep(0.3)
    again = heartbeat.tick()
    assert again.triggered_job_ids == [str(job)] and again.runs_deferred == []
    (_, asked) = api.runs_of(job)
    assert asked.token != limited.token
    assert json.loads(asked.parameters["heartbeat_windows"]) == json.loads(limited.parameters["heartbeat_windows"])


@pytest.mark.parametrize("code", ["DISABLED", "BUDGET_POLICY_LIMIT_EXCEEDED"])
def test_a_refused_run_is_a_terminal_non_run_with_an_alert_never_asked_again(beat, api, code):
    """DISABLED / BUDGET_POLICY_LIMIT_EXCEEDED: the job is REFUSED (its own status and event, with words that say
    it never ran, and the JOB_REFUSED alert); its data is not asked for again tick after tick, not even by a retry
    policy; an operator's retry asks once, with a token of its own each time (a second refusal, then a retry
    that runs)."""
    from heartbeat_runner.interfaces.operations import ask_retry, explain
    from heartbeat_runner.interfaces.status_view import on_call
    from heartbeat_runner.interfaces.ui.data import JobPhase, overview
    from heartbeat_runner.policies.alerts import _job_alerts
    from heartbeat_runner.policies.retry import RetryPolicies, RetryPolicy
    from heartbeat_runner.runner.alerting import Liveness

    job = api.add_job()
    api.jobs[job].refuse = code
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    heartbeat.policies = RetryPolicies(jobs={str(job): RetryPolicy(max_retries=5, backoff_s=0)})  # retries at once
    heartbeat.tick()
    new_data_then_tick(beat, heartbeat, 2)
    refused = heartbeat.tick()
    assert refused.failed == [str(job)] and refused.refused == [str(job)] and refused.runs_skipped == []
    assert refused.not_executed[(code, "refused")] == 1
    (control,) = beat.rows(str(job))
    assert control["status"] == "REFUSED" and control["last_error"].startswith("refused by the jobs service")
    assert "fold" in {refresh["path"] for refresh in refused.refresh_paths()}, refused.refresh_paths()
    beat.app.control.refresh(force=True)  # the refusal as folded is what a build from all the events derives
    assert [{k: v for k, v in r.items() if k != "updated_at"} for r in beat.rows(str(job))] == [
        {k: v for k, v in control.items() if k != "updated_at"}]
    assert code in control["last_error"]
    (event,) = beat.events("REFUSED")
    assert json.loads(event["payload"])["refused"] == code and beat.events("FAILED") == []
    assert explain(beat.app.store, str(job)).verdict.startswith("blocked: refused by the jobs service")
    assert [j.phase for j in overview(beat.app.store)] == [JobPhase.REFUSED]
    monitor = AlertMonitor(beat.app.store, beat.app.control, heartbeat.backend, AlertPolicies(), beat.root)
    monitor.fold(refused)
    (alert,) = [a for a in _job_alerts(AlertPolicies(), monitor.state, datetime.now(timezone.utc))
                if a.kind.value in ("JOB_FAILED", "JOB_REFUSED")]
    assert alert.kind.value == "JOB_REFUSED"
    assert "refused by the jobs service, never executed" in alert.summary and code in alert.summary
    loaded = fold_control_rows(HotState(), beat.rows(str(job)), times=True)  # how a new process's monitor starts
    assert [a.kind.value for a in _job_alerts(AlertPolicies(), loaded, datetime.now(timezone.utc))] == ["JOB_REFUSED"]

    for value in (3, 4):  # new data, ticks: never asked again by itself, the retry policy notwithstanding
        assert new_data_then_tick(beat, heartbeat, value).triggered == []
    assert len(api.runs_of(job)) == 1

    ask_retry(beat.app, str(job), by="test")  # asked before the cause is fixed: refused again
    assert heartbeat.tick().triggered_job_ids == [str(job)]
    assert heartbeat.tick().refused == [str(job)]
    health = Liveness(healthy=True, message="ticking", age_s=0.0, limit_s=60.0)
    (line,) = on_call(overview(beat.app.store), [], health, []).jobs  # status says the refused run was the retry
    assert line.attention.value == "refused" and line.verdict.startswith("retry: ") and "refused" in line.verdict, line
    api.jobs[job].refuse = None  # the operator enabled the job, then asks for a retry
    ask_retry(beat.app, str(job), by="test")
    assert heartbeat.tick().triggered_job_ids == [str(job)]
    runs = api.runs_of(job)
    assert len(runs) == 3 and len({r.token for r in runs}) == 3  # each ask its own token: never a refused run back
    assert [r["status"] for r in beat.rows(str(job))] == ["IN_PROGRESS"]


@pytest.mark.parametrize("choice, failed", [(None, False), ("failed", True), (("etl",), True), (("load",), False)])
def test_success_with_failures_is_decided_per_job_from_its_tasks(beat, api, choice, failed):
    """SUCCESS_WITH_FAILURES always counted as success, though an ALL_DONE cleanup task reaches it with the ETL
    task failed: the job's run policy (``success_with_failures``) decides from the run's tasks (runs/get)."""
    from heartbeat_runner.policies.retry import RetryPolicies, RetryPolicy

    job = api.add_job()
    beat.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = heartbeat_for(beat, api)
    if choice is not None:
        heartbeat.policies = RetryPolicies(jobs={str(job): RetryPolicy(success_with_failures=choice)})
    heartbeat.tick()
    new_data_then_tick(beat, heartbeat, 2)
    (run,) = api.runs_of(job)
    api.finish_run(run.run_id, "SUCCESS_WITH_FAILURES", tasks={"etl": "FAILED", "cleanup": "SUCCESS"})
    result = heartbeat.tick()
    assert (result.failed, result.completed) == (([str(job)], []) if failed else ([], [str(job)]))
    (control,) = beat.rows(str(job))
    assert control["status"] == ("FAILED" if failed else "COMPLETED")
    if failed:
        assert "failed tasks: etl" in control["last_error"] and "success_with_failures" in control["last_error"]
