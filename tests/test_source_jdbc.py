"""The ``jdbc`` source against a real PostgreSQL."""

from __future__ import annotations

import base64
import json
import logging
import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from databricks_jobs_server import TOKEN, JobsApiServer
from jdbc_orders import SOURCE, baseline_then_two_new_rows, insert, keys_as_event_times, sense, table  # noqa: F401 (fixture)
from services import PG_READER_PASSWORD, assert_config_check, engine, free_port, postgres, sense_context, sensing_target  # noqa: F401 (fixtures)

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.jobs.databricks_workspace import DatabricksSecrets


@pytest.fixture
def ctx(engine, postgres):
    return sense_context(engine, {"jdbc": {"warehouse": {"url": postgres.url()}}})


@pytest.mark.parametrize("sensor_id, upstream_key, problem", [
    ("warehouse:public.orders", "loaded_at", None),
    ("warehouse: orders", "id", None),
    ("public.orders", "id", "must be <connection>:<table>"),
    ("warehouse:public.orders", None, "upstream_key is required"),
    ("warehouse:public.orders;drop table x", "id", "not a valid SQL name"),
    ("warehouse:a.b.c", "id", "must be table or schema.table"),
    ("ware house:orders", "id", "connection name"),
])
def test_check_config(sensor_id, upstream_key, problem):
    assert_config_check(SOURCE, sensor_id, upstream_key, problem)


def test_baseline_then_new_rows_by_key(ctx, postgres, table):
    first = baseline_then_two_new_rows(ctx, postgres, table)

    assert not sense(ctx, table, first.cursor_to).new_data
    insert(postgres, table, ("us", "2026-01-04 00:00:00"))
    second = sense(ctx, table, first.cursor_to)
    assert second.new_data and second.rows == 1
    assert json.loads(second.cursor_to)["value"]["value"] == "2026-01-04T00:00:00"


def test_keys_are_event_times_for_jobs_with_a_window_policy(ctx, postgres, table):
    keys_as_event_times(ctx, postgres, table)


def test_event_times_are_the_same_when_counted_here_instead_of_in_the_database(ctx, postgres, table, monkeypatch):
    """A dialect without an epoch function in EPOCH_SECONDS sends its distinct keys; the count agrees."""
    from heartbeat_runner.sensing.sources import jdbc

    in_database = keys_as_event_times(ctx, postgres, table)
    monkeypatch.delitem(jdbc.EPOCH_SECONDS, "postgresql")
    postgres.execute(f"DELETE FROM {table}")
    assert keys_as_event_times(ctx, postgres, table).event_times == in_database.event_times


def test_sqlite_counts_event_times_in_the_database(engine, tmp_path):
    import sqlite3

    from heartbeat_runner.sensing.sources import jdbc

    assert "sqlite" in jdbc.EPOCH_SECONDS
    with sqlite3.connect(tmp_path / "shop.db") as db:
        db.execute("CREATE TABLE visits (id integer, loaded_at timestamp)")
        db.execute("INSERT INTO visits VALUES (1, '2026-01-01 23:30:00')")
    ctx = sense_context(engine, {"jdbc": {"shop": {"url": f"sqlite:///{tmp_path / 'shop.db'}"}}})
    target = sensing_target("jdbc", "shop:visits", None, "loaded_at")
    ctx.event_time_grains = {target.source_key: 3600}
    baseline = SOURCE.sense(target, ctx)
    with sqlite3.connect(tmp_path / "shop.db") as db:
        db.executemany("INSERT INTO visits VALUES (?, ?)", [(2, "2026-01-02 00:10:00"), (3, "2026-01-02 02:05:00")])
    found = SOURCE.sense(replace(target, cursor=baseline.cursor_to), ctx)
    start = int(datetime(2026, 1, 2, tzinfo=timezone.utc).timestamp())
    assert found.rows == 2 and found.event_times.buckets == {start: 1, start + 7200: 1}


def test_integer_key_and_empty_table_baseline(ctx, postgres, table):
    baseline = sense(ctx, table, upstream_key="id")
    assert json.loads(baseline.cursor_to) == {"value": None}
    insert(postgres, table, ("eu", "2026-01-01"))
    result = sense(ctx, table, baseline.cursor_to, upstream_key="id")
    assert result.new_data and json.loads(result.cursor_to) == {"value": {"type": "int", "value": "1"}}


def test_replay_counts_every_row_of_a_new_sensor(engine, postgres, table):
    insert(postgres, table, ("eu", "2026-01-01"), ("us", "2026-01-02"))
    ctx = sense_context(engine, {"jdbc": {"warehouse": {"url": postgres.url()}}}, replay=True)
    result = sense(ctx, table)
    assert result.new_data and result.rows == 2 and result.window_from == "beginning"


