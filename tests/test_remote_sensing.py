"""Sensing Delta tables the way it runs on Databricks (no ``_delta_log`` on this machine: history queries and
the catalog look at ``information_schema.tables``), forced on local Apache Spark as benchmarks/remote_sensing.py
does: the engine adapter is the one Databricks gets (``TableOps``) and Unity Catalog's
``information_schema.tables`` is a Delta table the tests keep as the catalog would.

One JVM for the module (the session's shared one, see conftest.py); each test builds its own engine on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from heartbeat_runner.core.records import SensingTarget
from heartbeat_runner.sensing.sources.base import SenseContext, dump_cursor

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not shutil.which("java"), reason="needs Java 17"),
    pytest.mark.timeout(600),
]
pytest.importorskip("delta", reason="needs delta-spark: pip install 'heartbeat-runner[spark]'")

#: runs with the other Spark classic tests, on their JVM (see conftest.py)
ENGINE_KIND = "spark-classic"
CATALOG, SCHEMA = "spark_catalog", "rs_upstream"
TABLES = ("managed", "external", "lagging", "skipped", "zoned", "streamed", "other")


class Recording:
    """The session, recording every SQL text and its bound values; ``fail_looks`` makes catalog looks fail."""

    def __init__(self, spark: Any):
        self._spark = spark
        self.queries: list[tuple[str, dict]] = []
        self.fail_looks = False

    def sql(self, text: str, args: dict | None = None, **kwargs: Any) -> Any:
        self.queries.append((text, dict(args or {})))
        if self.fail_looks and "information_schema" in text:
            raise RuntimeError("[SQL_WAREHOUSE_UNAVAILABLE] the warehouse is starting; try again")
        return self._spark.sql(text, args=args, **kwargs) if args else self._spark.sql(text, **kwargs)

    def looks(self) -> list[tuple[str, dict]]:
        return [(text, args) for text, args in self.queries if "information_schema" in text]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)


@pytest.fixture(scope="module")
def spark(spark_dir, tmp_path_factory):
    """The session's shared classic JVM, with the upstream tables and the catalog's information_schema."""
    from heartbeat_runner.core.settings import load_settings
    from heartbeat_runner.engines.engine import open_engine

    settings = load_settings(lakehouse_dir=str(tmp_path_factory.mktemp("remote-sensing")),
                             env={"HEARTBEAT_TARGET": "spark-local", "HEARTBEAT_SPARK_MODE": "classic",
                                  "HEARTBEAT_SPARK_DIR": str(spark_dir / ENGINE_KIND)})
    local = open_engine(settings)
    session = local.spark
    session.sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    for name in TABLES:
        session.sql(f"CREATE OR REPLACE TABLE {SCHEMA}.{name} (id INT) USING delta")
        session.sql(f"INSERT INTO {SCHEMA}.{name} VALUES (1)")
    keep_information_schema(session)
    yield session
    local.close()


def keep_information_schema(spark: Any) -> None:
    """Unity Catalog's ``information_schema.tables`` as the tests keep it: an empty Delta table (catalog_says
    writes its rows)."""
    spark.sql("CREATE SCHEMA IF NOT EXISTS information_schema")
    spark.sql("CREATE OR REPLACE TABLE information_schema.tables (table_catalog STRING, table_schema STRING, "
              "table_name STRING, table_type STRING, last_altered TIMESTAMP) USING delta")


def catalog_says(spark: Any, name: str, *, table_type: str = "MANAGED", altered: str = "now") -> None:
    """The catalog's row of ``name``: its type, and last altered ``now`` or a day ago."""
    spark.sql("DELETE FROM information_schema.tables WHERE table_name = :name", args={"name": name})
    spark.sql("INSERT INTO information_schema.tables SELECT :catalog, :schema, :name, :type, "
              + ("current_timestamp()" if altered == "now" else "current_timestamp() - INTERVAL 1 DAY"),
              args={"catalog": CATALOG, "schema": SCHEMA, "name": name, "type": table_type})


