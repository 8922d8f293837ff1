"""Tables that do not grow without bound: idle ticks write nothing, maintenance archives and compacts,
and a crash anywhere in maintenance loses nothing and changes no state."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, Harness, marker_jobs_file
from harness import config_row as row

from heartbeat_runner.core.faults import ARCHIVE_STEPS, CRASH_EXIT_CODE, FaultPoint
from heartbeat_runner.core.records import TickStatus

#: from the registry: every step of archiving the events, a step of another table, and compaction
ARCHIVE_CRASH_POINTS = (*vars(ARCHIVE_STEPS["events"]).values(), ARCHIVE_STEPS["report"].after_copy,
                        FaultPoint.DURING_COMPACTION)


def test_idle_ticks_write_nothing_until_a_busy_tick_writes_their_summary(tmp_path):
    with Harness(tmp_path, HEARTBEAT_IDLE_FLUSH="3600") as hb:
        hb.create_table("shop.orders", "id bigint")
        hb.jobs(J1=0)
        hb.seed(row("delta_table", "shop.orders", "J1"))
        hb.tick()  # baseline: writes its cursor event, so not idle
        runs_version = hb.app.engine.table_version("heartbeat.heartbeat_runs")
        report_version = hb.app.engine.table_version("heartbeat.heartbeat_run_report")
        for _ in range(5):
            assert hb.tick().is_idle
        assert hb.app.engine.table_version("heartbeat.heartbeat_runs") == runs_version
        assert hb.app.engine.table_version("heartbeat.heartbeat_run_report") == report_version

        hb.insert("shop.orders", "(1)")
        busy = hb.tick()
        assert busy.triggered_job_ids == ["J1"] and not busy.is_idle
        assert hb.app.engine.table_version("heartbeat.heartbeat_runs") == runs_version + 1  # one commit, two rows
        runs = sorted(hb.app.store.read("heartbeat_runs"), key=lambda r: r["snapshot_ts"])
        streak, last = runs[-2], runs[-1]
        assert streak["message"] == "5 idle tick(s) coalesced: nothing new, triggered or reconciled"
        assert streak["status"] == TickStatus.OK.value and last["run_id"] == busy.run_id
        report = hb.app.store.read("heartbeat_run_report")
        assert {r["run_id"] for r in report} >= {busy.run_id}
        assert streak["run_id"] not in {r["run_id"] for r in report}


def test_a_pending_idle_streak_is_written_when_the_runner_stops(tmp_path):
    with Harness(tmp_path, HEARTBEAT_IDLE_FLUSH="3600") as hb:
        hb.jobs(J1=0)
        hb.seed(row("trigger_file", "drop", "J1"))
        hb.tick()
        before = len(hb.app.store.read("heartbeat_runs"))
        hb.tick()
        hb.tick()
        hb.heartbeat.close()
        runs = hb.app.store.read("heartbeat_runs", order_by=["snapshot_ts"])
        assert len(runs) == before + 1 and "2 idle tick(s)" in runs[-1]["message"]


@pytest.mark.slow
def test_busy_ticks_keep_the_file_count_bounded_and_the_state_unchanged(tmp_path):
    """Maintenance runs by itself once a table has more than the bound of files: afterwards every
    table is back under it, history sits in the archive, and the control table equals the one
    re-derived from every event."""
    bound = 6
    with Harness(tmp_path, HEARTBEAT_MAINTENANCE_MAX_FILES=str(bound), HEARTBEAT_ARCHIVE_MARGIN_MINUTES="0",
                 HEARTBEAT_REPORT_KEEP_HOURS="0") as hb:
        hb.create_table("shop.orders", "id bigint")
        hb.jobs(J1=0)
        hb.seed(row("delta_table", "shop.orders", "J1"))
        hb.tick()
        maintained = []
        for i in range(8):
            hb.insert("shop.orders", f"({i})")
            result = hb.tick()
            assert result.triggered_job_ids == ["J1"]
            hb.wait_for_jobs()
            maintained += [r for r in (result.maintenance,) if r is not None]
        assert maintained, "maintenance never ran"
        assert sum(m.archived_events for m in maintained) > 0
        for table in ("heartbeat_events", "heartbeat_runs", "heartbeat_run_report", "heartbeat_control"):
            # a busy tick adds at most a few commits after the last maintenance
            assert hb.app.engine.file_count(f"heartbeat.{table}") <= bound + 4, table
        snapshot = hb.app.store.control_rows(include_retired=True)
        hb.app.dbt.rebuild_from_all_events()
        rebuilt = hb.app.store.control_rows(include_retired=True)
        assert [{k: v for k, v in r.items() if k != "updated_at"} for r in snapshot] == \
            [{k: v for k, v in r.items() if k != "updated_at"} for r in rebuilt]
        assert hb.app.store.count("heartbeat_events_archive") > 0
        assert hb.app.store.count("heartbeat_runs_archive") > 0


def test_the_full_rebuild_reads_the_archive(hb):
    """`rebuild` re-derives the control table from every event ever recorded, archive included: with the whole
    history moved out of the hot log (as after restoring an archive from a backup) it gives back the table the
    events made, row by row. A rebuild that read the hot log alone would find no event and no run."""
    from heartbeat_runner.lakehouse.store import EVENTS, EVENTS_ARCHIVE

    hb.create_table("shop.orders", "id bigint")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "shop.orders", "J1"))
    hb.tick()
    hb.insert("shop.orders", "(1)")
    assert hb.tick().triggered_job_ids == ["J1"]
    hb.wait_for_jobs()
    hb.insert("shop.orders", "(2)")
    hb.tick()
    hb.heartbeat.refresh_models()
    before = hb.app.store.control_rows(include_retired=True)
    assert all(r["last_idempotency_token"] for r in before)  # a run is on record

    store = hb.app.store
    store.stage_keys(hb.spark.table(store.name(EVENTS)).select("event_id").distinct())
    store.copy_staged(EVENTS, EVENTS_ARCHIVE)
    store.delete_staged(EVENTS)
    assert store.count(EVENTS) == 0 and store.count(EVENTS_ARCHIVE) > 0
    hb.app.dbt.rebuild_from_all_events()
    after = store.control_rows(include_retired=True)
    assert [{k: v for k, v in r.items() if k != "updated_at"} for r in after] == \
        [{k: v for k, v in r.items() if k != "updated_at"} for r in before]


# -- crashes during maintenance -------------------------------------------------------------------

@pytest.fixture(scope="module")
def aged(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A lakehouse with history: five changes, each triggered and completed."""
    root = tmp_path_factory.mktemp("aged")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.orders", "101"),
                                 row("trigger_file", "drop", "102")]) + "\n")
    jobs = marker_jobs_file(root / "jobs.yml", "101", "102")
    lake = CliLakehouse(root / "template" / "lakehouse", config=config, jobs_file=jobs, env=MAINTENANCE_OFF)
    lake.home.mkdir(parents=True)
    lake.append_ids("up.orders", 0)
    lake.cli("seed")
    lake.cli("run")
    for i in range(1, 6):
        lake.append_ids("up.orders", i)
        lake.drop_trigger_file("drop", f"{i}.done")
        lake.cli("run")
        lake.wait_local_runs()
        lake.cli("run")
    return lake.home, config, jobs


