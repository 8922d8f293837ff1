"""A tick folds its new data and its trigger requests into the control table instead of deriving every row
again (macros/heartbeat_folds.sql, lakehouse/control_table.py Appended), and merges the sensor state table
without a dbt command (macros/heartbeat_sensor_state.sql). What `status`, the page, followers and the next tick
read must be exactly what a build from all the events gives: each folded table is compared with one."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from harness import HEADER, CliLakehouse, Harness, marker_jobs_file, project_copy, wait_for
from harness import config_row as row
from prometheus_client.parser import text_string_to_metric_families

from heartbeat_runner.core.metrics import use_metrics
from heartbeat_runner.core.records import Event, EventType, JobStatus, utcnow
from heartbeat_runner.interfaces.operations import ask_trigger, record_job_event
from heartbeat_runner.lakehouse.control_table import FoldKind
from heartbeat_runner.runner.observability import count_tick


def control_table(hb) -> list[dict]:
    """Every row of the control table, retired ones too; updated_at says when a build touched the row."""
    rows = hb.app.store.read("heartbeat_control", order_by=["trigger_job_id", "sensor_source", "sensor_id"])
    return [{k: v for k, v in r.items() if k != "updated_at"} for r in rows]


def sensor_state(hb) -> list[dict]:
    """Every row of the sensor state table."""
    return hb.app.store.read("heartbeat_sensor_state", order_by=["sensor_id"])


def assert_as_derived(hb) -> None:
    """The control table as it is equals the one a build from all the events makes, and the sensor state
    table the runner merged without dbt equals the one dbt's build of the model makes."""
    folded, state = control_table(hb), sensor_state(hb)
    hb.app.control.refresh(force=True)
    assert control_table(hb) == folded
    assert sensor_state(hb) == state


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

    hb.wait_for_jobs()  # the ticks that record the runs ending fold them
    assert hb.job_status("J1") == {JobStatus.COMPLETED.value} and hb.job_status("J2") == {JobStatus.FAILED.value}

    ask_trigger(hb.app, "J1", by="test")  # a manual run over nothing new, asked by another process's commit
    hb.drop_trigger_file("e", "1.done")
    second = hb.tick()
    assert sorted(second.triggered_job_ids) == ["J1", "J3"]
    assert second.control_folded
    assert_as_derived(hb)


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


def _long_and_short_jobs(hb, **exit_codes: int) -> None:
    """``hb.jobs`` plus LONG, a job that runs until the file <root>/release appears (kept IN_PROGRESS)."""
    hb.jobs(**exit_codes)
    release = hb.root / "release"
    wait = f"import pathlib, time\nwhile not pathlib.Path({str(release)!r}).exists(): time.sleep(0.1)"
    with open(hb.jobs_path, "a") as jobs:
        jobs.write(f"  'LONG':\n    command: [{sys.executable!r}, '-c', {wait!r}]\n")


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_a_ticks_new_data_folds_into_what_a_full_build_derives_whatever_each_row_was(hb):
    """New data reaches rows in every state: never run, completed, failed, running (once and twice), already
    pending, soft rows, a source shared by several jobs, a Delta table with a version window; runs end,
    completed, failed, and completed with data that arrived while they ran. The control table each tick
    leaves (its new data folded in before triggering, then its requests and the runs that ended) is the
    one all the events derive."""
    _long_and_short_jobs(hb, OK=0, BAD=1, PAIR=0, SHARED=0)
    hb.create_table("up.orders", "id int")
    hb.seed(row("trigger_file", "w", "OK"), row("trigger_file", "y", "OK", hard="FALSE"),
            row("trigger_file", "x", "BAD"), row("trigger_file", "x", "LONG"),
            row("trigger_file", "y", "PAIR"), row("trigger_file", "z", "PAIR"),
            row("delta_table", "up.orders", "SHARED"), row("trigger_file", "x", "SHARED", hard="FALSE"))
    hb.tick()

    def settle(*jobs: str) -> None:
        """Tick until ``jobs`` ended; each tick that records a run's end folds it, into the derived table."""
        deadline = time.monotonic() + 60
        while any(hb.job_status(j) == {JobStatus.IN_PROGRESS.value} for j in jobs):
            assert time.monotonic() < deadline, f"{jobs} did not end"
            time.sleep(0.3)
            result = hb.tick()
            if result.completed or result.failed:
                assert result.control_folded, result.as_dict()
                assert_as_derived(hb)

    def folding_tick(*triggered: str):
        result = hb.tick()
        assert result.new_data_folded and sorted(result.triggered_job_ids) == sorted(triggered)
        assert_as_derived(hb)
        return result

    hb.drop_trigger_file("w", "1.done")
    hb.drop_trigger_file("x", "1.done")
    hb.insert("up.orders", "(1)")
    folding_tick("BAD", "LONG", "OK", "SHARED")
    settle("OK", "BAD", "SHARED")
    assert hb.job_status("BAD") == {JobStatus.FAILED.value} and hb.job_status("LONG") == {JobStatus.IN_PROGRESS.value}

    # x reaches a failed, a running and a completed soft row; y a completed soft row and a never-run one:
    # nothing can start (BAD failed, LONG runs, soft rows never trigger, PAIR lacks z)
    hb.drop_trigger_file("x", "2.done")
    hb.drop_trigger_file("y", "2.done")
    folding_tick()
    assert hb.job_status("PAIR") == {JobStatus.NEW_EVENT_AVAILABLE.value, None}

    # OK (w with its pending soft y), PAIR (z beside its pending y) and SHARED (a Delta window) start
    hb.drop_trigger_file("w", "3.done")
    hb.drop_trigger_file("z", "3.done")
    hb.insert("up.orders", "(2)")
    assert folding_tick("OK", "PAIR", "SHARED").control_folded  # the requests fold onto the folded new data
    settle("OK", "PAIR", "SHARED")

    # x again: the running and the failed job's rows already had data pending; now two events each
    hb.drop_trigger_file("x", "4.done")
    folding_tick()
    assert {r["trigger_job_id"]: r["pending_events"] for r in hb.rows() if r["sensor_id"] == "x"} == \
        {"BAD": 2, "LONG": 2, "SHARED": 1}

    # LONG ends with data that arrived while it ran: its row waits again, since the first of that data
    (hb.root / "release").touch()
    settle("LONG")
    assert hb.job_status("LONG") == {JobStatus.NEW_EVENT_AVAILABLE.value}
    hb.wait_for_jobs(timeout=60)


