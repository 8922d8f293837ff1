"""Operator commands: explain, reset, runs (the run report) and the config-removal guard."""

from __future__ import annotations

import json

import pytest
from harness import CliLakehouse, sense_and_record, wait_for
from harness import config_row as row

from heartbeat_runner.core.records import Event, EventType, utcnow
from heartbeat_runner.interfaces.operations import explain, plan_reset, recent_runs, run_details


def explained(hb, job: str):
    hb.app.control.refresh()
    return explain(hb.app.store, job)


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_explain_names_the_reason_for_each_state(hb):
    for name in ("up.a", "up.b", "up.d"):
        hb.create_table(name, "id int")
    hb.jobs(J1=0, J3=1, J4=0)
    rows = [row("delta_table", "up.a", "J1"), row("delta_table", "up.b", "J1"),
            row("delta_table", "up.a", "J2", state="PAUSED"), row("delta_table", "up.d", "J3"),
            row("trigger_file", "drop4", "J4"), row("delta_table", "up.missing", "J5")]
    hb.seed(*rows)
    hb.tick()
    hb.insert("up.a", "(1)")
    hb.insert("up.d", "(1)")
    hb.drop_trigger_file("drop4", "a.done")
    hb.tick()

    j1 = explained(hb, "J1")
    assert j1.verdict == "waiting for new data on hard dependency delta_table:up.b"
    assert {r["sensor_id"]: (r["dependency"], r["row_state"]) for r in j1.rows} == \
        {"up.a": ("hard", "new data (1 event(s))"), "up.b": ("hard", "no new data yet")}
    assert explained(hb, "J2").verdict == "paused: not sensed or triggered until resumed"
    (running,) = hb.rows("J4")
    assert explained(hb, "J4").verdict == \
        f"already running (run {running['job_run_id']}): not triggered again until it finishes"
    j5 = explained(hb, "J5")
    assert j5.verdict == ("waiting for new data on hard dependency delta_table:up.missing "
                          "(sensing failed: SourceError: Delta table 'up.missing' not found)")
    assert j5.rows[0]["last_outcome"] == "ERROR"
    hb.app.store.append_events([Event(EventType.TRIGGER_REQUESTED, "t", utcnow(), trigger_job_id="J2",
                                      idempotency_token="tok")])  # a tick died before the jobs API answered
    assert explained(hb, "J2").verdict.startswith("paused")  # paused comes first
    hb.app.store.append_events([Event(EventType.JOB_RESUMED, "t", utcnow(), trigger_job_id="J2")])
    assert explained(hb, "J2").verdict == ("trigger requested, no run id yet: the next tick asks the jobs API "
                                           "again (same idempotency token)")
    hb.app.store.append_events([Event(EventType.JOB_PAUSED, "t", utcnow(), trigger_job_id="J2")])

    hb.wait_for_jobs()  # J3's job exits 1
    j3 = explained(hb, "J3")
    assert j3.verdict.startswith("blocked by failure: exit code 1; output in ")
    assert j3.verdict.endswith("; waits for a successful run")

    hb.insert("up.b", "(1)")
    sense_and_record(hb)  # sensed, not triggered yet
    j1 = explained(hb, "J1")
    assert (j1.verdict, j1.is_ready) == ("ready: triggers at the next tick", True)
    assert hb.tick().triggered_job_ids == ["J1"]  # the runner agrees

    hb.seed(*[r for r in rows if ",J2," not in r])  # J2 removed from the config
    j2 = explained(hb, "J2")
    assert j2.verdict == "not active: every row of this job is retired"
    assert j2.rows[0]["row_state"] == "retired: no longer in the config, ignored"


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_reset_replays_from_a_point_in_time_and_retriggers_the_jobs_sharing_the_source(hb):
    hb.create_table("up.t", "id int")  # version 0
    hb.jobs(J1=0, J2=0)
    hb.seed(row("delta_table", "up.t", "J1"), row("delta_table", "up.t", "J2"))
    hb.tick()
    for value in (1, 2):  # versions 1 and 2, each processed by both jobs
        hb.insert("up.t", f"({value})")
        hb.tick()
        hb.wait_for_jobs()
        if value == 1:
            since = utcnow()

    lake = CliLakehouse(hb.home, config=hb.config_path, jobs_file=hb.jobs_path)
    out = lake.cli("reset", "--job-id", "J1", "--since", since.isoformat(), "--reason", "bad join fixed").stdout
    assert 'delta_table:up.t: cursor {"version":2} -> {"version":1}' in out
    assert "also re-triggered, as they read the same sources: J2" in out
    (audit,) = [e for e in hb.events("RESET") if e["trigger_job_id"] == "J1"]
    assert audit["message"] == "bad join fixed" and json.loads(audit["payload"])["by"]

    assert sorted(hb.tick().triggered_job_ids) == ["J1", "J2"]
    replay = hb.events("NEW_DATA")[-1]
    assert (replay["window_from"], replay["window_to"]) == ("version 2", "version 2")
    hb.wait_for_jobs()
    assert (hb.runs_of("J1"), hb.runs_of("J2")) == (3, 3)

    plan = plan_reset(hb.app.store, "J1", None, "full reload")  # from the beginning
    hb.app.store.append_events(plan.events())
    assert sorted(hb.tick().triggered_job_ids) == ["J1", "J2"]
    replay = hb.events("NEW_DATA")[-1]
    assert (replay["window_from"], replay["window_to"]) == ("version 0", "version 2")
    hb.wait_for_jobs()
    assert hb.job_status("J1") == {"COMPLETED"} and hb.runs_of("J1") == 4


