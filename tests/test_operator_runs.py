"""Manual runs. `retry --job-id J`: an operator re-runs a failed job over the data its failed run had, as
Databricks' repair does: at the next tick, with a new idempotency token, exactly once, even when
the runner dies between recording the retry and calling the jobs API, when the operator asks
twice, or when two runners tick at once. A job that has not failed is refused and nothing changes.
`trigger --job-id J`: run a job now, consuming whatever it has pending (or nothing), with the same
guarantees; a running or failed job is refused.

Real ``python -m heartbeat_runner`` processes against the stateful Jobs API stand-in (real SDK).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from databricks_jobs_server import TOKEN, JobsApiServer
from harness import HEADER, CliLakehouse, marker_jobs_file
from harness import config_row as row

from heartbeat_runner.core.faults import CRASH_EXIT_CODE, FaultPoint

JOB = "101"
ARGS = ("--jobs-backend", "databricks")


@pytest.fixture
def api():
    with JobsApiServer() as server:
        server.add_job("job_101", job_id=int(JOB))
        yield server


def failed_job(tmp_path, api: JobsApiServer) -> CliLakehouse:
    """Job 101 over one Delta source: triggered once by new data, and that run FAILED (recorded)."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.orders", JOB)]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", JOB),
                        env={"DATABRICKS_HOST": api.host, "DATABRICKS_TOKEN": TOKEN,
                             "HEARTBEAT_DATABRICKS_RETRY_TIMEOUT": "10"})
    lake.home.mkdir(parents=True)
    lake.append_ids("up.orders", 1)
    lake.cli("seed")
    lake.cli("run", *ARGS)  # baseline
    lake.append_ids("up.orders", 2)
    lake.cli("run", *ARGS)
    (first,) = api.runs_of(int(JOB))
    api.finish_run(first.run_id, "FAILED", "bad input")
    lake.cli("run", *ARGS)
    assert statuses(lake) == {"FAILED"}
    return lake


def statuses(lake: CliLakehouse) -> set[str]:
    return {status for (_, _, job, status, *_) in lake.control() if job == JOB}


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_retry_reruns_the_failed_data_once_with_a_new_token_clears_on_success_and_is_then_refused(tmp_path, api):
    lake = failed_job(tmp_path, api)
    asked = lake.cli("retry", "--job-id", JOB)
    assert "retry asked" in asked.stdout
    lake.cli("retry", "--job-id", JOB, "--reason", "input fixed")  # asked twice before the tick: still one retry
    ask = json.loads(lake.events("RETRY_ASKED")[-1]["payload"])
    assert ask["reason"] == "input fixed" and ask["via"] == "cli" and "@" in ask["by"]

    lake.cli("run", *ARGS)
    lake.cli("run", *ARGS)
    first, again = api.runs_of(int(JOB))
    assert again.parameters == first.parameters  # the same windows as the failed run
    assert again.token != first.token
    (request,) = lake.events("RETRY_REQUESTED")
    assert "retry asked by" in request["message"] and "input fixed" in request["message"]
    assert statuses(lake) == {"IN_PROGRESS"}

    api.finish_run(again.run_id, "SUCCESS")
    lake.cli("run", *ARGS)
    assert statuses(lake) == {"COMPLETED"}
    assert len(api.runs_of(int(JOB))) == 2

    before = lake.events()  # a job that has not failed (and an unknown one) is refused; nothing changes
    refused = lake.cli("retry", "--job-id", JOB, check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert f"job {JOB} has not failed (status: COMPLETED)" in refused.stderr
    unknown = lake.cli("retry", "--job-id", "NOPE", check=False)
    assert unknown.returncode != 0 and "NOPE" in unknown.stderr and "Traceback" not in unknown.stderr
    assert lake.events() == before
    lake.cli("run", *ARGS)
    assert len(api.runs_of(int(JOB))) == 2


@pytest.mark.slow
def test_a_crash_after_the_retry_is_recorded_still_runs_it_exactly_once(tmp_path, api):
    lake = failed_job(tmp_path, api)
    lake.cli("retry", "--job-id", JOB)
    crashed = lake.cli("run", *ARGS, check=False, env={"HEARTBEAT_CRASH_AT": FaultPoint.AFTER_RETRY_REQUESTED.value})
    assert crashed.returncode == CRASH_EXIT_CODE  # it died after recording the retry, before calling the API
    assert len(api.runs_of(int(JOB))) == 1
    for _ in range(3):
        lake.cli("run", *ARGS)
    runs = api.runs_of(int(JOB))
    assert len(runs) == 2 and runs[1].token != runs[0].token
    assert len({e["idempotency_token"] for e in lake.events("RETRY_REQUESTED")}) == 1


@pytest.mark.slow
def test_two_runners_ticking_at_once_run_the_retry_once(tmp_path, api):
    lake = failed_job(tmp_path, api)
    lake.cli("retry", "--job-id", JOB)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(lake.cli, "run", *ARGS, "--wait-lease", "120") for _ in range(2)]:
            done.result()
    lake.cli("run", *ARGS)
    assert len(api.runs_of(int(JOB))) == 2


