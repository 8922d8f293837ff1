"""Filter values reach the engine as bound parameters on every Spark a runner meets.

Apache Spark 4.0 and the embedded engine take a list as one array parameter; Spark 3.5 (Databricks Runtime
16.4 LTS) takes literals only and refuses an array (``INVALID_SQL_ARG``), which failed every tick there. A
list is then bound one value per parameter. The Databricks-shaped leg runs the runner job on Spark 3.5 itself
(tests/test_databricks_runtime.py); here both bindings answer the same reads on the embedded engine.
"""

from __future__ import annotations

import pytest
from harness import config_row as row

from heartbeat_runner.core.records import JobStatus
from heartbeat_runner.engines.engine import binds_arrays
from heartbeat_runner.lakehouse.store import CONTROL, EVENTS, Cond


@pytest.mark.parametrize(("version", "arrays"), [("3.5.2", False), ("3.5.0-databricks", False), ("4.0.1", True),
                                                 ("4.1.0", True), ("unknown", True)])
def test_only_a_spark_before_4_binds_lists_one_value_each(version, arrays):
    assert binds_arrays(version) is arrays


def test_a_list_bound_one_value_each_reads_what_an_array_reads(hb):
    hb.create_table("up.a", "id int")
    hb.create_table("up.b", "id int")
    hb.jobs(J1=0, J2=0, J3=0)
    hb.seed(row("delta_table", "up.a", "J1"), row("delta_table", "up.b", "J2"), row("delta_table", "up.b", "J3"))
    hb.tick()
    hb.insert("up.b", "(1)")
    hb.tick()
    store = hb.app.store
    reads = [(CONTROL, Cond("trigger_job_id", ["J1", "J3"], "in"), Cond("is_active", True)),
             (CONTROL, Cond("trigger_job_id", [], "in")),
             (CONTROL, Cond("trigger_job_id", ["J2"], "in"), Cond("status", [s.value for s in JobStatus], "in")),
             (EVENTS, Cond("event_type", ["NEW_DATA", "TRIGGER_REQUESTED"], "in"))]

    def answers() -> list[list[tuple]]:
        return [sorted((tuple(sorted(r.items())) for r in store.read(relation, *where)), key=repr)
                for relation, *where in reads]

    as_arrays = answers()
    store.engine.binds_arrays = False
    sent = store.engine.sql_count
    one_each = answers()
    assert store.engine.sql_count > sent  # asked again, not answered from the read cache
    assert one_each == as_arrays
    assert [len(rows) for rows in as_arrays][:3] == [2, 0, 1] and len(as_arrays[3]) >= 2  # J2's new data: a status