#: the template is aged with automatic maintenance off; the tests run it themselves
MAINTENANCE_OFF = {"HEARTBEAT_MAINTENANCE": "off", "HEARTBEAT_ARCHIVE_MARGIN_MINUTES": "0",
                   "HEARTBEAT_REPORT_KEEP_HOURS": "0"}


def event_ids(lake: CliLakehouse, table: str) -> list[str]:
    return [e["event_id"] for e in lake.table(table)]


@pytest.mark.slow
@pytest.mark.parametrize("point", ARCHIVE_CRASH_POINTS)
def test_a_crash_anywhere_in_maintenance_loses_nothing_and_changes_no_state(aged, point):
    home, config, jobs = aged
    target = home.parent.parent / point / "lakehouse"
    shutil.copytree(home, target)
    lake = CliLakehouse(target, config=config, jobs_file=jobs, env=MAINTENANCE_OFF)
    before_ids = set(event_ids(lake, "heartbeat_events"))
    before_control = lake.control()

    crashed = lake.cli("maintain", "--compact-all", check=False, env={"HEARTBEAT_CRASH_AT": point})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    after_crash = set(event_ids(lake, "heartbeat_events")) | set(event_ids(lake, "heartbeat_events_archive"))
    assert after_crash == before_ids  # in one table or both, never in neither

    lake.cli("maintain", "--compact-all")
    hot, archived = event_ids(lake, "heartbeat_events"), event_ids(lake, "heartbeat_events_archive")
    assert set(hot) | set(archived) == before_ids and not set(hot) & set(archived)
    assert len(hot) < len(before_ids)  # history moved out of the hot log
    lake.cli("run")
    assert lake.control() == before_control
    lake.cli("rebuild")
    assert lake.control() == before_control
    runs = lake.cli("runs", "--json").stdout
    assert runs.count('"run_id"') >= 11  # every tick is still listed, hot or archived


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_the_control_table_stays_a_few_files_however_many_ticks_fold_into_it(tmp_path):
    """Every tick folds into the control table, and each fold adds a data file; every read and fold of the
    table costs per file. Between maintenance runs, a tick compacts the control table alone once it holds more
    than CONTROL_MAX_FILES, and its rows stay exactly what they were."""
    from heartbeat_runner.lakehouse.maintenance import CONTROL_MAX_FILES

    with Harness(tmp_path, HEARTBEAT_MAINTENANCE_MAX_FILES="100000") as hb:  # no full maintenance run
        folders = [f"f{i:02}" for i in range(3 * CONTROL_MAX_FILES)]  # a fold splits the file its row is in
        hb.jobs(**{f"J{i:02}": 0 for i in range(len(folders))})
        hb.seed(*(row("trigger_file", folder, f"J{i:02}") for i, folder in enumerate(folders)))
        hb.tick()
        control = hb.app.store.name("heartbeat_control")
        counts, tidied = [], []
        for n, folder in enumerate(folders):
            hb.drop_trigger_file(folder, f"{n}.done")
            result = hb.tick()
            if result.maintenance is not None:
                tidied.append(result.maintenance.compacted["heartbeat_control"])
                rows = hb.app.store.read("heartbeat_control", order_by=["trigger_job_id"])
                hb.app.control.refresh(force=True)  # what a build from all the events derives
                assert [{k: v for k, v in r.items() if k != "updated_at"} for r in rows] == [
                    {k: v for k, v in r.items() if k != "updated_at"}
                    for r in hb.app.store.read("heartbeat_control", order_by=["trigger_job_id"])]
            counts.append(hb.app.engine.file_count(control))
        assert tidied and all(before > CONTROL_MAX_FILES and after < before for before, after in tidied), counts
        assert max(counts) <= CONTROL_MAX_FILES + 3, counts
