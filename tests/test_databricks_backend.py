"""The Databricks jobs backend, driven through the real databricks-sdk against a stateful stand-in server."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from databricks_jobs_server import (
    SERVER_ERROR,
    THROTTLED,
    TOKEN,
    UNAUTHENTICATED,
    UNAVAILABLE,
    UNAVAILABLE_AFTER_RUN,
    Fault,
    JobsApiServer,
    slow,
)

from heartbeat_runner.core.errors import AuthError, JobNotFoundError, JobsBackendError
from heartbeat_runner.jobs.base import RunOutcome, RunStatus, TriggerRequest
from heartbeat_runner.jobs.databricks import DatabricksJobsBackend, parse_job_id
from heartbeat_runner.policies.retry import RetryPolicy, overrun, retry_token

WINDOWS = json.dumps([{"sensor_source": "delta_table", "sensor_id": "sales.orders", "from": "3", "to": "7"}])


@pytest.fixture
def server():
    with JobsApiServer() as srv:
        yield srv


@pytest.fixture
def backend(server):
    return DatabricksJobsBackend(server.client())


def request_for(job_id: int | str, token: str = "tok-1") -> TriggerRequest:
    return TriggerRequest(job_id=str(job_id), job_name="orders_etl", idempotency_token=token,
                          parameters={"heartbeat_run_id": "20250101T000000-abc", "heartbeat_windows": WINDOWS})


# -- the happy paths ----------------------------------------------------------------------------


def test_trigger_then_track_to_success(server, backend):
    job = server.add_job("orders_etl")
    run_id = backend.trigger(request_for(job))

    assert backend.run_status(str(job), run_id).outcome is RunOutcome.PENDING
    server.start_run(run_id)
    running = backend.run_status(str(job), run_id)
    assert running.outcome is RunOutcome.RUNNING and running.start_time is not None and running.end_time is None

    server.finish_run(run_id, "SUCCESS")
    done = backend.run_status(str(job), run_id)
    assert done.outcome is RunOutcome.SUCCESS and done.message is None
    assert done.end_time is not None and done.end_time >= done.start_time
    assert done.end_time.tzinfo is not None


def test_failed_run_reports_the_state_message(server, backend):
    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.finish_run(run_id, "FAILED", "Task etl failed with message: division by zero")

    status = backend.run_status(str(job), run_id)
    assert status.outcome is RunOutcome.FAILED
    assert "division by zero" in status.message and f"/runs/{run_id}" in status.message
    assert status.failure_reason == "Task etl failed with message: division by zero"  # the one line; no link


def test_parameters_reach_the_job_as_sent(server, backend):
    job = server.add_job()
    request = request_for(job)
    run_id = backend.trigger(request)

    (run,) = server.runs_of(job)
    assert str(run.run_id) == run_id
    assert run.parameters == request.parameters
    assert run.token == request.idempotency_token
    assert json.loads(run.parameters["heartbeat_windows"])[0]["sensor_id"] == "sales.orders"


def test_same_token_twice_gives_one_run(server, backend):
    job = server.add_job()
    first = backend.trigger(request_for(job, "tok-same"))
    second = backend.trigger(request_for(job, "tok-same"))
    third = backend.trigger(request_for(job, "tok-other"))

    assert first == second != third
    assert len(server.runs_of(job)) == 2
    assert all('"idempotency_token"' in json.dumps(body) for method, _, body in server.requests if method == "POST")


def test_successful_run_after_finds_a_manual_run_and_ignores_older_or_failed_ones(server, backend):
    job, other_job = server.add_job(), server.add_job()
    failed_at = datetime.now(timezone.utc) - timedelta(hours=1)
    ms = lambda dt: int(dt.timestamp() * 1000)  # noqa: E731
    server.create_manual_run(job, "SUCCESS", start_ms=ms(failed_at - timedelta(hours=3)),
                             end_ms=ms(failed_at - timedelta(hours=2)))          # before the failure
    server.create_manual_run(job, "FAILED", start_ms=ms(failed_at + timedelta(minutes=5)),
                             end_ms=ms(failed_at + timedelta(minutes=9)))         # after, but failed
    server.create_manual_run(other_job, "SUCCESS", start_ms=ms(failed_at + timedelta(minutes=1)),
                             end_ms=ms(failed_at + timedelta(minutes=2)))         # another job

    assert backend.successful_run_after(str(job), failed_at) is None

    wanted = server.create_manual_run(job, "SUCCESS", start_ms=ms(failed_at + timedelta(minutes=10)),
                                      end_ms=ms(failed_at + timedelta(minutes=20)))
    found = backend.successful_run_after(str(job), failed_at.replace(tzinfo=None))  # naive, as Spark returns it
    assert found is not None and found.run_id == str(wanted) and found.outcome is RunOutcome.SUCCESS
    query = next(q for _, path, q in server.requests if path.endswith("/jobs/runs/list"))
    assert query["completed_only"] == "true" and query["job_id"] == str(job)


def test_successful_run_after_pages_through_runs_and_finds_a_repaired_run(server, backend):
    """A repaired run keeps its start time (before the failure) and ends after it; it sits on page 2."""
    job = server.add_job()
    failed_at = datetime.now(timezone.utc) - timedelta(hours=1)
    ms = lambda dt: int(dt.timestamp() * 1000)  # noqa: E731
    repaired = server.create_manual_run(job, "SUCCESS", start_ms=ms(failed_at - timedelta(minutes=30)),
                                        end_ms=ms(failed_at + timedelta(minutes=30)))
    for i in range(30):
        server.create_manual_run(job, "FAILED", start_ms=ms(failed_at + timedelta(seconds=i + 1)),
                                 end_ms=ms(failed_at + timedelta(seconds=i + 2)))

    found = backend.successful_run_after(str(job), failed_at)
    assert found is not None and found.run_id == str(repaired)
    assert server.calls("runs/list") == 2


# -- faults: the SDK retries, the token keeps it to one run --------------------------------------


@pytest.mark.parametrize("fault", [THROTTLED, UNAVAILABLE, UNAVAILABLE_AFTER_RUN], ids=["429", "503", "503-after-run"])
def test_throttling_and_unavailability_are_retried_into_exactly_one_run(server, backend, fault):
    job = server.add_job()
    server.inject("run-now", fault, times=2)

    run_id = backend.trigger(request_for(job))

    assert server.calls("run-now") == 3
    assert [str(r.run_id) for r in server.runs_of(job)] == [run_id]


def test_read_timeout_after_the_run_started_is_retried_into_exactly_one_run(server):
    backend = DatabricksJobsBackend(server.client(http_timeout_s=0.3))
    job = server.add_job()
    server.inject("run-now", slow(1.0))  # the server starts the run, the client stops waiting

    run_id = backend.trigger(request_for(job))

    assert server.calls("run-now") == 2
    assert [str(r.run_id) for r in server.runs_of(job)] == [run_id]


def test_without_a_token_the_same_timeout_would_start_two_runs(server):
    """Why the token matters: the same retried call without it (plain SDK) duplicates the run."""
    client = server.client(http_timeout_s=0.3)
    job = server.add_job()
    server.inject("run-now", slow(1.0))

    client.jobs.run_now(job, job_parameters={"heartbeat_run_id": "x"})

    assert len(server.runs_of(job)) == 2


def test_retries_exhausted_is_a_retryable_error_and_the_next_tick_gets_the_same_run(server):
    backend = DatabricksJobsBackend(server.client(http_timeout_s=0.3, retry_timeout_s=1))
    job = server.add_job()
    server.inject("run-now", UNAVAILABLE_AFTER_RUN, times=1000)

    with pytest.raises(JobsBackendError) as caught:
        backend.trigger(request_for(job))
    assert caught.value.retryable and "outcome unknown" in str(caught.value)

    server.clear_faults()
    assert [str(r.run_id) for r in server.runs_of(job)] == [backend.trigger(request_for(job))]


def test_internal_error_is_a_clear_retryable_error_and_a_retry_does_not_duplicate(server, backend):
    job = server.add_job()
    server.inject("run-now", SERVER_ERROR)  # the run started, then the API failed

    with pytest.raises(JobsBackendError) as caught:
        backend.trigger(request_for(job))
    message = str(caught.value)
    assert caught.value.retryable
    assert f"run-now of job {job}" in message and "INTERNAL_ERROR" in message and "request id 7f3a" in message
    assert server.calls("run-now") == 1  # the SDK does not retry a 500

    run_id = backend.trigger(request_for(job))  # the next tick, same token
    assert [str(r.run_id) for r in server.runs_of(job)] == [run_id]


def test_unauthenticated_is_an_auth_error_without_the_token(server, backend):
    job = server.add_job()
    server.inject("run-now", UNAUTHENTICATED)

    with pytest.raises(AuthError) as caught:
        backend.trigger(request_for(job))
    assert not caught.value.retryable
    assert "credentials" in str(caught.value) and "DATABRICKS_TOKEN" in str(caught.value)
    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value.__cause__)
    assert server.runs_of(job) == []


def test_wrong_token_is_an_auth_error_without_the_token(server):
    backend = DatabricksJobsBackend(server.client(token="dapi-wrong-secret"))
    with pytest.raises(AuthError) as caught:
        backend.run_status("1", "2")
    assert "Invalid access token" in str(caught.value) and "dapi-wrong-secret" not in str(caught.value)


def test_unknown_job_is_job_not_found(server, backend):
    with pytest.raises(JobNotFoundError) as caught:
        backend.trigger(request_for(424242))
    assert "424242" in str(caught.value) and not caught.value.retryable
    with pytest.raises(JobNotFoundError):
        backend.successful_run_after("424242", datetime.now(timezone.utc))


def test_not_found_answer_is_job_not_found(server, backend):
    job = server.add_job()
    server.inject("run-now", Fault(404, "RESOURCE_DOES_NOT_EXIST", f"Job {job} does not exist."))
    with pytest.raises(JobNotFoundError):
        backend.trigger(request_for(job))


@pytest.mark.parametrize("bad", ["", "abc", "12.5", "-3", "0", "job_123"])
def test_non_numeric_job_id_is_a_clear_error_before_any_call(server, backend, bad):
    with pytest.raises(JobNotFoundError, match="not a Databricks job id"):
        backend.trigger(request_for(bad))
    assert [path for _, path, _ in server.requests if path.startswith("/api/")] == []  # no Jobs API call


def test_job_id_with_spaces_is_accepted():
    assert parse_job_id(" 123456789 ") == 123456789


def test_unknown_run_is_a_clear_error(server, backend):
    job = server.add_job()
    with pytest.raises(JobsBackendError, match="Run 999 does not exist") as caught:
        backend.run_status(str(job), "999")
    assert not isinstance(caught.value, JobNotFoundError)


def test_from_environment_uses_the_unified_auth_chain(server, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CONFIG_PROFILE", "DATABRICKS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".databrickscfg").write_text(f"[heartbeat-test]\nhost = {server.host}\ntoken = {TOKEN}\n")
    monkeypatch.setenv("DATABRICKS_CONFIG_PROFILE", "heartbeat-test")
    job = server.add_job()

    backend = DatabricksJobsBackend.from_environment(env={"HEARTBEAT_DATABRICKS_HTTP_TIMEOUT": "5"})
    assert backend.run_status(str(job), backend.trigger(request_for(job))).outcome is RunOutcome.PENDING
    assert backend.client.config.http_timeout_seconds == 5.0


def test_from_environment_without_credentials_is_a_clear_auth_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "DATABRICKS_CONFIG_PROFILE", "DATABRICKS_CONFIG_FILE",
                 "DATABRICKS_CLIENT_ID", "DATABRICKS_CLIENT_SECRET", "DATABRICKS_AUTH_TYPE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AuthError, match="DATABRICKS_CONFIG_PROFILE"):
        DatabricksJobsBackend.from_environment()


def test_cancel_run(server, backend):
    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.start_run(run_id)
    backend.cancel_run(str(job), run_id)
    status = backend.run_status(str(job), run_id)
    assert status.outcome is RunOutcome.FAILED and "USER_CANCELED" in status.message


# -- policies ----------------------------------------------------------------------------------


def test_overrun_reports_runs_past_their_maximum_duration():
    now = datetime(2025, 1, 1, 12, tzinfo=timezone.utc)
    running = RunStatus("1", RunOutcome.RUNNING, start_time=now - timedelta(hours=3))
    assert overrun(running, timedelta(hours=2), now) == timedelta(hours=1)
    assert overrun(running, timedelta(hours=4), now) is None
    assert overrun(running, None, now) is None
    assert overrun(RunStatus("1", RunOutcome.SUCCESS, start_time=running.start_time), timedelta(0), now) is None
    assert overrun(RunStatus("1", RunOutcome.PENDING, start_time=running.start_time), timedelta(0), now) is None


def test_retry_policy_is_off_by_default_and_backs_off():
    t0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert not RetryPolicy().enabled and not RetryPolicy().decide(1, t0, t0 + timedelta(days=1)).retry_now

    policy = RetryPolicy.from_mapping({"max_retries": 2, "backoff_s": 60, "multiplier": 3})
    assert policy.delay(1) == timedelta(seconds=60) and policy.delay(2) == timedelta(seconds=180)
    assert not policy.decide(1, t0, t0 + timedelta(seconds=59)).retry_now
    first = policy.decide(1, t0, t0 + timedelta(seconds=60))
    assert first.retry_now and first.attempt == 1
    assert policy.decide(2, t0, t0 + timedelta(seconds=180)).retry_now
    gave_up = policy.decide(3, t0, t0 + timedelta(days=1))
    assert not gave_up.retry_now and gave_up.not_before is None and "gave up" in gave_up.reason
    assert RetryPolicy(max_retries=9, backoff_s=60, max_backoff_s=100).delay(5) == timedelta(seconds=100)
    with pytest.raises(ValueError, match="unknown"):
        RetryPolicy.from_mapping({"retries": 1})


def test_retry_tokens_are_deterministic_distinct_and_short():
    tokens = [retry_token("a" * 36, n) for n in range(4)]
    assert tokens[0] == "a" * 36 and len(set(tokens)) == 4
    assert tokens == [retry_token("a" * 36, n) for n in range(4)] and max(map(len, tokens)) <= 64


# -- every run fate, read from the wire ---------------------------------------------------------


def test_success_with_failures_is_a_success_with_its_reason(server, backend):
    """The job's final leaf task succeeded, another leaf failed: databricks-sdk 0.47 has no enum member for the
    code (it parses as None), so reading the SDK's enums recorded the run FAILED."""
    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.finish_run(run_id, "SUCCESS_WITH_FAILURES")

    status = backend.run_status(str(job), run_id)
    assert status.outcome is RunOutcome.SUCCESS and status.end_time is not None
    assert status.message.startswith("SUCCESS_WITH_FAILURES")
    assert backend.successful_run_after(str(job), datetime.now(timezone.utc) - timedelta(hours=1)).run_id == run_id