def test_reset_of_a_running_job_is_refused_unless_forced_which_cancels_the_run(hb):
    """J1's run is going (a sleeping process). ``reset`` refuses (exit 1, says it is running and names the run,
    nothing recorded, the row stays IN_PROGRESS); ``reset --force`` cancels the run first (its process group
    ends), then resets. Before, the row left IN_PROGRESS and nothing watched the old run: a later tick could
    start a second run beside it."""
    import sys

    from heartbeat_runner.jobs.base import RunOutcome

    hb.create_table("up.t", "id int")
    hb.jobs_path.write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'import time; time.sleep(300)']\n")
    hb.seed(row("delta_table", "up.t", "J1"))
    hb.tick()
    hb.insert("up.t", "(1)")
    (started,) = hb.tick().triggered
    lake = CliLakehouse(hb.home, config=hb.config_path, jobs_file=hb.jobs_path)
    backend = hb.app.jobs_backend()
    wait_for(lambda: backend.run_status("J1", started.run_id).outcome is RunOutcome.RUNNING, 30, "the run to start")

    refused = lake.cli("reset", "--job-id", "J1", "--reason", "redo", check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"job J1 is running (run {started.run_id})" in refused.stderr and "--force" in refused.stderr
    assert not hb.events("RESET") and hb.job_status("J1") == {"IN_PROGRESS"}

    forced = lake.cli("reset", "--job-id", "J1", "--reason", "redo", "--force").stdout
    assert f"run {started.run_id} of this job was still going: cancelled" in forced
    wait_for(lambda: backend.run_status("J1", started.run_id).outcome is not RunOutcome.RUNNING, 30,
             "the cancelled run to end")
    assert [e["trigger_job_id"] for e in hb.events("RESET") if e["trigger_job_id"]] == ["J1"]


def test_a_shared_source_is_sensed_for_its_eligible_jobs_and_skipped_only_when_no_job_asks_for_it(hb):
    """One read plans the tick (heartbeat_sensor_plan): a source shared by an eligible and a paused job is
    sensed for the eligible one alone; a source no job asks for is skipped with every job's reason; the
    views heartbeat_sensors_due and heartbeat_sensors_skipped are the plan's two halves."""
    hb.create_table("up.a", "id int")
    hb.create_table("up.b", "id int")
    hb.seed(row("delta_table", "up.a", "J1"), row("delta_table", "up.a", "J2", state="PAUSED"),
            row("delta_table", "up.b", "J3", state="PAUSED"), row("delta_table", "up.b", "J4", state="PAUSED"))
    hb.tick()

    due = hb.app.store.sensors_due()
    skipped = hb.app.store.sensors_skipped()

    assert [(target.source_key, jobs) for target, jobs in due] == [("delta_table:up.a", "J1")]
    assert due[0][0].cursor is not None  # the baseline the first tick recorded
    assert [(s.source_key, s.trigger_job_ids, s.reason) for s in skipped] == \
        [("delta_table:up.b", "J3,J4", "J3 paused; J4 paused")]
    assert [r["source_key"] for r in hb.app.store.read("heartbeat_sensors_due")] == ["delta_table:up.a"]
    assert [(r["source_key"], r["reason"]) for r in hb.app.store.read("heartbeat_sensors_skipped")] == \
        [("delta_table:up.b", "J3 paused; J4 paused")]


def test_run_report_lists_skipped_sources_with_the_reason_and_runs_shows_counts(hb):
    hb.create_table("up.a", "id int")
    hb.create_table("up.b", "id int")
    hb.seed(row("delta_table", "up.a", "J1"), row("delta_table", "up.b", "J2", state="PAUSED"))
    tick = hb.tick()
    (run,) = recent_runs(hb.app.store, 5)
    assert (run["run_id"], run["status"], run["sources_sensed"], run["sources_skipped"]) == (tick.run_id, "OK", 1, 1)
    _, report = run_details(hb.app.store, tick.run_id)
    assert {(r["source_key"], r["outcome"], r["error"]) for r in report} == \
        {("delta_table:up.a", "NO_NEW_DATA", None), ("delta_table:up.b", "SKIPPED", "J2 paused")}

    # a tick that wrote events and then died shows as INCOMPLETE
    hb.app.store.append_events([Event(EventType.TRIGGER_ERROR, "20260101T000000-0badc0de", utcnow(),
                                      trigger_job_id="J9", message="x")])
    lake = CliLakehouse(hb.home, config=hb.config_path, jobs_file=hb.jobs_path)
    runs = json.loads(lake.cli("runs", "--json").stdout)
    assert [(r["run_id"], r["status"]) for r in runs] == [("20260101T000000-0badc0de", "INCOMPLETE"), (tick.run_id, "OK")]
    assert runs[0]["message"] == "1 event(s) written, then the runner stopped before the end of the tick"
    detail = lake.cli("runs", "--run-id", tick.run_id).stdout
    assert "SKIPPED" in detail and "J2 paused" in detail


def test_seed_refuses_to_retire_most_rows_unless_allowed_and_checks_columns(tmp_path):
    config = tmp_path / "cfg.csv"
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=tmp_path / "jobs.yml")
    lake.home.mkdir()
    header = "sensor_source,sensor_id,trigger_job_id\n"  # optional columns missing: defaults are used
    config.write_text(header + "".join(f"delta_table,db.t{i},J{i}\n" for i in range(4)))
    loaded = lake.cli("seed").stdout
    assert "loaded 4 row(s)" in loaded and "defaults used: sensor_read_type, asset_description" in loaded

    config.write_text("sensor_source,sensor_id,trigger_job_id,colour\ndelta_table,db.t0,J0,red\n")
    unknown = lake.cli("seed", check=False)
    assert unknown.returncode == 1 and "unknown column(s) 'colour'" in unknown.stderr

    for truncated in ("", "delta_table,db.t0,J0\n"):  # empty, or 1 of 4 rows left
        config.write_text(header + truncated)
        refused = lake.cli("seed", check=False)
        assert refused.returncode == 1 and "active rows" in refused.stderr
        assert "delta_table:db.t1 -> job J1" in refused.stderr and "--allow-removals" in refused.stderr
    assert "would retire 3 of 4 active rows (75%, more than the 50% allowed)" in refused.stderr
    assert len(json.loads(lake.cli("status", "--json").stdout)) == 4  # nothing was changed

    allowed = lake.cli("seed", "--allow-removals").stdout
    assert "retired: delta_table:db.t3 -> job J3" in allowed
    assert [r["sensor_id"] for r in json.loads(lake.cli("status", "--json").stdout)] == ["db.t0"]
