"""The ``sap_bw``/``sap_b4`` sources against an RSPCLOGCHAIN-shaped chain log in a real PostgreSQL."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from services import assert_config_check, engine, free_port, postgres, sense_context, sensing_target  # noqa: F401 (fixtures)

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.sensing.sources.sap_chain import SapChainSource

SOURCE = SapChainSource()


@pytest.fixture(scope="module")
def chain_log(postgres) -> None:
    """SAP's RSPCLOGCHAIN in schema sapabap1 (upper-case names, DATS/TIMS as text), and a custom log."""
    postgres.execute(
        'CREATE SCHEMA IF NOT EXISTS "SAPABAP1"',
        'CREATE TABLE IF NOT EXISTS "SAPABAP1"."RSPCLOGCHAIN" ("CHAIN_ID" varchar(25), "LOG_ID" varchar(25), '
        '"DATUM" varchar(8), "ZEIT" varchar(6), "ANALYZED_STATUS" varchar(1))',
        "CREATE TABLE IF NOT EXISTS public.chain_runs (chain text, run_day date, run_time time, state text)",
        'GRANT USAGE ON SCHEMA "SAPABAP1" TO reader',
        'GRANT SELECT ON ALL TABLES IN SCHEMA "SAPABAP1" TO reader',
        "GRANT SELECT ON public.chain_runs TO reader",
    )


@pytest.fixture
def chain(chain_log) -> str:
    return f"ZCHAIN_{uuid.uuid4().hex[:8].upper()}"


@pytest.fixture
def ctx(engine, postgres):
    return sense_context(engine, {"sap": {"default": {"url": postgres.url(), "schema": "SAPABAP1"}}})


def run(postgres, chain: str, datum: str, zeit: str, status: str = "G") -> None:
    postgres.execute('INSERT INTO "SAPABAP1"."RSPCLOGCHAIN" VALUES (:c, :log, :d, :z, :s)',
                     params={"c": chain, "log": uuid.uuid4().hex[:25], "d": datum, "z": zeit, "s": status})


def sense(ctx, chain: str, cursor: str | None = None, source: str = "sap_b4", **fields):
    return SOURCE.sense(sensing_target(source, chain, cursor, **fields), ctx)


@pytest.mark.parametrize("sensor_id, upstream_key, problem", [
    ("SAP_BW_CHAIN_ID_SAP_TABLE", "LOAD_DATE", None),
    ("bw_prod:ZCHAIN_1", None, None),
    ("ZCHAIN_1", "load_date", None),
    ("", None, "process chain id"),
    ("bw_prod:Z CHAIN", None, "process chain id"),
    ("bw prod:ZCHAIN", None, "SAP system"),
    ("ZCHAIN_1", "DATUM", "upstream_key 'DATUM'"),
])
def test_check_config(sensor_id, upstream_key, problem):
    assert_config_check(SOURCE, sensor_id, upstream_key, problem)


def test_baseline_then_only_later_green_runs(ctx, postgres, chain):
    run(postgres, chain, "20260101", "230000")
    run(postgres, chain, "20260102", "010000")
    run(postgres, chain, "20260102", "020000", status="R")  # a failed run is never new data
    run(postgres, f"{chain}_OTHER", "20260105", "000000")
    baseline = sense(ctx, chain)
    assert not baseline.new_data and json.loads(baseline.cursor_to) == {"load_date": "20260102010000"}

    assert not sense(ctx, chain, baseline.cursor_to, source="sap_bw").new_data
    run(postgres, chain, "20260102", "050000", status="A")  # still running
    assert not sense(ctx, chain, baseline.cursor_to).new_data

    run(postgres, chain, "20260102", "003000")  # earlier the same day: already covered
    run(postgres, chain, "20260102", "061500")
    first = sense(ctx, chain, baseline.cursor_to)
    assert first.new_data and first.rows == 1
    assert first.window_from == "LOAD_DATE > 20260102010000" and first.window_to == "LOAD_DATE <= 20260102061500"

    assert not sense(ctx, chain, first.cursor_to).new_data
    run(postgres, chain, "20260103", "000100")
    run(postgres, chain, "20260104", "120000")
    second = sense(ctx, chain, first.cursor_to)
    assert second.new_data and second.rows == 2
    assert json.loads(second.cursor_to) == {"load_date": "20260104120000"}


def test_chain_without_green_runs(ctx, postgres, chain):
    baseline = sense(ctx, chain)
    assert json.loads(baseline.cursor_to) == {"load_date": None}
    run(postgres, chain, "20260101", "000000")
    assert sense(ctx, chain, baseline.cursor_to).new_data


def test_replay_counts_every_green_run(engine, postgres, chain):
    run(postgres, chain, "20260101", "010000")
    run(postgres, chain, "20260102", "010000")
    ctx = sense_context(engine, {"sap": {"default": {"url": postgres.url(), "schema": "SAPABAP1"}}}, replay=True)
    result = sense(ctx, chain)
    assert result.new_data and result.rows == 2 and result.window_from == "beginning"