def test_new_data_recorded_beside_another_processs_commit_is_derived_not_folded(hb):
    """An operator's ask committed by another process between the tick's first refresh and its sensing
    append: the events moved by more than the tick's own commit, so the build derives every row."""
    hb.jobs(J1=0, J2=0)
    hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "b", "J2"))
    hb.tick()
    hb.drop_trigger_file("a", "1.done")
    original = hb.heartbeat.sensed_events

    def sensed_then_asked(result):
        ask_trigger(hb.app, "J2", by="another process")
        return original(result)

    hb.heartbeat.sensed_events = sensed_then_asked
    result = hb.tick()
    assert not result.new_data_folded
    assert sorted(result.triggered_job_ids) == ["J1", "J2"]
    assert_as_derived(hb)


def test_every_tick_of_a_loops_heartbeat_leaves_both_tables_current_and_runs_due_maintenance(tmp_path):
    """No tick leaves work to the next: the hurry, which left the sensor state table's merge, maintenance and an
    engine recycle to the next tick while a wake-up waited, is gone (issue 54's paired A/B: it cut the burst
    latency by less than the 20 % it had to show), and the heartbeat a loop builds takes no wake-up signal. Each
    of its ticks leaves the control and sensor state tables a build derives, and runs maintenance when it is due,
    whole (what `status`, the page, followers and the next tick read is current after every tick)."""
    from types import SimpleNamespace

    from heartbeat_runner.lakehouse.control_table import Scope
    from heartbeat_runner.runner.lease import tick_lease
    from heartbeat_runner.runner.loop import _heartbeat

    with Harness(tmp_path, HEARTBEAT_MAINTENANCE_MAX_FILES="3", HEARTBEAT_ARCHIVE_MARGIN_MINUTES="0",
                 HEARTBEAT_REPORT_KEEP_HOURS="0") as hb:
        hb.jobs(J1=0)
        hb.seed(row("trigger_file", "a", "J1"))
        maintained = []
        with tick_lease(hb.app.store).held() as lease, \
                _heartbeat(hb.app, lease, SimpleNamespace(progress=lambda _: None)) as loops:
            loops.tick()  # the baseline
            for step in range(6):
                hb.drop_trigger_file("a", f"{step}.done")
                result = loops.tick()
                assert result.triggered_job_ids == ["J1"] or result.completed, step
                assert hb.app.control.is_current(Scope.FULL), step
                assert_as_derived(hb)
                if result.maintenance is not None and result.maintenance.archived_events:
                    maintained.append(result.maintenance)
                wait_for(lambda: loops.tick().completed or "IN_PROGRESS" not in set(hb.status().values()), 30,
                         "J1's run to end")
    assert maintained and all(m.compacted for m in maintained), maintained


