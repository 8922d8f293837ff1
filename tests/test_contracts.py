"""Contracts derived, not copied: the order in which the views are re-created comes from dbt's graph."""

from __future__ import annotations

import re
from pathlib import Path

from harness import Harness
from harness import config_row as row

from heartbeat_runner.lakehouse.dbt_invoke import view_models

MODELS = Path(__file__).resolve().parents[1] / "models"


def test_the_views_are_every_view_model_each_after_the_views_it_reads(tmp_path):
    with Harness(tmp_path) as hb:
        hb.seed(row("trigger_file", "drops", "J"))
        order = view_models(hb.app.dbt.manifest())
        views = {p.stem for p in MODELS.glob("*.sql") if "materialized='view'" in p.read_text()}
        assert sorted(order) == sorted(views)
        for position, name in enumerate(order):
            reads = set(re.findall(r"ref\('([a-z_]+)'\)", (MODELS / f"{name}.sql").read_text())) & views
            assert reads <= set(order[:position]), f"{name} reads {reads - set(order[:position])} created after it"
        # the local catalog forgets views: they are re-created from the compiled SQL in that order
        for name in order:
            hb.spark.sql(f"DROP VIEW IF EXISTS heartbeat.{name}")
        assert hb.app.dbt.restore_views()
        assert {t.name for t in hb.spark.catalog.listTables("heartbeat")} >= set(order)
