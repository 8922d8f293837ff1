"""The status lifecycle and the dependency rule, end to end on the embedded lakehouse."""

import pytest
from harness import config_row as row
from harness import sense_and_record

#: the lifecycle on both Spark shapes; the dependency rule and pausing on Sail and Spark classic (a Spark
#: test costs ~1-2 min, see docs/engines.md for what runs where)
ALL = pytest.mark.engines
CLASSIC = pytest.mark.engines("sail", "spark-classic")


@ALL
def test_full_lifecycle_null_new_event_in_progress_completed(hb):
    hb.create_table("sales.orders", "id int, amount double")
    hb.insert("sales.orders", "(1, 10.0)")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "sales.orders", "J1"))
    assert hb.job_status("J1") == {None}

    first = hb.tick()  # baseline: existing rows are not replayed
    assert [s.outcome.value for s in first.sensed] == ["NO_NEW_DATA"]
    assert hb.job_status("J1") == {None}

    hb.insert("sales.orders", "(2, 20.0)")
    # Stop before triggering to observe NEW_EVENT_AVAILABLE: sense and build only.
    sense_and_record(hb)
    assert hb.job_status("J1") == {"NEW_EVENT_AVAILABLE"}

    result = hb.tick()
    assert result.triggered_job_ids == ["J1"]
    (control,) = hb.rows("J1")
    assert control["status"] == "IN_PROGRESS"
    assert control["job_start_timestamp"] is not None and control["job_end_timestamp"] is None
    assert control["job_run_id"] == result.triggered[0].run_id

    hb.wait_for_jobs()
    (control,) = hb.rows("J1")
    assert control["status"] == "COMPLETED"
    assert control["job_end_timestamp"] >= control["job_start_timestamp"]
    assert control["latest_event_fetched_timestamp"] is not None
    assert hb.runs_of("J1") == 1


def test_a_run_ended_by_its_own_complete_shows_its_duration(hb):
    """A job whose last task is `complete` (no exit code of its own is reconciled): the run's row in
    heartbeat_job_runs (the status page, `runs --json`, `explain --json`) has its start (the jobs API's answer) and
    its end (the `complete` record) and so a duration. Before, both were recorded but the duration was "unknown"."""
    import sys

    from heartbeat_runner.core.records import EventType
    from heartbeat_runner.interfaces.operations import job_runs, record_job_event

    hb.create_table("sales.orders", "id int")
    hb.jobs_path.write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'import time; time.sleep(300)']\n")
    hb.seed(row("delta_table", "sales.orders", "J1"))
    hb.tick()
    hb.insert("sales.orders", "(1)")
    (started,) = hb.tick().triggered
    record_job_event(hb.app, "J1", EventType.COMPLETED, job_run_id=started.run_id)  # what `complete` records
    hb.app.control.refresh()
    (run,) = job_runs(hb.app.store)
    assert run["outcome"] == "COMPLETED" and run["started_at"] is not None and run["ended_at"] is not None
    assert run["duration_s"] is not None and run["duration_s"] >= 0
    hb.app.jobs_backend().cancel_run("J1", started.run_id)


def test_scenario_a_two_hard_dependencies_both_needed(hb):
    for name in ("up.j1", "up.j2"):
        hb.create_table(name, "id int")
    hb.jobs(J3=0)
    hb.seed(row("delta_table", "up.j1", "J3"), row("delta_table", "up.j2", "J3"))
    hb.tick()
    hb.insert("up.j1", "(1)")
    assert hb.tick().triggered == []
    assert hb.status()[("delta_table", "up.j1", "J3")] == "NEW_EVENT_AVAILABLE"
    assert hb.status()[("delta_table", "up.j2", "J3")] is None
    hb.insert("up.j2", "(1)")
    assert hb.tick().triggered_job_ids == ["J3"]
    hb.wait_for_jobs()
    assert hb.runs_of("J3") == 1


@CLASSIC
def test_scenario_b_hard_plus_soft_hard_alone_suffices_soft_never_alone(hb):
    for name in ("up.j1", "up.j2"):
        hb.create_table(name, "id int")
    hb.jobs(J3=0)
    hb.seed(row("delta_table", "up.j1", "J3", hard="TRUE"), row("delta_table", "up.j2", "J3", hard="false "))
    hb.tick()
    hb.insert("up.j2", "(1)")  # soft only: never triggers alone
    assert hb.tick().triggered == []
    assert hb.status()[("delta_table", "up.j2", "J3")] == "NEW_EVENT_AVAILABLE"
    hb.insert("up.j1", "(1)")  # the hard one arrives: triggers, consuming the soft data too
    result = hb.tick()
    assert result.triggered_job_ids == ["J3"]
    hb.wait_for_jobs()
    assert set(hb.status().values()) == {"COMPLETED"}
    # The soft row's data was consumed by that run: no second trigger.
    assert hb.tick().triggered == []
    assert hb.runs_of("J3") == 1


def test_paused_job_is_neither_sensed_nor_triggered(hb):
    hb.create_table("up.t", "id int")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "up.t", "J1", state="PAUSED"))
    result = hb.tick()
    assert result.sensed == []
    hb.insert("up.t", "(1)")
    assert hb.tick().sensed == [] and hb.events("NEW_DATA") == []
    assert hb.runs_of("J1") == 0