# -- trigger: a manual run now --------------------------------------------------------------------

def waiting_job(tmp_path, api: JobsApiServer) -> CliLakehouse:
    """Job 101 reads up.orders (hard) and a trigger file (hard): new orders arrived, the file did not,
    so the dependency rule keeps it waiting."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.orders", JOB), row("trigger_file", "drop", JOB)]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", JOB),
                        env={"DATABRICKS_HOST": api.host, "DATABRICKS_TOKEN": TOKEN,
                             "HEARTBEAT_DATABRICKS_RETRY_TIMEOUT": "10"})
    lake.home.mkdir(parents=True)
    lake.append_ids("up.orders", 1)
    lake.cli("seed")
    lake.cli("run", *ARGS)  # baseline
    lake.append_ids("up.orders", 2)
    lake.cli("run", *ARGS)
    assert api.runs_of(int(JOB)) == [] and "NEW_EVENT_AVAILABLE" in statuses(lake)
    return lake


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_trigger_runs_a_waiting_job_once_over_what_is_pending_and_refuses_a_running_or_failed_one(tmp_path, api):
    lake = waiting_job(tmp_path, api)
    asked = lake.cli("trigger", "--job-id", JOB, "--reason", "month-end close")
    assert "manual run asked" in asked.stdout
    lake.cli("trigger", "--job-id", JOB)  # asked twice before the tick: still one run
    assert "manual run asked by" in lake.cli("explain", "--job-id", JOB).stdout

    lake.cli("run", *ARGS)
    lake.cli("run", *ARGS)
    (run,) = api.runs_of(int(JOB))
    windows = json.loads(run.parameters["heartbeat_windows"])
    assert [(w["sensor_source"], w["sensor_id"]) for w in windows] == [("delta_table", "up.orders")]  # the pending orders, not the missing file
    (request,) = lake.events("TRIGGER_REQUESTED")
    assert request["message"].startswith("manual run asked by") and "consumes 1 pending event" in request["message"]
    api.finish_run(run.run_id, "SUCCESS")
    lake.cli("run", *ARGS)
    assert statuses(lake) == {"COMPLETED"}
    assert "manual run asked" not in lake.cli("explain", "--job-id", JOB).stdout

    lake.cli("trigger", "--job-id", JOB)  # nothing pending now: a run over nothing new, with a token of its own
    lake.cli("run", *ARGS)
    first, second = api.runs_of(int(JOB))
    assert json.loads(second.parameters["heartbeat_windows"]) == [] and second.token != first.token
    assert "nothing new pending" in lake.events("TRIGGER_REQUESTED")[-1]["message"]

    before = lake.events()  # that run is going: refused, nothing changes
    running = lake.cli("trigger", "--job-id", JOB, check=False)
    assert running.returncode != 0 and f"job {JOB} is running" in running.stderr and "Traceback" not in running.stderr
    assert lake.events() == before
    api.finish_run(second.run_id, "FAILED", "boom")  # failed: refused too, pointing at retry
    lake.cli("run", *ARGS)
    before = lake.events()
    failed = lake.cli("trigger", "--job-id", JOB, check=False)
    assert failed.returncode != 0 and f"retry --job-id {JOB}" in failed.stderr
    assert lake.events() == before


@pytest.mark.slow
def test_a_crash_after_the_manual_run_is_recorded_still_runs_it_exactly_once(tmp_path, api):
    lake = waiting_job(tmp_path, api)
    lake.cli("trigger", "--job-id", JOB)
    crashed = lake.cli("run", *ARGS, check=False, env={"HEARTBEAT_CRASH_AT": FaultPoint.AFTER_TRIGGER_REQUESTED.value})
    assert crashed.returncode == CRASH_EXIT_CODE and api.runs_of(int(JOB)) == []
    with ThreadPoolExecutor(max_workers=2) as pool:  # and two runners at once after it
        for done in [pool.submit(lake.cli, "run", *ARGS, "--wait-lease", "120") for _ in range(2)]:
            done.result()
    lake.cli("run", *ARGS)
    assert len(api.runs_of(int(JOB))) == 1
    assert len({e["idempotency_token"] for e in lake.events("TRIGGER_REQUESTED")}) == 1
