"""The Databricks backend at scale, through the real databricks-sdk against the stand-in: bulk reconciliation
from one listing of the workspace's active runs, incremental recovery of failed jobs, parallel triggering
under throttling. Assertions count API calls (never times)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from databricks_jobs_server import JobsApiServer

from heartbeat_runner.core.settings import JobsApiLimits
from heartbeat_runner.jobs.base import FailedJob, RunOutcome, RunRef, TriggerRequest
from heartbeat_runner.jobs.calls import ApiBudget, call_all
from heartbeat_runner.jobs.databricks import DatabricksJobsBackend

LIMITS = JobsApiLimits(concurrency=16, rate_per_s=10_000)


@pytest.fixture
def server():
    with JobsApiServer() as srv:
        srv.record_requests = False
        yield srv


def backend_for(server: JobsApiServer, limits: JobsApiLimits = LIMITS) -> DatabricksJobsBackend:
    # the stand-in's fast clock counts every shortened Retry-After sleep (of all threads) as time passed
    return DatabricksJobsBackend(server.client(retry_timeout_s=3600), limits=limits)


def trigger_jobs(server: JobsApiServer, backend: DatabricksJobsBackend, count: int) -> list[RunRef]:
    """``count`` jobs, each triggered once through the backend (in parallel)."""
    jobs = [server.add_job(f"job_{i}") for i in range(count)]
    requests = [TriggerRequest(str(job), None, f"tok-{job}") for job in jobs]
    calls = call_all(requests, backend.trigger, ApiBudget(LIMITS))
    assert not calls.not_started and all(a.error is None for a in calls.answers)
    return [RunRef(a.item.job_id, str(a.value)) for a in calls.answers]


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_thousand_running_runs_are_reconciled_from_the_workspace_listing(server):
    backend = backend_for(server)
    refs = trigger_jobs(server, backend, 1000)
    for ref in refs:
        server.start_run(ref.run_id)
    server.add_other_runs(active=30, completed=200)  # other teams' runs in the same workspace
    server.reset_counts()

    found = backend.reconcile(refs, [], ApiBudget(LIMITS))  # slices cut at start times estimated at run-now

    assert {ref.run_id for ref in refs} == set(found.statuses)
    assert {s.outcome for s in found.statuses.values()} == {RunOutcome.RUNNING}
    assert server.calls("runs/get") == 0 and not found.notes and not found.problems
    server.reset_counts()
    backend.reconcile(refs, [], ApiBudget(LIMITS))  # steady: slices cut at the start times listed
    assert server.calls("runs/list") <= 1000 // 25 + 5 and server.calls("runs/get") == 0

    finished = refs[::100]
    for ref in finished:
        server.finish_run(ref.run_id, "FAILED" if ref is refs[0] else "SUCCESS")
    server.reset_counts()
    found = backend.reconcile(refs, [], ApiBudget(LIMITS))
    assert server.calls("runs/get") == len(finished)  # only the runs that left the active list
    assert found.statuses[refs[0].run_id].outcome is RunOutcome.FAILED
    assert {found.statuses[r.run_id].outcome for r in finished[1:]} == {RunOutcome.SUCCESS}
    assert sum(s.outcome is RunOutcome.RUNNING for s in found.statuses.values()) == 1000 - len(finished)


def test_runs_finishing_between_two_pages_are_neither_lost_nor_misread(server):
    backend = backend_for(server, JobsApiLimits(concurrency=1, rate_per_s=10_000))  # one page chain
    refs = trigger_jobs(server, backend, 200)
    for ref in refs:
        server.start_run(ref.run_id)
    newest_first = list(reversed(refs))
    early = newest_first[:10]  # on the first page: already read when they finish
    server.after_call("runs/list", 1, lambda: [server.finish_run(r.run_id, "SUCCESS") for r in early])

    found = backend.reconcile(refs, [], ApiBudget(LIMITS))

    # Every run has a status; the page shift hid 10 running runs from the listing: each was looked up.
    assert set(found.statuses) == {ref.run_id for ref in refs}
    assert server.calls("runs/get") == 10
    assert {found.statuses[r.run_id].outcome for r in early} == {RunOutcome.RUNNING}  # read before they finished
    assert sum(s.outcome is RunOutcome.RUNNING for s in found.statuses.values()) == 200

    again = backend.reconcile(refs, [], ApiBudget(LIMITS))
    assert {again.statuses[r.run_id].outcome for r in early} == {RunOutcome.SUCCESS}


def test_over_the_page_budget_the_runs_not_listed_are_looked_up_and_the_report_says_so(server):
    backend = backend_for(server, JobsApiLimits(concurrency=1, rate_per_s=10_000, list_pages=2))
    refs = trigger_jobs(server, backend, 60)
    server.reset_counts()

    found = backend.reconcile(refs, [], ApiBudget(LIMITS))

    assert server.calls("runs/list") == 2 and server.calls("runs/get") == 10
    assert len(found.statuses) == 60 and "HEARTBEAT_JOBS_API_LIST_PAGES" in found.notes[0]


def test_a_failed_job_is_recovered_by_a_manual_run_without_re_reading_its_history(server):
    backend = backend_for(server)
    failed_at = datetime.now(timezone.utc) - timedelta(hours=1)
    jobs = [server.add_job(f"job_{i}") for i in range(50)]
    for job in jobs:
        for i in range(100):  # a long history before the failure
            server.create_manual_run(job, "FAILED", start_ms=ms(failed_at - timedelta(hours=30, minutes=-i)),
                                     end_ms=ms(failed_at - timedelta(hours=29, minutes=-i)))
    repaired = server.create_manual_run(jobs[1], "FAILED", start_ms=ms(failed_at - timedelta(minutes=5)))
    server.repair_run(repaired)  # a repair of the failed run: same run id, old start time, running again
    failed = [FailedJob(str(job), failed_at) for job in jobs]

    first = backend.reconcile([], failed, ApiBudget(LIMITS))  # the first look of this process: per job, once
    assert first.recovered == {} and server.calls("runs/list") >= 50

    server.reset_counts()
    for _ in range(3):  # steady ticks: two listings each, whatever the history
        assert backend.reconcile([], failed, ApiBudget(LIMITS)).recovered == {}
    assert server.calls("runs/list") == 6 and server.calls("runs/get") == 0

    manual = server.create_manual_run(jobs[0], "SUCCESS")  # someone fixed it and re-ran the job by hand
    server.finish_run(repaired, "SUCCESS")
    server.reset_counts()
    found = backend.reconcile([], failed, ApiBudget(LIMITS))
    assert found.recovered[str(jobs[0])].run_id == str(manual)
    assert found.recovered[str(jobs[1])].run_id == str(repaired)  # seen active before, looked up when it ended
    assert set(found.recovered) == {str(jobs[0]), str(jobs[1])}
    assert server.calls("runs/list") == 2 and server.calls("runs/get") == 1


def test_parallel_triggers_under_a_429_storm_start_each_run_once(server):
    backend = backend_for(server)
    server.throttle_every("run-now", 3, retry_after=1)  # the SDK honours Retry-After (sleeps shortened here)
    refs = trigger_jobs(server, backend, 300)

    assert len({ref.run_id for ref in refs}) == 300 and len(server.runs) == 300
    assert server.calls("run-now") > 300  # the throttled calls were retried, with their tokens
    again = call_all([TriggerRequest(r.job_id, None, f"tok-{r.job_id}") for r in refs], backend.trigger,
                     ApiBudget(LIMITS))
    assert [str(a.value) for a in again.answers] == [r.run_id for r in refs] and len(server.runs) == 300


def test_the_budget_leaves_a_suffix_of_the_calls_in_order():
    budget = ApiBudget(JobsApiLimits(concurrency=4, max_calls=7))
    calls = call_all(list(range(20)), lambda n: n * n, budget)
    assert [a.value for a in calls.answers] == [n * n for n in range(7)]
    assert calls.not_started == list(range(7, 20)) and budget.spent


def test_past_its_deadline_a_budget_starts_nothing_and_listings_stop_too():
    budget = ApiBudget(JobsApiLimits(budget_s=1e-9))
    time.sleep(0.001)
    calls = call_all([1, 2, 3], lambda n: n, budget)
    assert calls.answers == [] and calls.not_started == [1, 2, 3]
    assert budget.spent and budget.time_only().spent
    assert not ApiBudget(JobsApiLimits(max_calls=1)).time_only().spent  # listings are not counted in calls


def test_a_new_process_starts_from_the_memory_the_previous_one_left_and_reads_no_history(server):
    """A process per tick (cron, a scheduled job) lost the look for successful runs of failed jobs every tick:
    one runs/list per failed job each tick. The memory a backend leaves (carried as JSON in the run summary)
    lets the next process make the same two listings whatever the number of failed jobs."""
    failed_at = datetime.now(timezone.utc) - timedelta(hours=1)
    jobs = [server.add_job(f"job_{i}") for i in range(300)]
    failed = [FailedJob(str(job), failed_at) for job in jobs]
    first = backend_for(server)
    assert first.reconcile([], failed, ApiBudget(LIMITS)).recovered == {}
    assert server.calls("runs/list") >= 300
    carried = json.loads(json.dumps(first.memory()))

    manual = server.create_manual_run(jobs[7], "SUCCESS")
    server.reset_counts()
    second = backend_for(server)  # the next process
    second.remember(carried)
    found = second.reconcile([], failed, ApiBudget(LIMITS))
    assert found.recovered[str(jobs[7])].run_id == str(manual) and len(found.recovered) == 1
    assert server.calls("runs/list") == 2 and server.calls("runs/get") == 0

    server.reset_counts()
    third = backend_for(server)
    third.remember({"looked_at_ms": "not a memory"})  # unreadable: the look starts afresh, still right
    assert str(jobs[7]) in third.reconcile([], failed, ApiBudget(LIMITS)).recovered
    assert server.calls("runs/list") >= 300


def test_a_failed_run_repaired_between_two_looks_unblocks_its_job(server):
    """A repair keeps the run id and its old start time: one that started and ended between two looks showed in
    neither the active listing nor the listing of runs started since, so the job stayed blocked."""
    backend = backend_for(server)
    jobs = [server.add_job(f"job_{i}") for i in range(20)]
    failed_runs = [server.create_manual_run(job, "FAILED", start_ms=ms(datetime.now(timezone.utc) - timedelta(hours=2)))
                   for job in jobs]
    failed_at = datetime.now(timezone.utc)
    failed = [FailedJob(str(job), failed_at, str(run)) for job, run in zip(jobs, failed_runs)]
    assert backend.reconcile([], failed, ApiBudget(LIMITS)).recovered == {}

    server.repair_run(failed_runs[13])
    server.finish_run(failed_runs[13], "SUCCESS")  # repaired to success between two ticks
    server.reset_counts()
    seen: dict[str, object] = {}
    for _ in range(3):  # 20 failed runs, 8 looked up a tick: every one within three ticks
        seen.update(backend.reconcile([], failed, ApiBudget(LIMITS)).recovered)
        if seen:
            break
    assert set(seen) == {str(jobs[13])}
    status = seen[str(jobs[13])]
    assert status.run_id == str(failed_runs[13]) and status.end_time > failed_at
    assert server.calls("runs/get") <= 3 * 8 and server.calls("runs/list") <= 3 * 2
