"""delta_table with a preprocess_query reads the new rows from the upstream's change data feed.

With ``delta.enableChangeDataFeed`` on, the query sees the rows inserted or updated to since
the cursor (the feed); without it, or when the feed does not cover the range, the current
version minus the stored one. Either way old rows never count again, and the event says how
the rows were found.

The embedded engine (Sail) can read a table with the feed on but not write to it ("Table
features must be specified, please specify: ChangeDataFeed"), so there the upstream is
written with the ``deltalake`` package, as another writer of the lakehouse would.
"""

from __future__ import annotations

import pytest
from harness import Harness
from harness import config_row as row

#: the feed on Sail (deltalake) and on Spark classic (readChangeFeed); a Spark test costs 1-2 min, so
#: the other cases (update, no feed, feed turned on later) run on Sail only
ON_SPARK = pytest.mark.engines("sail", "spark-classic")

COLUMNS = "id int, amount double"
BIG_ORDERS = "SELECT * FROM sensor_new_data WHERE amount >= 1000"
FROM_FEED = "new rows from the change data feed"
BY_VERSIONS = "new rows by comparing versions"


class Orders:
    """The upstream ``shop.orders`` (id, amount), written the way the engine allows."""

    name = "shop.orders"

    def __init__(self, hb: Harness, *, change_feed: bool):
        self.hb = hb
        self.embedded = hb.engine_kind == "sail"
        if self.embedded:
            self._write([], mode="error", configuration={"delta.enableChangeDataFeed": "true"} if change_feed else None)
            hb.app.engine.ensure_registered(self.name)
        else:
            hb.create_table(self.name, COLUMNS, properties="'delta.enableChangeDataFeed' = 'true'" if change_feed else "")

    @property
    def location(self) -> str:
        return str(self.hb.app.engine.local_location(self.name))

    def append(self, *rows: tuple[int, float]) -> None:
        if self.embedded:
            self._write(list(rows), mode="append")
        else:
            self.hb.insert(self.name, ", ".join(f"({int(i)}, {float(a)})" for i, a in rows))

    def set_amount(self, order_id: int, amount: float) -> None:
        if self.embedded:
            from deltalake import DeltaTable

            DeltaTable(self.location).update(predicate=f"id = {int(order_id)}", updates={"amount": repr(float(amount))})
        else:
            self.hb.spark.sql(f"UPDATE {self.name} SET amount = {float(amount)} WHERE id = {int(order_id)}")

    def enable_change_feed(self) -> None:
        if self.embedded:
            from deltalake import DeltaTable

            DeltaTable(self.location).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
        else:
            self.hb.spark.sql(f"ALTER TABLE {self.name} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")

    def _write(self, rows: list[tuple[int, float]], **options) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        data = pa.table({"id": pa.array([r[0] for r in rows], pa.int32()),
                         "amount": pa.array([r[1] for r in rows], pa.float64())})
        write_deltalake(self.location, data, **options)


def start(hb: Harness, *, change_feed: bool) -> Orders:
    """Orders with two old rows (one big), a BIG job on big new orders, and the sensor's baseline."""
    orders = Orders(hb, change_feed=change_feed)
    orders.append((1, 5.0), (2, 2500.0))
    hb.jobs(BIG=0)
    hb.seed(row("delta_table", orders.name, "BIG", query=BIG_ORDERS))
    assert hb.tick().triggered == []  # baseline
    return orders


def sensed(result):
    (outcome,) = result.sensed
    assert outcome.error is None, outcome.error
    return outcome.result


@ON_SPARK
def test_with_the_change_feed_only_new_rows_reach_the_query(hb):
    orders = start(hb, change_feed=True)

    orders.append((3, 7.0))  # small: the old big order must not count again
    first = hb.tick()
    assert first.triggered == [] and sensed(first).rows == 0 and sensed(first).detail == FROM_FEED

    orders.append((4, 1200.0), (5, 1.0))
    second = hb.tick()
    assert second.triggered_job_ids == ["BIG"] and sensed(second).rows == 1
    (event,) = hb.events("NEW_DATA")
    assert event["rows"] == 1 and event["message"] == FROM_FEED


def test_an_update_to_a_matching_row_is_new_data_through_the_feed(hb):
    orders = start(hb, change_feed=True)

    orders.set_amount(1, 9000.0)  # the old small order becomes big: its post-image is new

    result = hb.tick()
    assert result.triggered_job_ids == ["BIG"]
    assert sensed(result).rows == 1 and sensed(result).detail == FROM_FEED


def test_without_the_change_feed_versions_are_compared(hb):
    orders = start(hb, change_feed=False)

    orders.append((3, 7.0))
    first = hb.tick()
    assert first.triggered == [] and sensed(first).rows == 0 and sensed(first).detail == BY_VERSIONS

    orders.append((4, 1200.0))
    second = hb.tick()
    assert second.triggered_job_ids == ["BIG"] and sensed(second).rows == 1
    assert hb.events("NEW_DATA")[0]["message"] == BY_VERSIONS


def test_a_feed_enabled_after_the_cursor_is_used_from_the_next_range_on(hb):
    """The range since the cursor includes a commit the feed did not record: compare versions once."""
    orders = start(hb, change_feed=False)
    orders.append((3, 1100.0))
    orders.enable_change_feed()
    orders.append((4, 2.0))

    first = hb.tick()
    assert first.triggered_job_ids == ["BIG"]
    assert sensed(first).rows == 1 and sensed(first).detail == BY_VERSIONS
    hb.wait_for_jobs()

    orders.append((5, 3000.0), (6, 4000.0))
    second = hb.tick()
    assert second.triggered_job_ids == ["BIG"]
    assert sensed(second).rows == 2 and sensed(second).detail == FROM_FEED