@pytest.mark.parametrize("fate, reason", [("TIMEDOUT", "TIMEDOUT"), ("CANCELED", "USER_CANCELED"),
                                          ("FAILED", "RUN_EXECUTION_ERROR")])
def test_timed_out_and_cancelled_runs_fail_with_their_reason(server, backend, fate, reason):
    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.finish_run(run_id, fate)

    status = backend.run_status(str(job), run_id)
    assert status.outcome is RunOutcome.FAILED and reason in status.message and status.end_time is not None


@pytest.mark.parametrize("state", ["QUEUED", "PENDING", "BLOCKED", "WAITING"])
def test_waiting_states_are_pending(server, backend, state):
    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.start_run(run_id, state)
    assert backend.run_status(str(job), run_id).outcome is RunOutcome.PENDING


def test_a_run_over_max_concurrent_runs_without_queueing_is_skipped_not_failed(server, backend):
    job = server.add_job(max_concurrent_runs=1, queue=False)
    first = backend.trigger(request_for(job, "tok-1"))
    second = backend.trigger(request_for(job, "tok-2"))

    status = backend.run_status(str(job), second)
    assert status.outcome is RunOutcome.SKIPPED and status.outcome.finished
    assert "MAX_CONCURRENT_RUNS_EXCEEDED" in status.message
    assert backend.run_status(str(job), first).outcome is RunOutcome.PENDING
    assert backend.trigger(request_for(job, "tok-2")) == second  # the same token hands back the skipped run


