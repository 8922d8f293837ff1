"""Run policies on top of the Databricks backend: automatic retry with back-off, maximum run duration."""

from __future__ import annotations

import json

import pytest
from databricks_jobs_server import JobsApiServer
from harness import config_row as row

from heartbeat_runner.jobs.databricks import DatabricksJobsBackend
from heartbeat_runner.policies.retry import RetryPolicies, RetryPolicy


@pytest.fixture
def api():
    with JobsApiServer() as server:
        yield server


def ticking(hb, api, job, *, policies=None, **settings):
    """Seed one Delta source for ``job``; a Heartbeat with the Databricks backend and these settings."""
    hb.create_table("sales.orders", "id int")
    hb.seed(row("delta_table", "sales.orders", str(job)))
    heartbeat = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(http_timeout_s=0.5, retry_timeout_s=2)))
    heartbeat.policies = policies or RetryPolicies()
    heartbeat.settings = hb.settings.with_(**settings)
    heartbeat.tick()  # baseline
    return heartbeat


def trigger(hb, api, heartbeat, job, value=1):
    hb.insert("sales.orders", f"({value})")
    heartbeat.tick()
    return api.runs_of(job)[-1]


def test_retry_policy_reruns_the_same_windows_until_the_maximum(hb, api):
    job = api.add_job()
    heartbeat = ticking(hb, api, job, policies=RetryPolicies(jobs={str(job): RetryPolicy(max_retries=2, backoff_s=0)}))
    first = trigger(hb, api, heartbeat, job)
    api.finish_run(first.run_id, "FAILED", "boom")

    result = heartbeat.tick()  # reconciles the failure; the retry is due at once (no back-off)
    if not result.retried:
        result = heartbeat.tick()
    assert result.retried == [str(job)]
    runs = api.runs_of(job)
    assert len(runs) == 2
    assert runs[1].parameters == first.parameters            # the same consumed windows
    assert runs[1].token != first.token                      # a new token per attempt
    assert hb.job_status(str(job)) == {"IN_PROGRESS"}

    api.finish_run(runs[1].run_id, "FAILED", "boom again")
    for _ in range(2):
        heartbeat.tick()
    assert len(api.runs_of(job)) == 3                         # retry 2 of 2
    api.finish_run(api.runs_of(job)[2].run_id, "FAILED", "still broken")
    for _ in range(3):
        heartbeat.tick()
    assert len(api.runs_of(job)) == 3                         # gave up: blocked as FAILED
    assert hb.job_status(str(job)) == {"FAILED"}
    (control,) = hb.rows(str(job))
    assert control["consecutive_failures"] == 3


def test_retry_waits_for_its_back_off_and_is_off_by_default(hb, api):
    from heartbeat_runner.interfaces.operations import retry_outlook

    job = api.add_job()
    heartbeat = ticking(hb, api, job)
    api.finish_run(trigger(hb, api, heartbeat, job).run_id, "FAILED", "boom")
    for _ in range(2):
        assert heartbeat.tick().retried == []                  # no policy: no retry
    assert retry_outlook(hb.app.store, heartbeat.policies, str(job)) is None
    heartbeat.policies = RetryPolicies(default=RetryPolicy(max_retries=1, backoff_s=3600))
    assert heartbeat.tick().retried == []                      # due in an hour
    assert len(api.runs_of(job)) == 1
    assert "retry 1 of 1 due at" in retry_outlook(hb.app.store, heartbeat.policies, str(job))  # what `explain` shows


def test_a_successful_retry_completes_and_later_data_triggers_again(hb, api):
    job = api.add_job()
    heartbeat = ticking(hb, api, job, policies=RetryPolicies(default=RetryPolicy(max_retries=1, backoff_s=0)))
    api.finish_run(trigger(hb, api, heartbeat, job).run_id, "FAILED", "boom")
    hb.insert("sales.orders", "(2)")  # arrives while the job is failed: not consumed by the retry
    heartbeat.tick()
    heartbeat.tick()
    retry = api.runs_of(job)[-1]
    assert len(api.runs_of(job)) == 2
    api.finish_run(retry.run_id, "SUCCESS")
    heartbeat.tick()
    heartbeat.tick()
    runs = api.runs_of(job)
    assert len(runs) == 3                                       # the later data got its own run
    windows = json.loads(runs[2].parameters["heartbeat_windows"])
    assert windows[0]["from"] != json.loads(runs[0].parameters["heartbeat_windows"])[0]["from"]


