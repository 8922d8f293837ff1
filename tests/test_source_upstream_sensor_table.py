"""The ``delta_upstream_sensor_table`` source: another data product's sensor state, a real Delta table.

The upstream product's table lives in its own lakehouse directory; the downstream engine
reads it by path (and by ``schema.table`` when it is in the engine's own warehouse).
"""

from __future__ import annotations

import json

import pytest
from services import (
    assert_config_check,
    engine,  # noqa: F401 (fixtures)
    sense_context,
    sensing_target,
)

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.records import SensorStatus
from heartbeat_runner.sensing.sources.upstream_sensor_table import UpstreamSensorTableSource

SOURCE = UpstreamSensorTableSource()
ORDERS = "delta_table:sales.orders#3f2a9c01bd"  # upstream source keys may hold '#'
PROCESSED, ACQUIRED = SensorStatus.PROCESSED_NEW_DATA.value, SensorStatus.ACQUIRED_NEW_DATA.value


def write_state(engine, location: str, *rows: tuple[str, list[str], str, str]) -> None:
    """Replace the upstream sensor state (what the upstream's dbt model does on every run)."""
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    schema = StructType([StructField("sensor_id", StringType()), StructField("assets", ArrayType(StringType())),
                         StructField("status", StringType()), StructField("status_change_timestamp", StringType()),
                         StructField("checkpoint_location", StringType()), StructField("upstream_key", StringType()),
                         StructField("upstream_value", StringType())])
    data = [(sid, assets, status, ts, None, None, json.dumps({"version": i})) for i, (sid, assets, status, ts)
            in enumerate(rows)]
    engine.spark.createDataFrame(data, schema).write.format("delta").mode("overwrite").save(location)


@pytest.fixture
def upstream(engine, tmp_path) -> str:
    location = str(tmp_path / "upstream_lakehouse" / "warehouse" / "heartbeat" / "heartbeat_sensor_state")
    write_state(engine, location,
                (ORDERS, ["sales.orders"], PROCESSED, "2026-01-01 10:00:00"),
                ("kafka:shop: clicks", ["clicks"], PROCESSED, "2026-01-01 11:00:00"))
    return location


@pytest.fixture
def ctx(engine):
    return sense_context(engine)


def sense(ctx, sensor_id: str, cursor: str | None = None, **fields):
    return SOURCE.sense(sensing_target("delta_upstream_sensor_table", sensor_id, cursor, **fields), ctx)


@pytest.mark.parametrize("sensor_id, upstream_key, problem", [
    ("/lake/heartbeat_sensor_state#delta_table:sales.orders", None, None),
    ("s3://bucket/state", "status_change_timestamp", None),
    ("upstream.heartbeat_sensor_state#sales.orders", None, None),
    ("relative/state#x", None, "neither a table name"),
    ("/lake/state#", None, "nothing after '#'"),
    ("/lake/state", "load_date", "upstream_key 'load_date'"),
])
def test_check_config(sensor_id, upstream_key, problem):
    assert_config_check(SOURCE, sensor_id, upstream_key, problem)


def test_baseline_then_processed_changes_of_the_followed_sensor(ctx, engine, upstream):
    sensor_id = f"{upstream}#{ORDERS}"
    baseline = sense(ctx, sensor_id)
    assert not baseline.new_data
    assert json.loads(baseline.cursor_to)["timestamp"] == "2026-01-01 10:00:00"
    unchanged = sense(ctx, sensor_id, baseline.cursor_to)
    assert not unchanged.new_data and "unchanged" in unchanged.detail

    write_state(engine, upstream, (ORDERS, ["sales.orders"], ACQUIRED, "2026-01-02 09:00:00"),
                ("kafka:shop: clicks", ["clicks"], PROCESSED, "2026-01-02 09:30:00"))
    acquired = sense(ctx, sensor_id, baseline.cursor_to)
    assert not acquired.new_data  # not processed upstream yet; the other sensor does not count

    write_state(engine, upstream, (ORDERS, ["sales.orders"], PROCESSED, "2026-01-02 10:00:00"),
                ("kafka:shop: clicks", ["clicks"], PROCESSED, "2026-01-02 09:30:00"))
    first = sense(ctx, sensor_id, acquired.cursor_to)
    assert first.new_data and first.rows == 1
    assert first.window_from == "status_change_timestamp > 2026-01-01 10:00:00"
    assert json.loads(first.cursor_to)["timestamp"] == "2026-01-02 10:00:00"

    assert not sense(ctx, sensor_id, first.cursor_to).new_data
    write_state(engine, upstream, (ORDERS, ["sales.orders"], PROCESSED, "2026-01-03T08:00:00.5Z"))
    second = sense(ctx, sensor_id, first.cursor_to)
    assert second.new_data and json.loads(second.cursor_to)["timestamp"] == "2026-01-03 08:00:00.5"


def test_follow_by_asset_or_the_whole_table(ctx, engine, upstream):
    by_asset, whole = f"{upstream}#clicks", upstream
    cursors = {sid: sense(ctx, sid).cursor_to for sid in (by_asset, whole)}
    write_state(engine, upstream, (ORDERS, ["sales.orders"], PROCESSED, "2026-01-05 00:00:00"),
                ("kafka:shop: clicks", ["clicks"], PROCESSED, "2026-01-01 11:00:00"))
    assert not sense(ctx, by_asset, cursors[by_asset]).new_data
    assert sense(ctx, whole, cursors[whole]).new_data


def test_replay_sees_what_was_already_processed(engine, upstream):
    result = sense(sense_context(engine, replay=True), f"{upstream}#sales.orders")
    assert result.new_data and result.rows == 1 and result.window_from == "beginning"


def test_preprocess_query_filters_rows_and_the_cursor_still_advances(ctx, engine, upstream):
    query = "SELECT * FROM sensor_new_data WHERE ?upstream_key >= '2026-02-01' AND size(assets) > 0"
    baseline = sense(ctx, upstream).cursor_to
    write_state(engine, upstream, (ORDERS, ["sales.orders"], PROCESSED, "2026-01-20 00:00:00"))
    filtered = sense(ctx, upstream, baseline, upstream_key="status_change_timestamp", preprocess_query=query)
    assert not filtered.new_data and json.loads(filtered.cursor_to)["timestamp"] == "2026-01-20 00:00:00"
    write_state(engine, upstream, (ORDERS, ["sales.orders"], PROCESSED, "2026-02-02 00:00:00"))
    kept = sense(ctx, upstream, filtered.cursor_to, upstream_key="status_change_timestamp", preprocess_query=query)
    assert kept.new_data and kept.rows == 1


def test_table_name_in_the_engines_warehouse(ctx, engine):
    location = engine.local_location("upstream_product.heartbeat_sensor_state")
    write_state(engine, str(location), (ORDERS, ["sales.orders"], PROCESSED, "2026-01-01 00:00:00"))
    result = sense(sense_context(engine, replay=True), f"upstream_product.heartbeat_sensor_state#{ORDERS}")
    assert result.new_data


def test_missing_table_and_wrong_shape_are_clear_errors(ctx, engine, tmp_path):
    with pytest.raises(SourceError, match="upstream sensor table .* not found"):
        sense(ctx, f"{tmp_path}/nothing_here#x")
    other = str(tmp_path / "not_a_sensor_table")
    engine.spark.createDataFrame([(1,)], "id int").write.format("delta").save(other)
    with pytest.raises(SourceError, match="not a sensor state table"):
        sense(ctx, other)
