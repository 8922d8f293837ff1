"""dbt's saved parse serves every lakehouse of one project: a new lakehouse (with HEARTBEAT_DBT_PARSE_CACHE) and a
copied one start from it instead of a full parse (~1.5 s), and still build and write only their own tables. The
macros the runner renders with dbt for its own statements (folds, the sensor state MERGE) and the views' compiled
SQL are kept there too.

dbt runs on ``<lakehouse>/dbt/project`` (links to the project) with relative seed and target folders, and the
lakehouse's own paths reach the macros as environment variables only (lakehouse/dbt_invoke.py), so nothing dbt
parses or hashes differs between two lakehouses of one schema and engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import HEADER, MARKER_JOB, CliLakehouse, views_built_by_dbt
from harness import config_row as row

#: what dbt writes to its log when it cannot start from a saved parse
FULL_PARSE = "Unable to do partial parsing"


def lakehouse(root: Path, **env: str) -> CliLakehouse:
    """One upstream Delta table sensed for job 301 (it leaves a marker), seeded and at its baseline."""
    root.mkdir(parents=True)
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.events", "301")]) + "\n")
    jobs = root / "jobs.yml"
    jobs.write_text(f"jobs:\n  '301': [{sys.executable!r}, '-c', {MARKER_JOB!r}]\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=jobs, env=env)
    lake.home.mkdir()
    lake.append_ids("up.events", 0)
    lake.cli("seed")
    lake.cli("run")
    return lake


def full_parses(lake: CliLakehouse) -> int:
    log = lake.home / "dbt" / "logs" / "dbt.log"
    return log.read_text(encoding="utf-8", errors="replace").count(FULL_PARSE) if log.exists() else 0


def mark_kept_statements(cache: Path) -> int:
    """Append a SQL comment to each statement kept in ``cache`` (a lakehouse that takes one has it); how many."""
    kept = list((cache / "rendered").glob("*.json"))
    for path in kept:
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "sql": record["sql"] + "\n-- kept"}))
    return len(kept)


def statements(lake: CliLakehouse) -> list[str]:
    """The statements this lakehouse keeps for itself (DbtProject.macro_sql)."""
    return [json.loads(p.read_text())["sql"] for p in (lake.home / "dbt" / "rendered").glob("*.json")]


def new_data_runs_the_job(lake: CliLakehouse) -> None:
    lake.append_ids("up.events", 1)
    lake.cli("run")
    lake.wait_local_runs()
    lake.cli("run")
    assert lake.executions() == {"301": 1}


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_a_new_lakehouse_starts_from_the_kept_parse_and_writes_only_its_own_tables(tmp_path, monkeypatch):
    cache = tmp_path / "parse-cache"
    monkeypatch.setenv("HEARTBEAT_DBT_PARSE_CACHE", str(cache))
    first = lakehouse(tmp_path / "a")
    assert full_parses(first) == 1  # nothing kept yet: dbt parses the project once, and builds every view
    assert views_built_by_dbt(first.home / "dbt") > 0
    assert len(list(cache.glob("*.msgpack"))) == 1

    new_data_runs_the_job(first)
    assert mark_kept_statements(cache) > 0  # its folds' statements, rendered by dbt once and kept
    events_before = len(first.events())

    second = lakehouse(tmp_path / "b")
    new_data_runs_the_job(second)
    assert full_parses(second) == 0 and views_built_by_dbt(second.home / "dbt") == 0  # its views from the kept SQL
    assert statements(second) and all(sql.endswith("-- kept") for sql in statements(second))  # none rendered again
    # its tables are its own: built and read in its folder, the first lakehouse untouched
    assert (second.home / "warehouse" / "heartbeat" / "heartbeat_control" / "_delta_log").is_dir()
    assert len(first.events()) == events_before and first.executions() == {"301": 1}
    assert {r[2] for r in second.control()} == {"301"}

    # another schema is another parse (its relations differ): kept beside the first, never mixed with it
    other = lakehouse(tmp_path / "c", HEARTBEAT_SCHEMA="heartbeat_other")
    assert full_parses(other) == 1 and len(list(cache.glob("*.msgpack"))) == 2
    assert views_built_by_dbt(other.home / "dbt") > 0
    assert (other.home / "warehouse" / "heartbeat_other" / "heartbeat_control" / "_delta_log").is_dir()


def test_without_the_cache_a_new_lakehouse_parses_once_and_a_copied_one_not_at_all(tmp_path, monkeypatch):
    import shutil

    monkeypatch.delenv("HEARTBEAT_DBT_PARSE_CACHE", raising=False)
    original = lakehouse(tmp_path / "a")
    assert full_parses(original) == 1
    shutil.copytree(tmp_path / "a", tmp_path / "moved")  # as `cp -rL` copies: the project's links become folders
    moved = CliLakehouse(tmp_path / "moved" / "lakehouse", config=tmp_path / "moved" / "config.csv",
                         jobs_file=tmp_path / "moved" / "jobs.yml")
    new_data_runs_the_job(moved)
    assert full_parses(moved) == 1  # the one copied with its log: the moved lakehouse parsed nothing in full
    assert original.executions() == {}
    # the project's links are made again, to the project folder of the process that runs dbt
    for name in ("dbt_project.yml", "models", "macros"):
        link = moved.home / "dbt" / "project" / name
        assert link.is_symlink() and link.resolve() == (Path(__file__).parents[1] / name).resolve()

