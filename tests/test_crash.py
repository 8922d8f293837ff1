"""Crash safety: a runner killed at any step boundary of a tick loses no event, triggers no job
twice and ends in the same control-table state as a runner that never crashed; for the local
jobs backend and for Databricks Jobs (the stateful stand-in server and the real SDK).

Each scenario copies one seeded lakehouse, adds upstream data, runs
``python -m heartbeat_runner run`` with ``HEARTBEAT_CRASH_AT=<point>`` (the process dies
there with exit code faults.CRASH_EXIT_CODE), then normal ticks (in the test's process, as the
suite runs one-shot commands: tests/cli_runner.py). The scenarios of a backend run one after the
other and are compared with a crash-free run of the same steps.

Also: a trigger the jobs API refused, retried with the same token once fixed, runs once.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from databricks_jobs_server import TOKEN, JobsApiServer
from harness import HEADER, CliLakehouse, marker_jobs_file
from harness import config_row as row

from heartbeat_runner.core.faults import CRASH_EXIT_CODE, CRASH_POINTS, FaultPoint

JOBS = ("101", "102")
NO_CRASH = "none"
#: the points where a jobs backend is in play: from the trigger request on. Before it (sensing, the new
#: data's commit, the control build) nothing calls a backend, so those crashes are run on the local one
#: alone; the Databricks reference run (no crash) still triggers and reconciles through its API.
BACKEND_POINTS = CRASH_POINTS[CRASH_POINTS.index(FaultPoint.AFTER_TRIGGER_REQUESTED):]
POINTS = {"local": CRASH_POINTS, "databricks": BACKEND_POINTS}


@dataclass
class Outcome:
    """What a scenario left behind."""

    crash_exit: int
    runs_at_backend: dict[str, int]
    control: set[tuple]
    new_data_events: dict[str, int]
    trigger_tokens: dict[str, int]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A seeded lakehouse after its baseline tick: 101 reads up.orders; 102 reads it too, plus a soft trigger file."""
    root = tmp_path_factory.mktemp("crash")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.orders", "101"), row("delta_table", "up.orders", "102"),
                                 row("trigger_file", "drop", "102", hard="FALSE")]) + "\n")
    jobs = marker_jobs_file(root / "jobs.yml", *JOBS)
    lake = CliLakehouse(root / "template" / "lakehouse", config=config, jobs_file=jobs)
    lake.home.mkdir(parents=True)
    lake.append_ids("up.orders", 1)
    lake.cli("seed")
    lake.cli("run")  # baseline: new sensors start at the current end
    return lake.home, config, jobs


def scenario(template: tuple[Path, Path, Path], backend: str, point: str, server: JobsApiServer | None) -> Outcome:
    """Crash at ``point`` (or not), then tick until every job finished; report what happened."""
    home, config, jobs = template
    target = home.parent.parent / f"{backend}-{point}" / "lakehouse"
    shutil.copytree(home, target)
    env, args = {}, []
    if server is not None:
        env = {"DATABRICKS_HOST": server.host, "DATABRICKS_TOKEN": TOKEN, "HEARTBEAT_DATABRICKS_RETRY_TIMEOUT": "10"}
        args = ["--jobs-backend", "databricks"]
        for job in JOBS:
            server.add_job(f"job_{job}", job_id=int(job))
    lake = CliLakehouse(target, config=config, jobs_file=jobs, env=env)
    lake.append_ids("up.orders", 2)
    lake.drop_trigger_file("drop", "batch-1.done")

    crashed = lake.cli("run", *args, check=False, env={"HEARTBEAT_CRASH_AT": point})
    # Normal ticks from here: the first recovers (rebuilds, resumes trigger requests) and the
    # next reconciles. On a loaded machine a tick may fail transiently (it changes nothing
    # then), so tick until the state settles, a bounded number of times.
    for _ in range(5):
        lake.cli("run", *args, check=False)
        settle(lake, server)
        lake.cli("run", *args)
        if {row[3] for row in lake.control()} == {"COMPLETED"}:
            break

    if server is not None:
        runs = {job: len(server.runs_of(int(job))) for job in JOBS}
    else:
        runs = lake.executions()
    new_data = lake.events("NEW_DATA")
    requests = lake.events("TRIGGER_REQUESTED")
    return Outcome(
        crash_exit=crashed.returncode,
        runs_at_backend=runs,
        control=lake.control(),
        new_data_events={key: sum(1 for e in new_data if e["source_key"] == key) for key in {e["source_key"] for e in new_data}},
        trigger_tokens={job: len({e["idempotency_token"] for e in requests if e["trigger_job_id"] == job}) for job in JOBS},
    )