def version_of(spark: Any, name: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {SCHEMA}.{name} LIMIT 1").collect()[0]["version"])


def remote_engine(spark: Any, tmp_path, **env: str):
    """An engine as on Databricks (``TableOps``: no log listing), on a recording view of the session."""
    from heartbeat_runner.core.settings import Target, load_settings
    from heartbeat_runner.engines.engine import Engine, TableOps

    settings = load_settings(lakehouse_dir=str(tmp_path / "lakehouse"),
                             env={"HEARTBEAT_TARGET": Target.DATABRICKS.value, "HEARTBEAT_CATALOG": CATALOG, **env})
    return Engine(session=Recording(spark), settings=settings, ops=TableOps())


def target(name: str, version: int, taken: datetime) -> SensingTarget:
    return SensingTarget(source_key=f"delta_table:{CATALOG}.{SCHEMA}.{name}", sensor_source="delta_table",
                         sensor_id=f"{CATALOG}.{SCHEMA}.{name}", upstream_key=None, preprocess_query=None,
                         sensor_read_type="batch", cursor=dump_cursor({"version": version}), cursor_ts=taken)


def ruled_out(engine, targets: list[SensingTarget], tmp_path) -> set[str]:
    """The tables the bulk look rules out (the others are sensed from their history)."""
    from heartbeat_runner.sensing.sources.delta_table import DeltaTableSource

    found = DeltaTableSource().unchanged(targets, SenseContext(engine=engine, trigger_dir=tmp_path))
    return {key.rsplit(".", 1)[1] for key in found}


def test_history_reads_are_bounded_by_the_versions_a_tick_needs(spark, tmp_path):
    """Row 5: DESCRIBE HISTORY had no LIMIT: a changed table read its whole history (30 days of a streaming
    table's commits) every tick."""
    from heartbeat_runner.engines.engine import HISTORY_SLACK

    for value in range(2, 8):
        spark.sql(f"INSERT INTO {SCHEMA}.streamed VALUES ({value})")
    engine = remote_engine(spark, tmp_path)
    latest = version_of(spark, "streamed")
    assert engine.data_changed_between(f"{SCHEMA}.streamed", latest - 2, latest)
    (history,) = [text for text, _ in engine.session.queries if text.startswith("DESCRIBE HISTORY")]
    assert history.endswith(f"LIMIT {2 + HISTORY_SLACK}") and engine.ops.history_rows == 2 + HISTORY_SLACK
    assert engine.data_changed_between(f"{SCHEMA}.streamed", 0, latest)  # a range wider than the limit: changed


def test_catalog_times_are_compared_in_utc_whatever_the_session_and_process_zone(spark, tmp_path):
    """Row 3: last_altered came back as a naive time in the session's zone and was taken as UTC: west of UTC a
    table altered a minute ago looked altered hours before its cursor, and was ruled out (its data missed)."""
    engine = remote_engine(spark, tmp_path)
    catalog_says(spark, "zoned", altered="now")
    taken = datetime.now(timezone.utc) - timedelta(minutes=2)
    before_tz, before_zone = os.environ.get("TZ"), spark.conf.get("spark.sql.session.timeZone")
    os.environ["TZ"] = "America/Los_Angeles"
    time.tzset()
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        assert "zoned" not in ruled_out(engine, [target("zoned", version_of(spark, "zoned"), taken)], tmp_path)
        entry = engine.catalog_look([f"{CATALOG}.{SCHEMA}.zoned"])[f"{CATALOG}.{SCHEMA}.zoned"]
        assert abs(entry.last_altered - datetime.now(timezone.utc)) < timedelta(minutes=1)
    finally:
        os.environ.pop("TZ") if before_tz is None else os.environ.__setitem__("TZ", before_tz)
        time.tzset()
        spark.conf.set("spark.sql.session.timeZone", before_zone)


def test_a_failing_look_is_retried_with_back_off_warned_and_counted_never_switched_off(spark, tmp_path, caplog):
    """Row 2: one failure switched the look off for the rest of the process, logged at INFO; every later tick
    paid a history read per table."""
    from heartbeat_runner.core.metrics import metrics

    catalog_says(spark, "managed", altered="yesterday")
    engine = remote_engine(spark, tmp_path)
    targets = [target("managed", version_of(spark, "managed"), datetime.now(timezone.utc))]
    failures = metrics().registry.get_sample_value("heartbeat_catalog_look_failures_total",
                                                   {"kind": "transient"}) or 0.0
    engine.session.fail_looks = True
    with caplog.at_level(logging.WARNING):
        assert ruled_out(engine, targets, tmp_path) == set()  # in doubt: sensed from its history
    assert any(r.levelno == logging.WARNING and "catalog look of spark_catalog failed" in r.getMessage()
               for r in caplog.records)
    assert metrics().registry.get_sample_value("heartbeat_catalog_look_failures_total",
                                               {"kind": "transient"}) == failures + 1
    engine.session.fail_looks = False
    asked = len(engine.session.looks())
    assert ruled_out(engine, targets, tmp_path) == set() and len(engine.session.looks()) == asked  # backing off
    failed, _ = engine._look_failures[CATALOG]
    engine._look_failures[CATALOG] = (failed, time.monotonic())  # the back-off is over
    assert ruled_out(engine, targets, tmp_path) == {"managed"}  # asked again, and used
    assert CATALOG not in engine._look_failures


def test_the_look_asks_only_for_the_sensed_tables_with_bound_values(spark, tmp_path):
    """Row 4: the look scanned the whole catalog every tick, with no filter on the tables Heartbeat senses."""
    catalog_says(spark, "managed", altered="yesterday")
    catalog_says(spark, "other", altered="yesterday")
    engine = remote_engine(spark, tmp_path)
    taken = datetime.now(timezone.utc)
    assert ruled_out(engine, [target("managed", version_of(spark, "managed"), taken)], tmp_path) == {"managed"}
    (look,) = engine.session.looks()
    text, args = look
    assert sorted(args.values()) == ["managed", SCHEMA]
    assert "managed" not in text and SCHEMA not in text  # names are bound, never spliced into the SQL


def test_tables_the_catalog_cannot_vouch_for_are_sensed_from_their_history(spark, tmp_path, caplog, monkeypatch):
    """Row 1: last_altered is not moved by writes that bypass Unity Catalog (an external table written at its
    path by another engine): such a table was ruled out and its data never seen. Now an EXTERNAL table, a table
    whose last_altered lags its history (found by a spot check, logged once) and a table named in
    HEARTBEAT_CATALOG_LOOK_SKIP are sensed from their history."""
    from heartbeat_runner.sensing.sources import delta_table

    taken = datetime.now(timezone.utc)
    for name, table_type in (("managed", "MANAGED"), ("external", "EXTERNAL"), ("lagging", "MANAGED"),
                             ("skipped", "MANAGED")):
        catalog_says(spark, name, table_type=table_type, altered="yesterday")
    cursors = {name: version_of(spark, name) for name in ("managed", "external", "lagging", "skipped")}
    for name in ("external", "lagging", "skipped"):  # commits the catalog does not show
        spark.sql(f"INSERT INTO {SCHEMA}.{name} VALUES (9)")
    targets = [target(name, version, taken) for name, version in cursors.items()]

    monkeypatch.setattr(delta_table, "CATALOG_SPOT_CHECKS", 0)
    engine = remote_engine(spark, tmp_path, HEARTBEAT_CATALOG_LOOK_SKIP=f"{CATALOG}.{SCHEMA}.skipped")
    assert ruled_out(engine, targets, tmp_path) == {"managed", "lagging"}  # external and skipped: sensed

    monkeypatch.setattr(delta_table, "CATALOG_SPOT_CHECKS", 1)
    with caplog.at_level(logging.WARNING):
        found = [ruled_out(engine, targets, tmp_path) for _ in range(3)]  # the spot checks take turns
    assert found[-1] == {"managed"} and "lagging" not in set.union(*found[1:])
    lag_logs = [r for r in caplog.records if "last_altered does not show" in r.getMessage()]
    assert len(lag_logs) == 1 and "lagging" in lag_logs[0].getMessage()


def test_a_look_at_more_tables_than_a_batch_asks_in_batches_and_answers_for_every_table(spark, tmp_path, monkeypatch):
    """A deployment with thousands of Delta sources named every table in one statement (a parameter per name):
    the look now asks CATALOG_LOOK_BATCH names per query (here 3, for 7 tables: 3 queries), and the merged answer
    is the one a single query gives."""
    from heartbeat_runner.engines import engine as engine_module

    for name in TABLES:
        catalog_says(spark, name, altered="yesterday")
    names = [f"{CATALOG}.{SCHEMA}.{name}" for name in TABLES]
    whole = remote_engine(spark, tmp_path).catalog_look(names)
    monkeypatch.setattr(engine_module, "CATALOG_LOOK_BATCH", 3)
    batched = remote_engine(spark, tmp_path)
    assert batched.catalog_look(names) == whole and set(whole) == set(names)
    looks = batched.session.looks()
    assert len(looks) == 3
    assert sorted(len([k for k in args if k.startswith("t")]) for _, args in looks) == [1, 3, 3]


def test_a_catalog_without_information_schema_is_found_without_a_failing_query(spark, tmp_path, caplog):
    """A Hive metastore catalog (Databricks' ``hive_metastore``, a plain Spark catalog) has no information_schema.
    A look at it was a query that failed, and Spark logged that failure as an ERROR before Heartbeat fell back:
    a scheduled one-shot tick, a new process each run, logged an ERROR and a warning at every run. The engine
    now asks the catalog whether the schema exists, sends no query at it, says so once at INFO, senses the
    tables from their history, and asks again at the back-off's end, when the look works once the schema is
    there."""
    from heartbeat_runner.core.metrics import metrics

    catalog_says(spark, "managed", altered="yesterday")
    targets = [target("managed", version_of(spark, "managed"), datetime.now(timezone.utc))]
    failed = {kind: metrics().registry.get_sample_value("heartbeat_catalog_look_failures_total", {"kind": kind})
              for kind in ("terminal", "transient")}
    spark.sql("DROP SCHEMA information_schema CASCADE")
    try:
        engine = remote_engine(spark, tmp_path)
        with caplog.at_level(logging.INFO):
            assert ruled_out(engine, targets, tmp_path) == set()  # sensed from its history
            assert ruled_out(engine, targets, tmp_path) == set()  # backing off: not asked again
        assert engine.session.looks() == [], "no query was sent at the missing information_schema"
        said = [r for r in caplog.records if "information_schema" in r.getMessage()]
        assert [(r.levelno, r.getMessage().split(":")[0]) for r in said] == [
            (logging.INFO, f"{CATALOG} has no information_schema (a Hive metastore or a plain Spark catalog)")]
        assert {kind: metrics().registry.get_sample_value("heartbeat_catalog_look_failures_total", {"kind": kind})
                for kind in failed} == failed, "an absent schema is not a failed look"
    finally:
        keep_information_schema(spark)  # as the module's other tests expect it
    catalog_says(spark, "managed", altered="yesterday")
    engine._look_failures[CATALOG] = (0, time.monotonic())  # the back-off is over
    assert ruled_out(engine, targets, tmp_path) == {"managed"}  # asked again: the look is there, and used
    assert len(engine.session.looks()) == 1 and CATALOG not in engine._look_failures
