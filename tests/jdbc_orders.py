"""The orders table both ``jdbc`` readers are tested on (the real PostgreSQL of services.py),
and the scenario they share: a baseline, then new rows by the ``loaded_at`` key."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest
from services import sensing_target

from heartbeat_runner.sensing.sources.jdbc import JdbcSource

SOURCE = JdbcSource()


@pytest.fixture
def table(postgres) -> str:
    """A fresh ``public.orders_<hex>`` (id serial, region, loaded_at, amount) the reader may select."""
    name = f"orders_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE TABLE public.{name} (id serial, region text, loaded_at timestamp, amount numeric(10,2))",
                     f"GRANT SELECT ON public.{name} TO reader")
    return name


def insert(postgres, table: str, *rows: tuple[str, str]) -> None:
    for region, loaded_at in rows:
        postgres.execute(f"INSERT INTO {table} (region, loaded_at, amount) VALUES (:r, :t, 1.5)",
                         params={"r": region, "t": loaded_at})


def sense(ctx, table: str, cursor: str | None = None, upstream_key: str = "loaded_at", **fields):
    return SOURCE.sense(sensing_target("jdbc", f"warehouse:public.{table}", cursor, upstream_key, **fields), ctx)


def baseline_then_two_new_rows(ctx, postgres, table: str):
    """Two rows, a baseline past them, nothing new, then two new rows: returns that sense's result."""
    insert(postgres, table, ("eu", "2026-01-01 10:00:00"), ("us", "2026-01-02 10:00:00"))
    baseline = sense(ctx, table)
    assert not baseline.new_data
    assert json.loads(baseline.cursor_to) == {"value": {"type": "datetime", "value": "2026-01-02T10:00:00"}}

    assert not sense(ctx, table, baseline.cursor_to).new_data
    insert(postgres, table, ("eu", "2026-01-03 08:00:00"), ("eu", "2026-01-03 09:00:00"))
    first = sense(ctx, table, baseline.cursor_to)
    assert first.new_data and first.rows == 2
    assert first.window_from == "loaded_at > 2026-01-02 10:00:00"
    assert first.window_to == "loaded_at <= 2026-01-03 09:00:00"
    return first


def epoch(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp())


def keys_as_event_times(ctx, postgres, table: str):
    """A table read by a job with an hourly window policy: the baseline starts the watermark at the last
    key; new rows' keys are event times counted per hour; a numeric key or no policy gives none."""
    insert(postgres, table, ("eu", "2026-01-01 23:30:00"))
    target = sensing_target("jdbc", f"warehouse:public.{table}", None, "loaded_at")
    ctx.event_time_grains = {target.source_key: 3600}
    baseline = sense(ctx, table)
    assert baseline.event_times.max_s == epoch("2026-01-01 23:30:00") and baseline.event_times.buckets == {}

    insert(postgres, table, ("eu", "2026-01-02 00:10:00"), ("us", "2026-01-02 00:50:00"), ("eu", "2026-01-02 00:50:00"),
           ("us", "2026-01-02 02:05:00"))
    found = sense(ctx, table, baseline.cursor_to)
    assert found.rows == 4
    assert found.event_times.buckets == {epoch("2026-01-02 00:00:00"): 3, epoch("2026-01-02 02:00:00"): 1}
    assert (found.event_times.min_s, found.event_times.max_s) == (epoch("2026-01-02 00:10:00"),
                                                                  epoch("2026-01-02 02:05:00"))
    ctx.event_time_grains = {}
    assert sense(ctx, table, baseline.cursor_to).event_times is None

    ctx.event_time_grains = {target.source_key: 3600}
    by_id = sense(ctx, table, upstream_key="id")  # ids are no time: no event times, no error
    insert(postgres, table, ("eu", "2026-01-02 03:00:00"))
    assert by_id.event_times is None and sense(ctx, table, by_id.cursor_to, upstream_key="id").event_times is None
    return found