def test_preprocess_query_filters_rows_and_the_cursor_still_advances(ctx, postgres, table):
    query = ("SELECT * FROM sensor_new_data "
             "WHERE region = 'eu' AND ?upstream_key >= timestamp'2026-01-01' AND amount > 1")
    baseline = sense(ctx, table).cursor_to
    insert(postgres, table, ("us", "2026-02-01 00:00:00"))
    filtered = sense(ctx, table, baseline, preprocess_query=query)
    assert not filtered.new_data and filtered.rows == 0
    assert json.loads(filtered.cursor_to)["value"]["value"] == "2026-02-01T00:00:00"

    insert(postgres, table, ("us", "2026-02-02 00:00:00"), ("eu", "2026-02-03 00:00:00"))
    kept = sense(ctx, table, filtered.cursor_to, preprocess_query=query)
    assert kept.new_data and kept.rows == 1


def test_secret_from_the_environment(engine, postgres, table, monkeypatch):
    monkeypatch.setenv("TEST_WAREHOUSE_URL", postgres.url())
    ctx = sense_context(engine, {"jdbc": {"warehouse": {"url": {"env": "TEST_WAREHOUSE_URL"}}}})
    assert sense(ctx, table).cursor_to is not None
    monkeypatch.delenv("TEST_WAREHOUSE_URL")
    with pytest.raises(SourceError, match="needs environment variable TEST_WAREHOUSE_URL"):
        sense(ctx, table)


def test_secret_from_a_databricks_secret_scope_never_shows_its_value(engine, postgres, table, monkeypatch, caplog,
                                                                    capsys):
    """``url: {secret: scope/key}`` is read through the workspace's secrets API (the stand-in, over HTTP,
    with the SDK's auth chain from DATABRICKS_HOST/DATABRICKS_TOKEN) each time the source connects. A missing
    key, or no credentials, is one error naming the file, connection, setting, scope and key. The URL's
    password appears in no error, no log line (the SDK's debug log included) and no output."""
    canary = postgres.url()
    monkeypatch.delenv("DATABRICKS_CONFIG_PROFILE", raising=False)
    errors = []
    caplog.set_level(logging.DEBUG)
    with JobsApiServer() as workspace:
        workspace.workspace.put_secret("heartbeat", "warehouse-url", canary)
        monkeypatch.setenv("DATABRICKS_HOST", workspace.host)
        monkeypatch.setenv("DATABRICKS_TOKEN", TOKEN)
        entry: dict = {"url": {"secret": "heartbeat/warehouse-url"}}
        ctx = sense_context(engine, {"jdbc": {"warehouse": entry}})
        ctx.secrets = DatabricksSecrets()  # as App.sense_context wires it: the client from the auth chain
        found = baseline_then_two_new_rows(ctx, postgres, table)  # three senses: baseline, nothing, two rows
        assert found.new_data and found.rows == 2 and PG_READER_PASSWORD not in (found.cursor_to or "")
        assert workspace.workspace.reads["heartbeat/warehouse-url"] == 3, "read at each connect, never kept"

        entry["url"] = {"secret": "heartbeat/no-such-key"}
        with pytest.raises(SourceError) as missing:
            sense(ctx, table)
        errors.append(str(missing.value))
        assert str(missing.value).startswith("heartbeat_sources.yml: jdbc.warehouse, setting 'url': "
                                             "{secret: heartbeat/no-such-key}: secret scope 'heartbeat' has no key "
                                             "'no-such-key'")
        entry["url"] = {"secret": "heartbeat/warehouse-url"}
        monkeypatch.setenv("DATABRICKS_TOKEN", "dapi-wrong")
        with pytest.raises(SourceError, match=r"\{secret: heartbeat/warehouse-url\}: secret heartbeat/warehouse-url: "
                                              "Databricks refused our credentials") as refused:
            sense(_with_secrets(sense_context(engine, {"jdbc": {"warehouse": entry}})), table)
        errors.append(str(refused.value))
    monkeypatch.delenv("DATABRICKS_HOST")
    monkeypatch.delenv("DATABRICKS_TOKEN")
    with pytest.raises(SourceError, match=r"setting 'url': \{secret: heartbeat/warehouse-url\}: Databricks "
                                          "authentication is not configured"):
        sense(_with_secrets(sense_context(engine, {"jdbc": {"warehouse": entry}})), table)
    shown = capsys.readouterr()
    encoded = base64.b64encode(canary.encode()).decode()
    for text in (*errors, caplog.text, shown.out, shown.err):
        assert PG_READER_PASSWORD not in text and encoded not in text


def _with_secrets(ctx):
    ctx.secrets = DatabricksSecrets()
    return ctx


