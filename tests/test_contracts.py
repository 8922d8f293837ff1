"""Contracts derived, not copied: the order in which the views are re-created comes from dbt's graph."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from harness import Harness, project_copy, views_built_by_dbt
from harness import config_row as row

from heartbeat_runner.lakehouse.dbt_invoke import view_models

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"


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


def _columns(hb: Harness, view: str) -> list[str]:
    return hb.spark.table(f"heartbeat.{view}").columns


def test_after_an_upgrade_that_changed_a_view_the_next_start_creates_it_from_the_new_sql(tmp_path):
    """The local catalog forgets views at every start and they are re-created from dbt's last compiled
    SQL. An upgraded Heartbeat whose view changed must not re-create the old one from that SQL (it
    would serve the old view until someone ran `seed`): the first start after the upgrade builds the
    views again; the start after that restores them, without dbt."""
    project = project_copy(tmp_path)
    env = {"HEARTBEAT_PROJECT_DIR": str(project)}
    with Harness(tmp_path, **env) as hb:
        hb.seed(row("trigger_file", "drops", "J"))
        before = _columns(hb, "heartbeat_sensing_errors")
    with Harness(tmp_path, **env) as hb:
        assert hb.app.ensure_views(), "the same project: its views come back from the compiled SQL"
        assert _columns(hb, "heartbeat_sensing_errors") == before

    view = project / "models" / "heartbeat_sensing_errors.sql"
    view.write_text(view.read_text().replace("r.error as sensing_error\n",
                                             "r.error as sensing_error,\n  'new' as added_by_the_upgrade\n"))
    with Harness(tmp_path, **env) as hb:
        assert not hb.app.ensure_views(), "the compiled SQL is the older version's: dbt builds the views"
        assert _columns(hb, "heartbeat_sensing_errors") == [*before, "added_by_the_upgrade"]
        hb.tick()  # the tick reads the changed view as before
    with Harness(tmp_path, **env) as hb:
        assert hb.app.ensure_views()
        assert _columns(hb, "heartbeat_sensing_errors") == [*before, "added_by_the_upgrade"]


def test_a_second_seed_builds_the_tables_with_dbt_and_the_views_from_their_compiled_sql(tmp_path, monkeypatch):
    """A config load builds the control and sensor state tables with dbt; views whose SQL dbt compiled before
    from the same project and vars are created from it, as at every start, not through dbt again."""
    monkeypatch.setenv("HEARTBEAT_DBT_PARSE_CACHE", str(tmp_path / "kept"))  # none kept yet
    with Harness(tmp_path) as hb:
        hb.seed(row("trigger_file", "drops", "J"))
        built = views_built_by_dbt(hb.app.dbt.work_dir)
        assert built == len(view_models(hb.app.dbt.manifest()))  # the first load: dbt builds every view
        hb.jobs(J=0)
        hb.seed(row("trigger_file", "other", "J"))
        assert views_built_by_dbt(hb.app.dbt.work_dir) == built
        hb.tick()  # baseline
        hb.drop_trigger_file("other", "a.done")
        assert hb.tick().triggered_job_ids == ["J"]  # the views answer for the new config


def test_a_start_with_another_archive_margin_builds_the_views_again_with_it(tmp_path):
    """A view's SQL depends on the vars too (heartbeat_events_live reads the archive margin): a start with another
    margin builds the views again, never re-creates them from SQL compiled with the old margin; the start after
    that restores them."""
    with Harness(tmp_path) as hb:
        hb.seed(row("trigger_file", "drops", "J"))
    with Harness(tmp_path, HEARTBEAT_ARCHIVE_MARGIN_MINUTES="0") as hb:
        assert not hb.app.ensure_views(), "compiled with the default margin: dbt builds the views"
        live = hb.app.dbt.work_dir / "target" / "run" / "heartbeat" / "models" / "heartbeat_events_live.sql"
        assert "interval 0 seconds" in live.read_text()
    with Harness(tmp_path, HEARTBEAT_ARCHIVE_MARGIN_MINUTES="0") as hb:
        assert hb.app.ensure_views()