def test_maintenance_rebuilds_a_folded_row_that_drifted_from_its_derivation_and_says_which(hb, caplog):
    """A fold whose rule drifted from the model (here: a row's state written wrong behind the runner's back) is
    found by the next maintenance, which derives the table, repairs the row and names it; a correct table is left
    as it is (nothing repaired)."""
    hb.jobs(J1=0, J2=0)
    hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "b", "J2"))
    hb.tick()
    hb.drop_trigger_file("a", "1.done")
    hb.drop_trigger_file("b", "1.done")
    assert hb.tick().control_folded
    hb.wait_for_jobs()
    hb.drop_trigger_file("b", "2.done")
    assert hb.tick().control_folded  # J2 has new data pending: folded
    healthy = control_table(hb)

    assert hb.heartbeat.run_maintenance().repaired_rows == []  # the folds gave what the derivation gives
    assert control_table(hb) == healthy

    hb.drop_trigger_file("a", "2.done")
    assert hb.tick().control_folded  # J1 starts again: folded
    healthy = control_table(hb)
    name = hb.app.store.name("heartbeat_control")
    hb.spark.sql(f"UPDATE {name} SET status = 'FAILED', consecutive_failures = 7 WHERE trigger_job_id = 'J2'")
    caplog.set_level("WARNING", logger="heartbeat_runner.lakehouse.control_table")
    repaired = hb.heartbeat.run_maintenance().repaired_rows
    assert repaired == [("trigger_file", "b", "J2")]
    assert control_table(hb) == healthy
    assert "control row trigger_file/b/J2 differed from its derivation" in caplog.text
    assert hb.app.control.is_current()


def _project_whose_folds_rank_new_data_over_a_failure(root):
    """A copy of the dbt project whose folds, and only they, call a changed status rule: pending data outranks a
    failure (heartbeat_row_status with its FAILED and pending lines swapped, as heartbeat_mutant_row_status). The
    model still calls the rule as shipped. Built from the shipped files, so it follows them."""
    import re

    project = project_copy(root)
    rules = (project / "macros" / "heartbeat_row_rules.sql").read_text()
    rule = re.search(r"\{% macro heartbeat_row_status\(.*?\{%- endmacro %\}", rules, re.DOTALL)
    assert rule, "heartbeat_row_status is not in macros/heartbeat_row_rules.sql"
    failed, pending = "    when {{ lifecycle_event }} = 'FAILED' then 'FAILED'\n", \
        "    when {{ pending_events }} > 0 then 'NEW_EVENT_AVAILABLE'\n"
    assert failed + pending in rule.group(0)
    mutant = rule.group(0).replace(failed + pending, pending + failed).replace(
        "macro heartbeat_row_status(", "macro heartbeat_mutant_row_status(")
    (project / "macros" / "heartbeat_fold_mutant.sql").write_text(mutant + "\n")
    folds = project / "macros" / "heartbeat_folds.sql"
    text = folds.read_text()
    assert text.count("heartbeat_row_status(") >= len(FoldKind)  # each fold calls the rule (tests/test_row_rules.py)
    folds.write_text(text.replace("heartbeat_row_status(", "heartbeat_mutant_row_status("))
    assert "mutant" not in (project / "models" / "heartbeat_control.sql").read_text()
    return project


def test_a_status_rule_changed_in_the_folds_alone_is_caught_by_the_comparison_with_the_derivation(tmp_path):
    """The comparison of folded and derived tables (assert_as_derived, what every fold test here relies on) catches
    a rule that the fold path states differently from the model: with the folds' status rule ranking pending data
    over a failure, the folded table agrees with the derived one while the two rules agree (a start, a failure),
    and differs once they do not (new data for a failed job's soft row: the model says FAILED). The test fails if
    the comparison stops comparing (no AssertionError), or if the changed rule stops reaching the folds."""
    project = _project_whose_folds_rank_new_data_over_a_failure(tmp_path)
    with Harness(tmp_path, HEARTBEAT_PROJECT_DIR=str(project)) as hb:
        hb.jobs(BAD=1, OK=0)
        # y is sensed for OK's soft row (a failed job's rows alone are not sensed); OK waits for z, which never comes
        hb.seed(row("trigger_file", "x", "BAD"), row("trigger_file", "y", "BAD", hard="FALSE"),
                row("trigger_file", "z", "OK"), row("trigger_file", "y", "OK", hard="FALSE"))
        hb.tick()
        hb.drop_trigger_file("x", "1.done")
        started = hb.tick()
        assert started.triggered_job_ids == ["BAD"] and started.control_folded
        assert_as_derived(hb)  # both rules say NEW_EVENT_AVAILABLE, then IN_PROGRESS
        hb.wait_for_jobs()
        assert hb.job_status("BAD") == {JobStatus.FAILED.value}
        assert_as_derived(hb)  # nothing pending: both say FAILED

        hb.drop_trigger_file("y", "2.done")
        result = hb.tick()
        assert result.new_data_folded and result.triggered_job_ids == [], result.refresh_paths()

        def statuses() -> dict[tuple[str, str], str | None]:
            return {(r["trigger_job_id"], r["sensor_id"]): r["status"] for r in control_table(hb)}

        failed, waiting = JobStatus.FAILED.value, JobStatus.NEW_EVENT_AVAILABLE.value
        assert statuses() == {("BAD", "x"): failed, ("BAD", "y"): waiting,  # the folds' rule
                              ("OK", "y"): waiting, ("OK", "z"): None}
        with pytest.raises(AssertionError):
            assert_as_derived(hb)
        assert statuses() == {("BAD", "x"): failed, ("BAD", "y"): failed,  # the model's rule
                              ("OK", "y"): waiting, ("OK", "z"): None}