def test_url_from_the_environment_fallback(engine, postgres, table, monkeypatch):
    monkeypatch.setenv("HEARTBEAT_JDBC_WAREHOUSE_URL", postgres.url())
    assert sense(sense_context(engine), table).cursor_to is not None


def test_missing_table_and_column_are_clear_errors(ctx, table):
    with pytest.raises(SourceError, match=r'jdbc .*relation "public.no_such_table" does not exist'):
        sense(ctx, "no_such_table")
    with pytest.raises(SourceError, match='column .*no_such_column does not exist'):
        sense(ctx, table, upstream_key="no_such_column")


def test_wrong_password_is_a_clear_error_without_the_password(engine, postgres, table):
    ctx = sense_context(engine, {"jdbc": {"warehouse": {"url": postgres.url(password="wrong-pw")}}})
    with pytest.raises(SourceError, match='password authentication failed for user "reader"') as caught:
        sense(ctx, table)
    assert "wrong-pw" not in str(caught.value) and "***" in str(caught.value)


def test_unreachable_database_fails_fast(engine):
    url = f"postgresql+psycopg2://reader:x@127.0.0.1:{free_port()}/postgres"
    ctx = sense_context(engine, {"jdbc": {"warehouse": {"url": url}}})
    began = time.monotonic()
    with pytest.raises(SourceError, match="cannot connect to .*Connection refused"):
        sense(ctx, "orders")
    assert time.monotonic() - began < 5


def test_unknown_connection_and_bad_url(engine):
    with pytest.raises(SourceError, match=r"add jdbc\.warehouse to .* or set HEARTBEAT_JDBC_WAREHOUSE_URL"):
        sense(sense_context(engine), "orders")
    with pytest.raises(SourceError, match="not a SQLAlchemy URL"):
        sense(sense_context(engine, {"jdbc": {"warehouse": {"url": "not a url"}}}), "orders")
    with pytest.raises(SourceError, match=r"jdbc\.warehouse: unknown setting\(s\) connect_timeout; expected url"):
        sense(sense_context(engine, {"jdbc": {"warehouse": {"url": "sqlite://", "connect_timeout": 3}}}), "orders")


# --- reader: spark, settings and the embedded engine (the Spark reader itself: test_source_jdbc_spark.py) ---

def spark_entry(postgres, **settings):
    return {"reader": "spark", "jdbc_url": f"jdbc:postgresql://127.0.0.1:{postgres.port}/postgres", "user": "reader",
            "password": {"env": "TEST_PG_PASSWORD"}, **settings}


@pytest.mark.parametrize("settings, problem", [
    ({"reader": "odbc"}, "jdbc.warehouse: reader 'odbc' is not one of sqlalchemy, spark"),
    ({"password": "reader-secret"}, "jdbc.warehouse: the password must come from the environment"),
    ({"fetch_size": 10}, "jdbc.warehouse: unknown setting(s) fetch_size; expected reader, jdbc_url, user"),
    ({"jdbc_url": "postgresql://h/db"}, "reader spark needs jdbc_url, a JDBC URL"),
    ({"jdbc_url": "jdbc:postgresql://h/db?user=reader&password=reader-secret"}, "must not carry the password"),
    ({"options": {"password": "x"}}, "options must map JDBC option names to values, other than dbtable"),
])
def test_spark_reader_settings_are_checked(engine, postgres, monkeypatch, settings, problem):
    monkeypatch.setenv("TEST_PG_PASSWORD", "reader-secret")
    ctx = sense_context(engine, {"jdbc": {"warehouse": spark_entry(postgres, **settings)}})
    with pytest.raises(SourceError) as caught:
        sense(ctx, "orders")
    assert problem in str(caught.value) and "reader-secret" not in str(caught.value)


def test_spark_reader_on_the_embedded_engine_is_a_clear_error(engine, postgres, monkeypatch):
    monkeypatch.setenv("TEST_PG_PASSWORD", "reader-secret")
    ctx = sense_context(engine, {"jdbc": {"warehouse": spark_entry(postgres)}})
    with pytest.raises(SourceError, match=r"jdbc 'warehouse:public.orders': the Spark JDBC reader \(reader: spark\) "
                                          r"needs Apache Spark or Databricks; the embedded engine \(Sail\)"):
        sense(ctx, "orders")


def test_reader_from_the_environment_fallback(engine, postgres, monkeypatch):
    monkeypatch.setenv("HEARTBEAT_JDBC_WAREHOUSE_READER", "spark")
    monkeypatch.setenv("HEARTBEAT_JDBC_WAREHOUSE_JDBC_URL", "jdbc:postgresql://127.0.0.1:1/postgres")
    with pytest.raises(SourceError, match="needs Apache Spark or Databricks"):
        sense(sense_context(engine), "orders")
