"""The ``jdbc`` source with ``reader: spark`` (Spark's own JDBC source) on a real local Apache Spark
(classic session, the PostgreSQL driver jar on its classpath) against the real PostgreSQL of services.py.

One JVM for the module (10-30 s to start); the settings checks and the embedded engine's refusal,
which need no JVM, are in test_source_jdbc.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
from jdbc_orders import SOURCE, baseline_then_two_new_rows, insert, keys_as_event_times, sense, table  # noqa: F401 (fixture)
from services import PG_READER_PASSWORD, postgres, sense_context, sensing_target  # noqa: F401 (fixtures)

from heartbeat_runner.core.errors import SourceError

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not (shutil.which("java") and shutil.which("mvn")), reason="needs Java 17 and Maven"),
    pytest.mark.timeout(600),
]
pytest.importorskip("delta", reason="needs delta-spark: pip install 'heartbeat-runner[spark]'")

#: runs with the other Spark classic tests, on their JVM (see conftest.py)
ENGINE_KIND = "spark-classic"
PASSWORD_VAR = "TEST_SPARK_JDBC_PASSWORD"


@pytest.fixture(scope="module")
def spark_engine(spark_dir, tmp_path_factory):
    """The spark-local target (classic), on the session's shared JVM (conftest's spark_dir)."""
    from heartbeat_runner.core.settings import load_settings
    from heartbeat_runner.engines.engine import open_engine

    settings = load_settings(lakehouse_dir=str(tmp_path_factory.mktemp("jdbc-spark")),
                             env={"HEARTBEAT_TARGET": "spark-local", "HEARTBEAT_SPARK_MODE": "classic",
                                  "HEARTBEAT_SPARK_DIR": str(spark_dir / ENGINE_KIND)})
    engine = open_engine(settings)
    yield engine
    engine.close()


def spark_connection(postgres, password_var: str = PASSWORD_VAR) -> dict:
    return {"reader": "spark", "jdbc_url": f"jdbc:postgresql://127.0.0.1:{postgres.port}/postgres",
            "user": "reader", "password": {"env": password_var}}


@pytest.fixture
def ctx(spark_engine, postgres, monkeypatch):
    monkeypatch.setenv(PASSWORD_VAR, PG_READER_PASSWORD)
    return sense_context(spark_engine, {"jdbc": {"warehouse": spark_connection(postgres)}})


def test_keys_are_event_times_for_jobs_with_a_window_policy(ctx, postgres, table):
    keys_as_event_times(ctx, postgres, table)


def test_baseline_then_new_rows_by_key(ctx, postgres, table):
    first = baseline_then_two_new_rows(ctx, postgres, table)
    assert not sense(ctx, table, first.cursor_to).new_data

    by_id = sense(ctx, table, upstream_key="id")
    assert json.loads(by_id.cursor_to) == {"value": {"type": "int", "value": "4"}}
    insert(postgres, table, ("us", "2026-01-04 00:00:00"))
    second = sense(ctx, table, by_id.cursor_to, upstream_key="id")
    assert second.new_data and second.rows == 1
    assert json.loads(second.cursor_to) == {"value": {"type": "int", "value": "5"}}


def test_preprocess_query_filters_the_new_rows(ctx, postgres, table):
    query = ("SELECT * FROM sensor_new_data "
             "WHERE region = 'eu' AND ?upstream_key >= timestamp'2026-01-01' AND amount > 1")
    baseline = sense(ctx, table).cursor_to
    assert json.loads(baseline) == {"value": None}
    insert(postgres, table, ("us", "2026-02-01 00:00:00"))
    filtered = sense(ctx, table, baseline, preprocess_query=query)
    assert not filtered.new_data and filtered.rows == 0
    assert json.loads(filtered.cursor_to)["value"]["value"] == "2026-02-01T00:00:00"

    insert(postgres, table, ("us", "2026-02-02 00:00:00"), ("eu", "2026-02-03 00:00:00"))
    kept = sense(ctx, table, filtered.cursor_to, preprocess_query=query)
    assert kept.new_data and kept.rows == 1
    assert kept.window_from == "loaded_at > 2026-02-01 00:00:00"


def test_cursors_carry_over_between_the_readers(ctx, spark_engine, postgres, table):
    insert(postgres, table, ("eu", "2026-03-01 10:00:00"))
    by_sqlalchemy = sense_context(spark_engine, {"jdbc": {"warehouse": {"url": postgres.url()}}})
    baseline = sense(by_sqlalchemy, table).cursor_to
    insert(postgres, table, ("eu", "2026-03-02 10:00:00"), ("us", "2026-03-02 11:30:00.250000"))

    by_spark = sense(ctx, table, baseline)
    assert by_spark.new_data and by_spark.rows == 2
    assert by_spark.window_from == "loaded_at > 2026-03-01 10:00:00"
    assert json.loads(by_spark.cursor_to) == {"value": {"type": "datetime", "value": "2026-03-02T11:30:00.250000"}}
    assert not sense(ctx, table, by_spark.cursor_to).new_data

    insert(postgres, table, ("us", "2026-03-03 00:00:00"))
    back = sense(by_sqlalchemy, table, by_spark.cursor_to)
    assert back.new_data and back.rows == 1
    assert back.cursor_to == sense(ctx, table, by_spark.cursor_to).cursor_to


def test_errors_are_clear_and_never_show_the_password(spark_engine, postgres, table, monkeypatch):
    monkeypatch.setenv(PASSWORD_VAR, "wrong-pw-1234")
    wrong = sense_context(spark_engine, {"jdbc": {"warehouse": spark_connection(postgres)}})
    with pytest.raises(SourceError, match='password authentication failed for user "reader"') as caught:
        sense(wrong, table)
    message = str(caught.value)
    assert message.startswith(f"jdbc 'warehouse:public.{table}' (jdbc:postgresql://127.0.0.1:{postgres.port}/postgres"
                              " as reader): ")
    assert "wrong-pw-1234" not in message and caught.value.__cause__ is not None
    print("wrong password:", message)

    monkeypatch.setenv(PASSWORD_VAR, PG_READER_PASSWORD)
    right = sense_context(spark_engine, {"jdbc": {"warehouse": spark_connection(postgres)}})
    with pytest.raises(SourceError, match='relation "public.no_such_table" does not exist') as missing_table:
        sense(right, "no_such_table")
    with pytest.raises(SourceError, match="no_such_column") as missing_column:
        sense(right, table, upstream_key="no_such_column")
    print("missing table:", missing_table.value)
    print("missing column:", missing_column.value)