def test_pause_and_resume_from_the_cli_events(hb):
    from heartbeat_runner.core.records import Event, EventType, utcnow

    hb.create_table("up.t", "id int")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "up.t", "J1"))
    hb.tick()
    hb.app.store.append_events([Event(EventType.JOB_PAUSED, "test", utcnow(), trigger_job_id="J1")])
    hb.insert("up.t", "(1)")
    assert hb.tick().triggered == []
    assert {r["job_state"] for r in hb.rows("J1")} == {"PAUSED"}
    hb.app.store.append_events([Event(EventType.JOB_RESUMED, "test", utcnow(), trigger_job_id="J1")])
    result = hb.tick()  # resumed: the data that arrived while paused is sensed and triggers
    assert result.triggered_job_ids == ["J1"]


def test_new_event_available_rows_are_not_sensed_again(hb):
    for name in ("up.a", "up.b"):
        hb.create_table(name, "id int")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "up.a", "J1"), row("delta_table", "up.b", "J1"))
    hb.tick()
    hb.insert("up.a", "(1)")
    hb.tick()
    sensed = {s.target.sensor_id for s in hb.tick().sensed}
    assert sensed == {"up.b"}  # up.a waits as NEW_EVENT_AVAILABLE and is not read again
    assert len(hb.events("NEW_DATA")) == 1


def test_no_new_data_no_event(hb):
    hb.create_table("up.t", "id int")
    hb.insert("up.t", "(1)")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "up.t", "J1"))
    for _ in range(3):
        result = hb.tick()
        assert [s.outcome.value for s in result.sensed] == ["NO_NEW_DATA"]
    assert hb.events("NEW_DATA") == []
    assert hb.runs_of("J1") == 0


@CLASSIC  # Connect reads the same folders; one Spark leg keeps CI's time
def test_a_tick_that_finds_nothing_new_sends_no_sql_to_the_engine(hb):
    """Heartbeat's views read only its own Delta tables, so while none of them has a new version a view
    gives the rows it gave before: such a tick sends the engine no statement (on Sail and on local Spark,
    both read table versions from the ``_delta_log`` folders), and a change is seen at once."""
    hb.create_table("up.t", "id int")
    hb.insert("up.t", "(1)")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "up.t", "J1"))
    hb.tick()  # baseline
    hb.tick()  # reads each view once more: the baseline's report wrote to the tables they read
    for _ in range(2):
        quiet = hb.tick()
        assert quiet.is_idle and quiet.sql_parses == 0, quiet.sql_parses
    hb.insert("up.t", "(2)")
    busy = hb.tick()
    assert busy.triggered_job_ids == ["J1"] and busy.sql_parses > 0


def test_the_runner_reads_operators_asks_only_after_another_process_wrote_and_runs_each_ask(hb):
    """A manual-run ask is an event only another process records (`trigger`, the page); the runner's own
    commits (new data, its requests, finished runs) cannot add one. So once the asks were read empty the
    runner's busy ticks skip that read (on Spark a job over the events, ~1 s), and an ask recorded in
    between is still run at the next tick."""
    from heartbeat_runner.interfaces.operations import ask_trigger

    store = hb.app.store
    reads: list[int] = []
    trigger_asks = store.trigger_asks
    store.trigger_asks = lambda: reads.append(1) or trigger_asks()
    hb.create_table("up.t", "id int")
    hb.jobs(J1=0, J2=0)
    hb.seed(row("delta_table", "up.t", "J1"), row("delta_table", "up.t", "J2"))
    hb.tick()  # baseline
    hb.insert("up.t", "(1)")
    assert sorted(hb.tick().triggered_job_ids) == ["J1", "J2"]
    hb.wait_for_jobs()  # ticks that record the runs' ends
    assert len(reads) == 1, "the runner's own commits made it read the asks again"

    ask_trigger(hb.app, "J2", by="ops")
    assert hb.tick().triggered_job_ids == ["J2"]
    assert len(reads) == 2
    hb.wait_for_jobs()
    assert hb.runs_of("J2") == 2 and hb.runs_of("J1") == 1


def test_failed_job_is_not_retriggered_until_a_successful_run(hb):
    hb.create_table("up.t", "id int")
    hb.jobs(J1=1)  # this job fails
    hb.seed(row("delta_table", "up.t", "J1"))
    hb.tick()
    hb.insert("up.t", "(1)")
    hb.tick()
    hb.wait_for_jobs()
    (failed,) = hb.rows("J1")
    assert failed["status"] == "FAILED" and "exit code 1" in failed["last_error"]
    hb.insert("up.t", "(2)")
    for _ in range(2):
        result = hb.tick()
        assert result.triggered == [] and result.sensed == []
    assert hb.runs_of("J1") == 1
    # A successful run is recorded (the job's final task, or `complete` after a manual run).
    from heartbeat_runner.core.records import Event, EventType, utcnow

    hb.app.store.append_events([Event(EventType.COMPLETED, "manual", utcnow(), trigger_job_id="J1")])
    hb.jobs(J1=0)
    hb.tick()  # sensed again: finds the data that arrived after the failed run
    hb.tick()
    hb.wait_for_jobs()
    assert hb.runs_of("J1") == 2
    assert hb.job_status("J1") == {"COMPLETED"}