def test_preprocess_query_sees_load_date_as_a_timestamp(ctx, postgres, chain):
    query = "SELECT * FROM sensor_new_data WHERE hour(?upstream_key) >= 6 AND CHAIN_ID IS NOT NULL"
    baseline = sense(ctx, chain).cursor_to
    run(postgres, chain, "20260110", "030000")
    filtered = sense(ctx, chain, baseline, upstream_key="LOAD_DATE", preprocess_query=query)
    assert not filtered.new_data and json.loads(filtered.cursor_to) == {"load_date": "20260110030000"}
    run(postgres, chain, "20260110", "070000")
    kept = sense(ctx, chain, filtered.cursor_to, upstream_key="LOAD_DATE", preprocess_query=query)
    assert kept.new_data and kept.rows == 1


def test_configured_chain_log_and_named_system(engine, postgres, chain):
    """Another system whose log has other names, types (date/time) and status codes."""
    settings = {"url": postgres.url(), "table": "public.chain_runs", "green_status": "OK",
                "columns": {"chain_id": "chain", "date": "run_day", "time": "run_time", "status": "state"}}
    ctx = sense_context(engine, {"sap": {"bw_prod": settings}})
    postgres.execute("INSERT INTO public.chain_runs VALUES (:c, '2026-03-01', '08:00:00', 'OK')", params={"c": chain})
    baseline = sense(ctx, f"bw_prod:{chain}")
    assert json.loads(baseline.cursor_to) == {"load_date": "20260301080000"}
    postgres.execute("INSERT INTO public.chain_runs VALUES (:c, '2026-03-01', '09:30:00', 'OK')", params={"c": chain})
    assert sense(ctx, f"bw_prod:{chain}", baseline.cursor_to).new_data


def test_missing_chain_log_table_is_a_clear_error(engine, postgres, chain):
    ctx = sense_context(engine, {"sap": {"default": {"url": postgres.url()}}})  # no schema: public.RSPCLOGCHAIN
    with pytest.raises(SourceError, match=r'sap_b4 chain .* SAP system .default.*"RSPCLOGCHAIN" does not exist'):
        sense(ctx, chain)


def test_unknown_system_names_the_settings_to_add(ctx, chain):
    with pytest.raises(SourceError, match=r"sap\.bw_qa to heartbeat_sources.yml or set HEARTBEAT_SAP_BW_QA_URL"):
        sense(ctx, f"bw_qa:{chain}")


def test_wrong_password_is_a_clear_error(engine, postgres, chain):
    ctx = sense_context(engine, {"sap": {"default": {"url": postgres.url(password="nope"), "schema": "SAPABAP1"}}})
    with pytest.raises(SourceError, match="cannot connect to .*password authentication failed"):
        sense(ctx, chain)


def test_unreachable_system_fails_fast(engine, chain):
    ctx = sense_context(engine, {"sap": {"default": {"url": f"postgresql://u:p@127.0.0.1:{free_port()}/sap"}}})
    began = time.monotonic()
    with pytest.raises(SourceError, match="cannot connect to postgresql://u:\\*\\*\\*@"):
        sense(ctx, chain)
    assert time.monotonic() - began < 5


def test_missing_hana_driver_says_what_to_install(engine, chain):
    ctx = sense_context(engine, {"sap": {"default": {"url": "hana://u:p@127.0.0.1:30015"}}})
    try:
        import sqlalchemy_hana  # noqa: F401
    except ImportError:
        with pytest.raises(SourceError, match=r"heartbeat-runner\[hana\]"):
            sense(ctx, chain)
    else:
        pytest.skip("the hana driver is installed")


def test_green_runs_are_event_times_for_jobs_with_a_window_policy(ctx, postgres, chain):
    """A chain read by a windowed job: each green run's LOAD_DATE is an event time, counted per hour."""
    from dataclasses import replace
    from datetime import datetime, timezone

    from services import sensing_target

    def epoch(text: str) -> int:
        return int(datetime.strptime(text, "%Y%m%d%H%M%S").replace(tzinfo=timezone.utc).timestamp())

    run(postgres, chain, "20260101", "230000")
    target = sensing_target("sap_b4", chain)
    ctx.event_time_grains = {target.source_key: 3600}
    baseline = SOURCE.sense(target, ctx)
    assert baseline.event_times.max_s == epoch("20260101230000")  # the watermark starts at the last green run
    for zeit in ("001500", "004500", "011000"):
        run(postgres, chain, "20260102", zeit)
    found = SOURCE.sense(replace(target, cursor=baseline.cursor_to), ctx)
    assert found.event_times.buckets == {epoch("20260102000000"): 2, epoch("20260102010000"): 1}
    assert found.event_times.max_s == epoch("20260102011000")
    ctx.event_time_grains = {}
    assert SOURCE.sense(replace(target, cursor=baseline.cursor_to), ctx).event_times is None