def test_the_row_digest_reads_every_column_of_the_control_table_but_the_write_time(hb):
    """A column added to the control model must be compared by maintenance's check of the folds too."""
    import re
    from pathlib import Path

    hb.seed(row("trigger_file", "a", "J1"))
    macros = (Path(__file__).resolve().parent.parent / "macros" / "heartbeat_folds.sql").read_text()
    digest = macros[macros.index("macro heartbeat_control_row_digests"):]
    named = set(re.findall(r"'([a-z_]+)', [a-z_]+", digest)) | {"sensor_source", "sensor_id", "trigger_job_id"}
    assert named == set(hb.app.engine.columns(hb.app.store.name("heartbeat_control"))) - {"updated_at"}


# -- which path each refresh took, where a user sees it -----------------------------------------------------------

def _refresh_counts(exposition: bytes) -> dict[tuple[str, str], float]:
    """heartbeat_control_refresh_total by (path, reason), as a scrape reads it."""
    return {(s.labels["path"], s.labels["reason"]): s.value for family in text_string_to_metric_families(
        exposition.decode()) if family.name == "heartbeat_control_refresh" for s in family.samples
        if s.name.endswith("_total")}


def test_a_ticks_refreshes_say_whether_they_folded_or_built_and_why_and_the_metric_counts_them(hb):
    """A tick's new data and the request it starts fold; a refused request makes the refresh after it build
    (not_foldable, naming the commit), and so does another process's ask (other_commits); the counter the loop
    keeps counts each refresh by path and reason."""
    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "x", "UNKNOWN"))
    hb.tick()
    hb.drop_trigger_file("a", "1.done")
    folded = hb.tick()
    assert folded.triggered_job_ids == ["J1"]
    assert folded.refresh_paths() == [{"path": "none"}, {"path": "fold"}, {"path": "fold"}]
    assert folded.as_dict()["control_refreshes"] == folded.refresh_paths()  # `run --json`
    hb.wait_for_jobs()

    hb.drop_trigger_file("x", "1.done")
    refused = hb.tick()
    assert [p.job_id for p in refused.trigger_errors] == ["UNKNOWN"]
    assert refused.refresh_paths()[1:] == [
        {"path": "fold"}, {"path": "build", "reason": "not_foldable", "detail": "TRIGGER_ERROR"}]
    ask_trigger(hb.app, "J1", by="another process")
    asked = hb.tick()
    assert asked.triggered_job_ids == ["J1"]
    assert asked.refresh_paths()[0] == {"path": "build", "reason": "other_commits"}
    assert_as_derived(hb)

    fresh = use_metrics()
    try:
        for result in (folded, refused, asked):
            count_tick(result, "local")
        counts = _refresh_counts(fresh.exposition())
    finally:
        use_metrics()
    made = Counter((r.path.value, r.reason.value if r.reason else "") for result in (folded, refused, asked)
                   for r in result.refreshes)
    assert counts == made and made[("fold", "")] >= 3 and made[("build", "other_commits")] == 1


