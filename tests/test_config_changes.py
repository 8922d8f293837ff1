"""Loading and changing the config: idempotent re-seed, merges that keep state, retired rows."""

import pytest
from harness import config_row as row


def _seed_rows(hb):
    return hb.app.store.read("heartbeat_sensor_config")


def test_reseeding_the_same_csv_changes_nothing(hb):
    rows = [row("delta_table", "db.a", "J1"), row("trigger_file", "drop", "J1", hard="FALSE")]
    hb.seed(*rows)
    before = hb.rows()
    hb.seed(*rows)
    hb.seed(*rows)
    assert len(_seed_rows(hb)) == 2
    after = hb.rows()
    assert len(after) == 2
    assert [(r["sensor_id"], r["status"], r["row_created_timestamp"]) for r in after] == \
        [(r["sensor_id"], r["status"], r["row_created_timestamp"]) for r in before]


def test_config_edits_merge_without_losing_untouched_state(hb):
    for name in ("db.a", "db.b", "db.c"):
        hb.create_table(name, "id int")
    hb.jobs(J1=0, J2=0)
    hb.seed(row("delta_table", "db.a", "J1"), row("delta_table", "db.b", "J2"), row("delta_table", "db.c", "J2"))
    hb.tick()
    hb.insert("db.a", "(1)")
    hb.insert("db.b", "(1)")
    hb.tick()
    hb.wait_for_jobs()
    hb.insert("db.b", "(2)")
    hb.app.control.refresh()
    # J1 completed; J2 waits with db.b NEW_EVENT_AVAILABLE (db.c is hard and has nothing)
    hb.tick()
    assert hb.status()[("delta_table", "db.a", "J1")] == "COMPLETED"
    assert hb.status()[("delta_table", "db.b", "J2")] == "NEW_EVENT_AVAILABLE"

    # Edit: add a row, remove db.c, pause J1, make ... keep db.b untouched
    hb.seed(row("delta_table", "db.a", "J1", state="PAUSED"), row("delta_table", "db.b", "J2"),
            row("trigger_file", "newdrop", "J2", hard="FALSE"))
    status = hb.status()
    assert status[("delta_table", "db.a", "J1")] == "COMPLETED"            # state kept, now paused
    assert status[("delta_table", "db.b", "J2")] == "NEW_EVENT_AVAILABLE"  # untouched row keeps its status
    assert status[("trigger_file", "newdrop", "J2")] is None               # new row
    retired = [r for r in hb.app.store.control_rows(include_retired=True) if not r["is_active"]]
    assert [(r["sensor_id"], r["retired_timestamp"] is not None) for r in retired] == [("db.c", True)]
    assert ("delta_table", "db.c", "J2") not in status
    # Without db.c (hard, no data) J2 is now ready on the next tick.
    assert hb.tick().triggered_job_ids == ["J2"]

    # Flag change: db.b becomes soft (newdrop hard) -> merges, status kept.
    hb.wait_for_jobs()
    hb.seed(row("delta_table", "db.a", "J1", state="PAUSED"), row("delta_table", "db.b", "J2", hard="FALSE"),
            row("trigger_file", "newdrop", "J2", hard="TRUE"))
    flags = {r["sensor_id"]: (r["dependency_flag"], r["status"]) for r in hb.rows("J2")}
    assert flags == {"db.b": ("FALSE", "COMPLETED"), "newdrop": ("TRUE", "COMPLETED")}


def test_a_retired_row_that_returns_is_active_again(hb):
    hb.seed(row("delta_table", "db.a", "J1"), row("delta_table", "db.b", "J1"))
    hb.seed(row("delta_table", "db.a", "J1"))
    hb.seed(row("delta_table", "db.a", "J1"), row("delta_table", "db.b", "J1"))
    assert {r["sensor_id"]: r["is_active"] for r in hb.app.store.control_rows(include_retired=True)} == \
        {"db.a": True, "db.b": True}


def test_dbt_tests_on_the_seed(hb):
    import pytest

    from heartbeat_runner.lakehouse.dbt_invoke import DbtError

    hb.seed(row("delta_table", "db.a", "J1"), row("delta_table", "db.b", "J1", hard=" false"))
    result = hb.app.dbt.invoke(["test", "--select", "heartbeat_sensor_config"])
    assert len(result.result.results) >= 8
    # A seed loaded with plain dbt (no runner validation) is still checked by the dbt tests.
    from harness import HEADER

    hb.app.dbt.load_seed("\n".join([HEADER, row("delta_table", "db.a", "J1", state="SOMETIMES"),
                                     row("delta_table", "db.a", "J1")]) + "\n")
    with pytest.raises(DbtError) as failure:
        hb.app.dbt.invoke(["test", "--select", "heartbeat_sensor_config"])
    assert "job_state" in str(failure.value) and "unique_combination" in str(failure.value)


def test_the_engine_reads_the_seed_file_as_dbt_would_insert_its_rows(hb):
    """On engines on this machine the engine reads the seed's CSV file itself (an INSERT of 10,000 rows as
    literals took ~13 s); the table it loads is the one dbt's row-by-row INSERTs give: quotes, doubled quotes,
    commas, line breaks and backslashes in a value kept, empty fields and a field that says null NULL."""
    import dataclasses

    tricky = [
        row("delta_table", "db.a", "J1", query="select * from sensor_new_data where note = 'it''s, \"quoted\"'"),
        row("delta_table", "db.b", "J1", hard="FALSE", query="select *\nfrom sensor_new_data\nwhere path like 'C:\\\\x%'"),
        row("trigger_file", "drop", "J2", name="null"),
        row("trigger_file", "drop2", "J2", name="Ünïcødé job"),
    ]
    tables = {}
    for from_file in (True, False):
        hb.app.engine.ops = dataclasses.replace(hb.app.engine.ops, seeds_from_file=from_file)
        hb.seed(*tricky)
        tables[from_file] = sorted((tuple(sorted(r.items())) for r in _seed_rows(hb)), key=str)
    assert hb.app.engine.ops.seeds_from_file is False and tables[True] == tables[False]
    loaded = {r["sensor_id"]: r for r in _seed_rows(hb)}
    assert loaded["db.a"]["preprocess_query"] == "select * from sensor_new_data where note = 'it''s, \"quoted\"'"
    assert loaded["db.b"]["preprocess_query"].count("\n") == 2 and "C:\\\\x%" in loaded["db.b"]["preprocess_query"]
    assert loaded["drop"]["trigger_job_name"] is None and loaded["drop"]["upstream_key"] is None
    assert loaded["drop2"]["trigger_job_name"] == "Ünïcødé job"
