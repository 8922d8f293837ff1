"""One vocabulary for states: the Python enums and the values the dbt tests accept are the same sets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from heartbeat_runner.core.records import EventType, JobState, JobStatus, Outcome, SensorStatus, TickStatus
from heartbeat_runner.core.settings import JobsBackendKind, Target
from heartbeat_runner.interfaces.cli import build_parser
from heartbeat_runner.jobs.registry import BUILT_IN_BACKENDS
from heartbeat_runner.sensing.sources.registry import BUILT_IN_SOURCES

#: runs on Sail and on Apache Spark + Delta (classic); see tests/conftest.py
ON_SPARK = pytest.mark.engines("sail", "spark-classic")

ROOT = Path(__file__).resolve().parent.parent


def accepted_values(file: str, section: str, relation: str, column: str) -> set[str]:
    """The accepted_values test of ``relation.column`` in a dbt properties file."""
    document = yaml.safe_load((ROOT / "models" / file).read_text())
    if section == "sources":
        relations = [t for s in document["sources"] for t in s["tables"]]
    else:
        relations = document["models"]
    found = next(r for r in relations if r["name"] == relation)
    col = next(c for c in found["columns"] if c["name"] == column)
    test = next(t["accepted_values"] for t in col["data_tests"] if isinstance(t, dict) and "accepted_values" in t)
    return set(test["values"])


@pytest.mark.parametrize("enum, file, section, relation, column", [
    (JobStatus, "schema.yml", "models", "heartbeat_control", "status"),
    (JobStatus, "schema.yml", "models", "heartbeat_job_status", "status"),
    (JobState, "schema.yml", "models", "heartbeat_control", "job_state"),
    (TickStatus, "schema.yml", "models", "heartbeat_run_overview", "status"),
    (SensorStatus, "schema.yml", "models", "heartbeat_sensor_state", "status"),
    (EventType, "sources.yml", "sources", "heartbeat_events", "event_type"),
    (Outcome, "sources.yml", "sources", "heartbeat_run_report", "outcome"),
])
def test_enum_matches_the_sql_accepted_values(enum, file, section, relation, column):
    assert {member.value for member in enum} == accepted_values(file, section, relation, column)


def test_the_runs_table_accepts_every_tick_status_a_runner_writes():
    """heartbeat_runs holds every status but INCOMPLETE, which only heartbeat_run_overview derives (a tick
    that wrote events and no row); a FAILED row is a tick that raised."""
    written = {member.value for member in TickStatus} - {TickStatus.INCOMPLETE.value}
    assert written == accepted_values("sources.yml", "sources", "heartbeat_runs", "status")


def seed_accepted_values(column: str) -> set[str]:
    document = yaml.safe_load((ROOT / "models" / "seed_properties.yml").read_text())
    col = next(c for c in document["seeds"][0]["columns"] if c["name"] == column)
    test = next(t["heartbeat_accepted_values_normalized"] for t in col["data_tests"]
                if isinstance(t, dict) and "heartbeat_accepted_values_normalized" in t)
    return set(test["values"])


def test_the_seed_accepts_the_built_in_source_types_of_the_registry():
    assert seed_accepted_values("sensor_source") == set(BUILT_IN_SOURCES)


def test_targets_and_backends_come_from_their_enums():
    """The CLI offers every target (spark-local too) and the engines page documents each."""
    options = {a.dest: a for a in build_parser()._actions}
    assert tuple(options["target"].choices) == tuple(t.value for t in Target)
    engines = (ROOT / "docs" / "engines.md").read_text()
    assert all(f"`{t.value}`" in engines for t in Target)
    assert set(BUILT_IN_BACKENDS) == {k.value for k in JobsBackendKind}


def test_every_status_the_models_write_is_a_member():
    """Each status literal of the status rule (macros/heartbeat_row_rules.sql, which the control model and its folds
    call) is a JobStatus (a typo there fails here)."""
    import re

    sql = (ROOT / "macros" / "heartbeat_row_rules.sql").read_text()
    rule = sql[sql.index("macro heartbeat_row_status("):]
    case = rule[:rule.index("endmacro")]
    assert set(re.findall(r"then '([A-Z_]+)'", case)) == {s.value for s in JobStatus}


@ON_SPARK
def test_the_dbt_tests_pass_on_a_lakehouse_that_went_through_a_lifecycle(hb):
    """Every accepted_values/unique test runs on real rows: a value the runner or a model writes
    outside its enum makes `dbt test` fail."""
    from harness import config_row as row

    hb.jobs(J1=0, J2=1)
    hb.seed(row("trigger_file", "drop", "J1"), row("trigger_file", "other", "J2"))
    hb.tick()
    hb.drop_trigger_file("drop", "a.done")
    hb.drop_trigger_file("other", "a.done")
    assert sorted(hb.tick().triggered_job_ids) == ["J1", "J2"]
    hb.wait_for_jobs()
    assert hb.job_status("J1") == {JobStatus.COMPLETED.value} and hb.job_status("J2") == {JobStatus.FAILED.value}
    hb.app.dbt.invoke(["test"])  # raises DbtError naming the failing test


def test_a_config_row_names_its_source_as_the_control_table_does(hb):
    """``validate`` groups rows by source without an engine (window sizes per source); its key must be the
    one the macro heartbeat_source_key gives the control table, with and without a key or a query."""
    from harness import config_row as row

    from heartbeat_runner.sensing.config import load_config

    hb.seed(row("delta_table", "db.t", "J1"),
            row("delta_table", "db.t", "J2", key="updated_at"),
            row("delta_table", "db.t", "J3", query="SELECT * FROM sensor_new_data WHERE v > 'it''s'"),
            row("delta_table", "db.t", "J4", key="updated_at", query="SELECT id FROM sensor_new_data"))
    in_table = {r["trigger_job_id"]: r["source_key"] for r in hb.app.store.control_rows()}
    in_python = {r.trigger_job_id: r.source_key for r in load_config(hb.config_path).rows}
    assert in_python == in_table and len(set(in_table.values())) == 4