def test_a_run_longer_than_the_maximum_is_reported_and_optionally_cancelled(hb, api):
    job = api.add_job()
    heartbeat = ticking(hb, api, job, max_run_duration_s=0.01)
    run = trigger(hb, api, heartbeat, job)
    api.start_run(run.run_id)
    result = heartbeat.tick()
    assert [p.job_id for p in result.overdue] == [str(job)]
    assert "past its maximum duration" in result.overdue[0].message
    assert hb.job_status(str(job)) == {"IN_PROGRESS"}           # reported, not touched

    heartbeat.settings = heartbeat.settings.with_(cancel_overdue_runs=True)
    result = heartbeat.tick()
    assert "cancelled" in result.overdue[0].message
    heartbeat.tick()
    assert hb.job_status(str(job)) == {"FAILED"}


def test_the_run_policy_file_is_read_once_with_every_section_and_every_problem(tmp_path):
    from heartbeat_runner.core.errors import ConfigError
    from heartbeat_runner.policies.run_policies import load_run_policies

    path = tmp_path / "policies.yml"
    path.write_text('jobs:\n  "1": {max_retries: 2, catch_up: {max_window: 3}}\n  H: {window: {size: 1h}}\n')
    policies = load_run_policies(path)
    assert (policies.retry.for_job("1").max_retries, policies.catch_up["1"].max_window.count, policies.windows["H"].size_s) \
        == (2, 3, 3600)
    assert policies.unknown_jobs(["1"]) == ["H"] and load_run_policies(None) == load_run_policies(tmp_path / "none.yml")
    path.write_text('default: {window: {size: 1h}}\njobs:\n  "1": {max_retrys: 2, catch_up: {max_window: 0}}\n')
    with pytest.raises(ConfigError) as raised:
        load_run_policies(path)
    assert [p.split(": invalid ")[1].split(" policy")[0] for p in raised.value.problems] == ["retry", "catch_up", "window"]
    path.write_text("jobs: [unclosed\n")
    with pytest.raises(ConfigError, match="policies.yml: not valid YAML"):
        load_run_policies(path)


def test_run_policy_file_is_read_and_bad_files_name_themselves(tmp_path):
    from heartbeat_runner.core.errors import ConfigError
    from heartbeat_runner.policies.run_policies import load_run_policies

    path = tmp_path / "retry.yml"
    path.write_text('default: {max_retries: 1}\njobs:\n  "42": {max_retries: 3, backoff_s: 60}\n')
    policies = load_run_policies(path).retry
    assert policies.for_job("42") == RetryPolicy(max_retries=3, backoff_s=60)
    assert policies.for_job("7").max_retries == 1
    assert not load_run_policies(tmp_path / "missing.yml").retry.for_job("42").enabled
    path.write_text('jobs:\n  "42": {max_retries: 3, backof_s: 60}\n')
    with pytest.raises(ConfigError, match=r"retry.yml: invalid retry policy: unknown retry policy setting\(s\): backof_s"):
        load_run_policies(path)


def test_a_skipped_retry_is_asked_again_with_a_new_token_not_handed_back_the_skipped_run(hb, api):
    job = api.add_job(max_concurrent_runs=1, queue=False)
    heartbeat = ticking(hb, api, job, policies=RetryPolicies(jobs={str(job): RetryPolicy(max_retries=1, backoff_s=0)}))
    first = trigger(hb, api, heartbeat, job)
    api.finish_run(first.run_id, "FAILED", "boom")
    blocker = api.create_manual_run(job, "SUCCESS", start_ms=first.start_ms - 1)
    api.runs[blocker].lifecycle, api.runs[blocker].fate = "RUNNING", None  # someone's run holds the only slot

    for _ in range(2):
        if heartbeat.tick().retried:
            break
    (retry,) = [r for r in api.runs_of(job) if r.token and r.run_id != first.run_id]
    assert retry.lifecycle == "SKIPPED"
    assert [p.job_id for p in heartbeat.tick().runs_skipped] == [str(job)]
    assert hb.job_status(str(job)) == {"FAILED"}  # the skipped retry is void: the failure stands

    api.finish_run(blocker, "SUCCESS")  # the slot is free (a success that ended before the failure's end)
    api.runs[blocker].end_ms = first.end_ms - 1
    for _ in range(2):
        if heartbeat.tick().retried:
            break
    tokens = [r.token for r in api.runs_of(job) if r.token]
    assert len(tokens) == 3 and len(set(tokens)) == 3  # the retry asked again under a new token
    assert api.runs_of(job)[-1].lifecycle == "QUEUED" and hb.job_status(str(job)) == {"IN_PROGRESS"}