def settle(lake: CliLakehouse, server: JobsApiServer | None) -> None:
    """Let every triggered run finish successfully."""
    if server is None:
        lake.wait_local_runs()
        return
    for run in list(server.runs.values()):
        if run.lifecycle != "TERMINATED":
            server.finish_run(run.run_id, "SUCCESS")


class Scenarios:
    """Runs every crash point of a backend (one after the other) on first use, plus the crash-free reference."""

    def __init__(self, template: tuple[Path, Path, Path]):
        self.template = template
        self.done: dict[str, dict[str, Outcome]] = {}
        self.failed: dict[str, Exception] = {}

    def of(self, backend: str) -> dict[str, Outcome]:
        if backend in self.failed:  # each test of the backend says so, not that its folders exist
            raise AssertionError(f"the {backend} crash scenarios failed (first failing test)") from self.failed[backend]
        try:
            return self._of(backend)
        except Exception as exc:
            self.failed[backend] = exc
            raise

    def _of(self, backend: str) -> dict[str, Outcome]:
        if backend not in self.done:
            points = (NO_CRASH, *POINTS[backend])
            servers = {p: JobsApiServer() if backend == "databricks" else None for p in points}
            for server in filter(None, servers.values()):
                server.__enter__()
            try:
                # one after the other: only the killed command is a process then, the others run in this
                # process (tests/cli_runner.py); from threads every command would be a cold process (~2x the CPU)
                self.done[backend] = {p: scenario(self.template, backend, p, servers[p]) for p in points}
            finally:
                for server in filter(None, servers.values()):
                    server.__exit__(None, None, None)
        return self.done[backend]


@pytest.fixture(scope="module")
def scenarios(template) -> Scenarios:
    return Scenarios(template)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test of a backend runs all its scenarios (one per crash point)
@pytest.mark.parametrize(("backend", "point"), [(backend, point) for backend, points in POINTS.items() for point in points])
def test_a_crash_at_any_step_loses_nothing_and_triggers_nothing_twice(scenarios, backend, point):
    outcomes = scenarios.of(backend)
    reference, crashed = outcomes[NO_CRASH], outcomes[point]
    assert reference.crash_exit == 0
    assert reference.runs_at_backend == {"101": 1, "102": 1}
    assert {status for (*_, status, _, _, _) in reference.control} == {"COMPLETED"}

    assert crashed.crash_exit == CRASH_EXIT_CODE  # it really died at that point
    assert crashed.runs_at_backend == reference.runs_at_backend  # each job ran exactly once
    assert crashed.control == reference.control  # the same end state
    assert crashed.new_data_events == reference.new_data_events == {"delta_table:up.orders": 1, "trigger_file:drop": 1}
    assert crashed.trigger_tokens == {"101": 1, "102": 1}  # one trigger request per job, however often retried


def test_a_refused_trigger_retried_after_the_fix_runs_once_and_completes(hb):
    hb.create_table("up.t", "id int")
    hb.seed(row("delta_table", "up.t", "J1"))  # J1 is not in the jobs file yet
    hb.tick()
    hb.insert("up.t", "(1)")
    refused = hb.tick()
    assert "not defined" in refused.trigger_errors[0].message
    assert hb.job_status("J1") == {"NEW_EVENT_AVAILABLE"}  # the request is void; the data still waits
    hb.jobs(J1=0)
    assert hb.tick().triggered_job_ids == ["J1"]  # same token as the refused request
    hb.wait_for_jobs()
    assert hb.job_status("J1") == {"COMPLETED"} and hb.runs_of("J1") == 1
    assert hb.tick().triggered == []