def test_a_repaired_run_is_seen_with_the_state_and_end_of_its_last_repair(server, backend):
    """A run that failed and was repaired to success between two looks keeps its id: its outcome and end time
    are the repair's."""
    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.finish_run(run_id, "FAILED", end_ms=int(datetime.now(timezone.utc).timestamp() * 1000) - 60_000)
    failed = backend.run_status(str(job), run_id)
    server.repair_run(run_id)
    server.finish_run(run_id, "SUCCESS")

    repaired = backend.run_status(str(job), run_id)
    assert repaired.run_id == run_id and repaired.outcome is RunOutcome.SUCCESS
    assert repaired.end_time > failed.end_time
    assert backend.successful_run_after(str(job), failed.end_time).run_id == run_id


# -- termination codes: one rule each, written down in docs/databricks.md ------------------------------


def documented_rules() -> dict[str, str]:
    """The ``| `CODE` | `RULE` |`` rows of the termination-code table of docs/databricks.md."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "databricks.md").read_text()
    section = doc[doc.index("### Termination codes"):doc.index("## 6a.")]
    return {code: rule for code, rule in re.findall(r"^\| `([A-Z_]+)`(?: \(legacy\))? \| `([A-Z_]+)` \|$", section, re.M)}


def test_every_termination_code_of_the_sdk_has_a_rule_and_the_docs_say_the_same():
    from databricks.sdk.service.jobs import TerminationCodeCode

    from heartbeat_runner.jobs.databricks import TERMINATION_RULES

    assert {code.value for code in TerminationCodeCode} <= set(TERMINATION_RULES)
    assert documented_rules() == {code: rule.value for code, rule in TERMINATION_RULES.items()}


@pytest.mark.parametrize("fate, outcome, backoff", [
    ("WORKSPACE_RUN_LIMIT_EXCEEDED", RunOutcome.SKIPPED, True),
    ("CLUSTER_REQUEST_LIMIT_EXCEEDED", RunOutcome.SKIPPED, True),
    ("DISABLED", RunOutcome.REFUSED, False),
    ("BUDGET_POLICY_LIMIT_EXCEEDED", RunOutcome.REFUSED, False),
    ("SKIPPED", RunOutcome.SKIPPED, False),
])
def test_runs_the_workspace_never_executed_are_skips_or_refusals_not_failures(server, backend, fate, outcome, backoff):
    """They were recorded FAILED and blocked their job."""
    job = server.add_job()
    server.jobs[job].refuse = fate
    run_id = backend.trigger(request_for(job))
    status = backend.run_status(str(job), run_id)
    assert (status.outcome, status.backoff) == (outcome, backoff)
    assert status.code == server.runs[int(run_id)].fate.code and status.code in (status.message or "")


def test_success_with_failures_reads_the_failed_tasks_from_runs_get_after_the_listing(server, backend):
    """A run found SUCCESS_WITH_FAILURES in the active-runs listing is read again with runs/get for its tasks."""
    from heartbeat_runner.jobs.base import RunRef
    from heartbeat_runner.jobs.calls import ApiBudget

    job = server.add_job()
    run_id = backend.trigger(request_for(job))
    server.start_run(run_id)
    backend.reconcile([RunRef(str(job), run_id)], [], ApiBudget())
    server.finish_run(run_id, "SUCCESS_WITH_FAILURES", tasks={"etl": "FAILED", "cleanup": "SUCCESS"})
    found = backend.reconcile([RunRef(str(job), run_id)], [], ApiBudget())
    status = found.statuses[run_id]
    assert status.outcome is RunOutcome.SUCCESS and status.partial and status.failed_tasks == ("etl",)
    assert RetryPolicy().partial_success_counts(status.failed_tasks)
    assert not RetryPolicy(success_with_failures="failed").partial_success_counts(status.failed_tasks)
    assert not RetryPolicy(success_with_failures=("etl",)).partial_success_counts(status.failed_tasks)
    assert RetryPolicy(success_with_failures=("load",)).partial_success_counts(status.failed_tasks)
    assert not RetryPolicy(success_with_failures=("load",)).partial_success_counts(None)  # tasks unknown
    assert RetryPolicy.from_mapping({"success_with_failures": ["etl"]}).success_with_failures == ("etl",)
    with pytest.raises(ValueError, match="success_with_failures"):
        RetryPolicy.from_mapping({"success_with_failures": "maybe"})
