"""The orders table both ``jdbc`` readers are tested on (the real PostgreSQL of services.py),
and the scenario they share: a baseline, then new rows by the ``loaded_at`` key."""

from __future__ import annotations

import json
import uuid

import pytest
from services import sensing_target

from heartbeat_runner.sources.jdbc import JdbcSource

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
