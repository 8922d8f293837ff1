"""delta_table / lmu_delta_table and trigger_file sources through full ticks."""

from harness import config_row as row

from heartbeat_runner.lakehouse.store import Cond


def test_preprocess_query_filters_new_rows(hb):
    hb.create_table("shop.orders", "id int, amount double")
    hb.jobs(BIG=0)
    hb.seed(row("delta_table", "shop.orders", "BIG", query="SELECT * FROM sensor_new_data WHERE amount >= 1000"))
    hb.tick()
    hb.insert("shop.orders", "(1, 5.0), (2, 50.0)")
    result = hb.tick()
    assert [s.outcome.value for s in result.sensed] == ["NO_NEW_DATA"] and result.triggered == []
    assert hb.events("NEW_DATA") == [] and len(hb.events("CURSOR")) == 2  # baseline + filtered window
    hb.insert("shop.orders", "(3, 2500.0)")
    result = hb.tick()
    assert result.triggered_job_ids == ["BIG"]
    (event,) = hb.events("NEW_DATA")
    assert event["rows"] == 1


def test_upstream_key_cursor_advances_across_ticks(hb):
    hb.create_table("shop.loads", "load_id bigint, note string")
    hb.insert("shop.loads", "(10, 'old')")
    hb.jobs(L=0)
    hb.seed(row("lmu_delta_table", "shop.loads", "L", key="load_id",
                query="SELECT * FROM sensor_new_data WHERE ?upstream_key > 0"))
    hb.tick()  # baseline at load_id 10
    hb.insert("shop.loads", "(11, 'a'), (12, 'b')")
    first = hb.tick()
    assert first.triggered_job_ids == ["L"]
    assert first.sensed[0].result.window_to == "load_id <= 12"
    hb.wait_for_jobs()
    hb.insert("shop.loads", "(13, 'c')")
    second = hb.tick()
    assert second.sensed[0].result.rows == 1  # only the row after the cursor
    assert second.sensed[0].result.window_from == "load_id > 12"
    assert second.triggered_job_ids == ["L"]
    hb.wait_for_jobs()
    assert hb.runs_of("L") == 2


def test_new_commit_without_new_keys_is_not_new_data(hb):
    hb.create_table("shop.loads", "load_id bigint, note string")
    hb.insert("shop.loads", "(10, 'old')")
    hb.jobs(L=0)
    hb.seed(row("delta_table", "shop.loads", "L", key="load_id"))
    hb.tick()
    hb.insert("shop.loads", "(5, 'late but below the cursor')")
    assert hb.tick().triggered == []


def test_trigger_file_new_file_since_cursor(hb):
    hb.jobs(T=0)
    hb.drop_trigger_file("landing", "old.done")
    hb.seed(row("trigger_file", "landing", "T"))
    assert hb.tick().triggered == []  # existing file: baseline
    hb.drop_trigger_file("landing", "_partial.tmp")  # ignored
    assert hb.tick().triggered == []
    hb.drop_trigger_file("landing", "new.done")
    result = hb.tick()
    assert result.triggered_job_ids == ["T"]
    assert result.sensed[0].result.window_to == "new.done"
    hb.wait_for_jobs()
    assert hb.tick().triggered == []


def test_table_shared_by_three_jobs_is_sensed_once_per_tick(hb):
    hb.create_table("shop.orders", "id int")
    hb.jobs(A=0, B=0, C=0)
    hb.seed(*(row("delta_table", "shop.orders", job) for job in "ABC"))
    hb.tick()
    hb.insert("shop.orders", "(1)")
    result = hb.tick()
    assert len(result.sensed) == 1
    assert result.sensed[0].trigger_job_ids == "A,B,C"
    assert sorted(result.triggered_job_ids) == ["A", "B", "C"]


def test_missing_table_is_an_error_for_that_source_only(hb):
    hb.create_table("shop.orders", "id int")
    hb.jobs(A=0, B=0)
    hb.seed(row("delta_table", "shop.orders", "A"), row("delta_table", "shop.nope", "B"))
    hb.tick()
    hb.insert("shop.orders", "(1)")
    result = hb.tick()
    assert result.exit_code == 2
    errors = {s.target.sensor_id: s.error for s in result.sensor_errors}
    assert "not found" in errors["shop.nope"]
    assert result.triggered_job_ids == ["A"]
    report = hb.app.store.read("heartbeat_run_report", Cond("run_id", result.run_id), Cond("sensor_id", "shop.nope"))
    assert report[0]["outcome"] == "ERROR" and "not found" in report[0]["error"]