def _ticks_of_a_day(lake: CliLakehouse) -> list[list[dict]]:
    """New data for both jobs, their runs ending, new data again, each through ``run``; every tick's
    ``control_refreshes`` in ``runs --json``, oldest first."""
    for folder in ("a", "b"):
        lake.drop_trigger_file(folder, "1.done")
    lake.cli("run")
    wait_for(lambda: lake.executions() == {"J1": 1, "J2": 1}, 60, "both jobs to run")
    lake.cli("run")  # records their ends
    lake.drop_trigger_file("a", "2.done")
    lake.cli("run")
    runs = json.loads(lake.cli("runs", "--json").stdout)
    return [run["control_refreshes"] for run in reversed(runs)]


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_with_folds_off_every_refresh_builds_and_the_control_table_is_the_folded_one(tmp_path):
    """The same ticks on two lakehouses, one with HEARTBEAT_FOLDS=off: there each refresh that has work builds
    (reason folds_off), here they fold; `runs --json` shows each tick's paths; both control tables end alike."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "a", "J1"), row("trigger_file", "b", "J2"),
                                 row("trigger_file", "b", "J1", hard="FALSE")]) + "\n")
    jobs = marker_jobs_file(tmp_path / "jobs.yml", "J1", "J2")
    lakes, ticks = {}, {}
    for folds in ("on", "off"):
        lake = lakes[folds] = CliLakehouse(tmp_path / folds / "lakehouse", config=config, jobs_file=jobs,
                                           env={"HEARTBEAT_FOLDS": folds})
        lake.home.mkdir(parents=True)
        lake.cli("seed")
        lake.cli("run")  # baseline
        ticks[folds] = _ticks_of_a_day(lake)

    on = [r for tick in ticks["on"] for r in tick]
    off = [r for tick in ticks["off"] for r in tick]
    assert {"path": "fold"} in on and all(r.get("reason") != "folds_off" for r in on)
    assert {r["path"] for r in off} == {"build", "none"} and {"path": "build", "reason": "folds_off"} in off
    assert all(r == {"path": "build", "reason": "folds_off"} for r in off if r["path"] == "build")
    assert lakes["on"].control() == lakes["off"].control()
    assert {(job, status) for _, _, job, status, *_ in lakes["on"].control()} == {
        ("J1", JobStatus.IN_PROGRESS.value), ("J2", JobStatus.COMPLETED.value)}


# -- random histories ---------------------------------------------------------------------------------------------

#: the seed of test_random_histories_fold_into_what_the_events_derive (HEARTBEAT_FOLD_HISTORY_SEED explores others)
HISTORY_SEED = 7  # its history retries a failed job that fails again, and folds every kind of commit
#: ticks of one history (each compared with a full build: ~3-5 s a tick on Sail)
HISTORY_TICKS = 8
#: how far the other writer's clock is off, ahead and behind by turns (the operators' machines)
OTHER_WRITER_SKEW = timedelta(minutes=2)


def _jobs_failing_on_a_flag(hb, *jobs: str) -> dict[str, object]:
    """Local jobs that fail while the file <root>/fail/<job> exists and succeed otherwise; the flag files by job."""
    hb.jobs(**{job: 0 for job in jobs})  # resets the harness's Heartbeat; the jobs file is written again below
    flags = {job: hb.root / "fail" / job for job in jobs}
    flags[jobs[0]].parent.mkdir(exist_ok=True)
    lines = ["jobs:"]
    for job, flag in flags.items():
        script = f"import pathlib, sys; sys.exit(1 if pathlib.Path({str(flag)!r}).exists() else 0)"
        lines += [f"  {job!r}:", f"    command: [{sys.executable!r}, '-c', {script!r}]"]
    hb.jobs_path.write_text("\n".join(lines) + "\n")
    return flags


@contextlib.contextmanager
def _from_a_skewed_clock(hb, monkeypatch, skew: timedelta) -> Iterator[None]:
    """A context in which the harness's events are written as by a process whose clock is ``skew`` off: each
    event's times are shifted before the store stamps it after what the table holds (as that process's would)."""
    store = hb.app.store
    append = store.append_events
    with monkeypatch.context() as patch:
        patch.setattr(store, "append_events", lambda events: append(
            [dataclasses.replace(e, event_ts=e.event_ts + skew, snapshot_ts=e.snapshot_ts + skew) for e in events]))
        yield


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_random_histories_fold_into_what_the_events_derive(hb, monkeypatch):
    """A seeded random history: each tick some of new trigger files on hard and soft sources shared by jobs, rows
    into an upstream Delta table, a job made to fail or succeed from now on, an operator's ask to run a job or to
    retry a failed one (another process's commit, from a clock two minutes ahead or behind by turns: refused asks
    are skipped). After every tick the control table as the folds left it equals the one derived from all the
    events (assert_as_derived), whatever path each refresh took; the history ends once every run ended, and the
    default one folds new data, requests and ends. A failure names the seed and the history up to it. The seed
    fixes the actions; which tick records a run's end depends on how fast the job processes run, so histories of
    one seed may differ there (the property holds for any). End to end, on Sail; on the JVM engines the same
    property is checked at SQL level (test_random_commits_fold_into_what_the_events_derive), which replaces the
    tick-by-tick fold scenarios there."""
    from heartbeat_runner.core.errors import InvalidInputError
    from heartbeat_runner.interfaces.operations import ask_retry

    seed = int(os.environ.get("HEARTBEAT_FOLD_HISTORY_SEED", HISTORY_SEED))
    rng = random.Random(seed)
    flags = _jobs_failing_on_a_flag(hb, "J1", "J2", "J3")
    hb.create_table("up.orders", "id int")
    hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "b", "J1", hard="FALSE"),
            row("trigger_file", "b", "J2"), row("trigger_file", "c", "J2"),
            row("delta_table", "up.orders", "J3"), row("trigger_file", "a", "J3", hard="FALSE"))
    hb.tick()
    history: list[str] = []
    folded: set[FoldKind] = set()  # the kinds of fold the ticks ran

    def compare(when: str) -> None:
        try:
            assert_as_derived(hb)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, {when}: the folded table differs from the derived one after "
                                 f"{history}") from error

    for step in range(HISTORY_TICKS):
        done = []
        for folder in rng.sample("abc", rng.randint(0, 3)):
            hb.drop_trigger_file(folder, f"{step}.done")
            done.append(folder)
        if done:
            history.append(f"data {''.join(sorted(done))}")
        if rng.random() < 0.3:
            hb.insert("up.orders", f"({step})")
            history.append("rows up.orders")
        if rng.random() < 0.3:
            job = rng.choice(sorted(flags))
            if flags[job].exists():
                flags[job].unlink()
                history.append(f"{job} succeeds")
            else:
                flags[job].touch()
                history.append(f"{job} fails")
        if rng.random() < 0.4:  # a failed job is retried, any other asked to run (refused while it runs)
            job = rng.choice(sorted(flags))
            ask = ask_retry if JobStatus.FAILED.value in hb.job_status(job) else ask_trigger
            skew = OTHER_WRITER_SKEW if step % 2 else -OTHER_WRITER_SKEW
            try:
                with _from_a_skewed_clock(hb, monkeypatch, skew):
                    ask(hb.app, job, by="another process")
                history.append(f"{ask.__name__} {job} ({skew.total_seconds():+.0f} s)")
            except InvalidInputError:
                pass
        result = hb.tick()
        folded.update(kind for refresh in result.refreshes for kind in refresh.folds)
        history.append(f"tick {step}: triggered {result.triggered_job_ids}, ended {result.completed + result.failed}"
                       f"{' (folded)' if result.control_folded else ''}")
        compare(f"tick {step}")

    deadline = time.monotonic() + 30
    while JobStatus.IN_PROGRESS.value in set(hb.status().values()):
        assert time.monotonic() < deadline, f"seed {seed}: runs did not end: {history}"
        time.sleep(0.3)
        result = hb.tick()
        if result.completed or result.failed:
            folded.update(kind for refresh in result.refreshes for kind in refresh.folds)
            history.append(f"settle: ended {result.completed + result.failed}")
            compare("settling")
    # the default history folds every kind of commit (another seed may fold fewer: it then compares less)
    assert folded == set(FoldKind) if seed == HISTORY_SEED else folded, f"seed {seed}: folded {folded}: {history}"


# -- random commits, straight into the control table ------------------------------------------------------------

#: the seed of test_random_commits_fold_into_what_the_events_derive (HEARTBEAT_FOLD_COMMITS_SEED explores others)
COMMITS_SEED = 11
#: refreshes of one history by engine, each compared with a full build (~1.5 s a refresh on Sail, more on a JVM)
COMMIT_ROUNDS = {"sail": 14, "spark-classic": 5, "spark-connect": 5}
#: the writers' clocks against the runner's: a second runner, the jobs' clusters and the operators' machines
WRITER_SKEWS = (timedelta(0), timedelta(minutes=2), -timedelta(minutes=2))
#: how runs end in a history: as often failed as completed, now and then refused
END_KINDS = (EventType.COMPLETED, EventType.COMPLETED, EventType.FAILED, EventType.FAILED, EventType.REFUSED)
#: the payloads a request may carry: none of a sequence, and the second of three runs of a sequence
REQUEST_PAYLOADS = ("{}", json.dumps({"_run": 2, "_runs": 3, "heartbeat_windows": "w1,w2,w3"}))


@dataclasses.dataclass
class CommitHistory:
    """A seeded random history of commits driven straight into the control table, no tick: the runner's own
    spans (ControlTable.append of sensing, requests, their answers and run ends, in any order the span allows)
    between refreshes, and between spans the commits of other writers (a second runner's new data, a job's own
    `complete`, an operator's pause or resume), each writer's clock two minutes ahead or behind or right, and the
    jobs' own end times read from skewed clocks too. The "base state" of each span is whatever the history built
    so far. After each refresh the control table as the folds left it must equal the derived one."""

    hb: Harness
    rng: random.Random
    seed: int
    monkeypatch: pytest.MonkeyPatch
    lines: list[str] = dataclasses.field(default_factory=list)
    folded: set[FoldKind] = dataclasses.field(default_factory=set)
    keys: dict[str, str] = dataclasses.field(default_factory=dict)

    def start(self) -> None:
        """Jobs J1-J4 over trigger folders a-e, hard and soft, some shared by two jobs."""
        self.hb.seed(row("trigger_file", "a", "J1"), row("trigger_file", "b", "J1", hard="FALSE"),
                     row("trigger_file", "b", "J2"), row("trigger_file", "c", "J2"),
                     row("trigger_file", "c", "J3", hard="FALSE"), row("trigger_file", "d", "J3"),
                     row("trigger_file", "e", "J4"), row("trigger_file", "a", "J4", hard="FALSE"))
        self.hb.app.control.refresh()
        self.keys = {r["sensor_id"]: r["source_key"] for r in self.hb.app.store.control_rows()}

    def statuses(self) -> dict[str, set[str | None]]:
        """Each job's statuses as the latest refresh left them (what the runner knows between refreshes)."""
        found: dict[str, set[str | None]] = {}
        for r in self.hb.app.store.control_rows():
            found.setdefault(r["trigger_job_id"], set()).add(r["status"])
        return found

    @staticmethod
    def running(statuses: dict[str, set[str | None]]) -> list[str]:
        return sorted(job for job, found in statuses.items() if JobStatus.IN_PROGRESS.value in found)

    def clock(self) -> timedelta:
        return self.rng.choice(WRITER_SKEWS)

    # -- the runner's commits -------------------------------------------------------------------------

    def sensed(self, run: str) -> list[Event]:
        now = utcnow() + self.clock()
        folders = self.rng.sample(sorted(self.keys), self.rng.randint(1, 3))
        windows = [None, ("2026-12-01", "2026-12-02"), ("2026-12-02", "2026-12-03")]
        events = []
        for folder in folders:
            window = self.rng.choice(windows)
            events.append(Event(event_type=EventType.NEW_DATA, run_id=run, snapshot_ts=now, event_ts=now,
                                source_key=self.keys[folder], sensor_source="trigger_file", sensor_id=folder,
                                window_from=window and window[0], window_to=window and window[1]))
        still = sorted(set(self.keys) - set(folders))
        if still and self.rng.random() < 0.5:  # a cursor that moved without data: it changes no control row
            events.append(Event(event_type=EventType.CURSOR, run_id=run, snapshot_ts=now, event_ts=now,
                                source_key=self.keys[self.rng.choice(still)], sensor_source="trigger_file"))
        self.lines.append("sensed " + "".join(sorted(folders)))
        return events

    def requests(self, run: str, jobs: list[str]) -> list[Event]:
        now = utcnow() + self.clock()
        self.lines.append("requested " + ",".join(jobs))
        return [Event(event_type=EventType.TRIGGER_REQUESTED, run_id=run, snapshot_ts=now, event_ts=now,
                      trigger_job_id=job, idempotency_token=f"{run}-{job}", payload=self.rng.choice(REQUEST_PAYLOADS))
                for job in jobs]

    def answers(self, run: str, jobs: list[str]) -> list[Event]:
        now = utcnow() + self.clock()
        self.lines.append("answered " + ",".join(jobs))
        return [Event(event_type=EventType.TRIGGERED, run_id=run, snapshot_ts=now, event_ts=now, trigger_job_id=job,
                      job_run_id=f"run-{run}-{job}", idempotency_token=f"{run}-{job}") for job in jobs]

    def ends(self, run: str, jobs: list[str]) -> list[Event]:
        now = utcnow() + self.clock()
        events = []
        for job in jobs:
            kind = self.rng.choice(END_KINDS)
            ended = now + self.clock() - timedelta(seconds=self.rng.randint(0, 90))  # the job's cluster's clock
            payload = self.rng.choice([None, json.dumps({"run_ended_at": ended.isoformat()})])
            events.append(Event(event_type=kind, run_id=run, snapshot_ts=now, event_ts=now, trigger_job_id=job,
                                message=None if kind is EventType.COMPLETED else "it broke", payload=payload))
            self.lines.append(f"{job} {kind.value.lower()}")
        return events

    def span(self, run: str, statuses: dict[str, set[str | None]]) -> None:
        """The runner's commits between two refreshes: sensing, requests of jobs not running, their answers (all,
        some or none, a commit later), and the ends of running jobs, in a random order."""
        running = self.running(statuses)
        idle = sorted(set(statuses) - set(running))
        commits: list[Callable[[], list[Event]]] = []
        if self.rng.random() < 0.7:
            commits.append(lambda: self.sensed(run))
        if idle and self.rng.random() < 0.6:
            asked = sorted(self.rng.sample(idle, self.rng.randint(1, len(idle))))
            commits.append(lambda: self.requests(run, asked))
        if running and self.rng.random() < 0.6:
            ended = sorted(self.rng.sample(running, self.rng.randint(1, len(running))))
            commits.append(lambda: self.ends(run, ended))
        self.rng.shuffle(commits)
        requested: list[str] = []
        for commit in commits:
            events = commit()
            self.hb.app.control.append(events)
            requested += [e.trigger_job_id for e in events if e.event_type is EventType.TRIGGER_REQUESTED]
        answered = [job for job in requested if self.rng.random() < 0.8]
        if answered:
            self.hb.app.control.append(self.answers(run, answered))

    # -- the other writers' commits -------------------------------------------------------------------

    def other_writer(self, statuses: dict[str, set[str | None]]) -> None:
        """One commit of another process, from its own clock: the runner's next refresh derives it."""
        running = self.running(statuses)
        choice = self.rng.choice(["runner", "complete", "pause"] if running else ["runner", "pause"])
        skew = self.clock()
        with _from_a_skewed_clock(self.hb, self.monkeypatch, skew):
            if choice == "runner":
                self.hb.app.store.append_events(self.sensed("second-runner"))
                self.lines[-1] = f"{self.lines[-1]} by a second runner"
            elif choice == "complete":
                job = self.rng.choice(running)
                record_job_event(self.hb.app, job, EventType.COMPLETED, by="a job", message="done")
                self.lines.append(f"{job} completes itself")
            else:
                job = self.rng.choice(sorted(statuses))
                paused = self.rng.random() < 0.5
                record_job_event(self.hb.app, job, EventType.JOB_PAUSED if paused else EventType.JOB_RESUMED)
                self.lines.append(f"{job} {'paused' if paused else 'resumed'}")
        self.lines[-1] += f" ({skew.total_seconds():+.0f} s)"

    # -- the history ------------------------------------------------------------------------------------

    def run(self, rounds: int) -> None:
        for step in range(rounds):
            statuses = self.statuses()  # another writer's commit changes them only at the next refresh
            if self.rng.random() < 0.25:
                self.other_writer(statuses)
            self.span(f"tick-{step}", statuses)
            refresh = self.hb.app.control.refresh()
            self.folded.update(refresh.folds)
            self.lines.append(f"refresh {step}: {refresh.path.value}"
                              + (f" {[k.name for k in refresh.folds]}" if refresh.folds else
                                 f" ({refresh.reason.value})" if refresh.reason else ""))
            try:
                assert_as_derived(self.hb)
            except AssertionError as error:
                raise AssertionError(f"seed {self.seed}, refresh {step}: the folded table differs from the derived "
                                     f"one after {self.lines}") from error


def _commit_history(hb, monkeypatch, rounds: int) -> CommitHistory:
    seed = int(os.environ.get("HEARTBEAT_FOLD_COMMITS_SEED", COMMITS_SEED))
    history = CommitHistory(hb, random.Random(seed), seed, monkeypatch)
    history.start()
    history.run(rounds)
    return history


@pytest.mark.slow  # 14 refreshes on Sail, over 13 CPU-s: CI runs it, the everyday leg does not (5 on a JVM)
@pytest.mark.engines("sail", "spark-classic", "spark-connect")
def test_random_commits_fold_into_what_the_events_derive(hb, engine_kind, monkeypatch):
    """The fold-versus-derive harness at SQL level: a seeded random history of commits driven straight into the
    control table (CommitHistory: the runner's spans of new data, requests, answers and run ends in random orders,
    other writers' commits between them, every writer's clock two minutes ahead, behind or right), and after
    each refresh the folded table equals the derived one. It reaches states ticks rarely make (an end and new
    data in one span, a request answered a commit later or never, new data for a failed job, run end times
    before their requests). A failure names the seed and the history up to it; the default one folds every
    kind of commit and builds after other writers."""
    history = _commit_history(hb, monkeypatch, COMMIT_ROUNDS[engine_kind])
    assert history.folded == set(FoldKind) or history.seed != COMMITS_SEED, history.lines
    assert any("(other_commits)" in line for line in history.lines) or history.seed != COMMITS_SEED, history.lines


def test_a_status_rule_changed_in_the_folds_alone_fails_the_random_commit_history(tmp_path, monkeypatch):
    """The mutation test of the SQL-level harness: with the folds' status rule ranking pending data over a failure
    (the model's rule unchanged), the default random history of commits fails, naming the seed and its history.
    It fails if the harness stops reaching a state the two rules disagree on."""
    project = _project_whose_folds_rank_new_data_over_a_failure(tmp_path)
    with Harness(tmp_path, HEARTBEAT_PROJECT_DIR=str(project)) as hb, \
            pytest.raises(AssertionError, match=r"seed \d+, refresh \d+: the folded table differs"):
        _commit_history(hb, monkeypatch, COMMIT_ROUNDS["sail"])
