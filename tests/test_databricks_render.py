"""Render the whole dbt project for dbt-databricks, offline, and parse every statement as Databricks SQL.

How it stays honest without a workspace: dbt runs for real (parse, dispatch, the
dbt-databricks materializations: seed, table, view, incremental MERGE, data tests);
only the wire is replaced. ``databricks.sql.connect`` returns a recording warehouse
that answers the adapter's metadata queries (``information_schema.tables``) from the
tables it has seen created and gives every data test zero failures. Two rounds run in
a subprocess (so the patch and dbt's global state stay out of the test process): an
empty schema (CREATE everything), then the same schema again (seed re-load and the
incremental MERGE branch). sqlglot's ``databricks`` dialect must parse each statement.

Run alone: ``python tests/test_databricks_render.py OUT_DIR`` writes ``OUT_DIR/render.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
if __name__ != "__main__":
    pytest.importorskip("dbt.adapters.databricks", reason="pip install -e '.[databricks]'")
    pytest.importorskip("sqlglot", reason="pip install sqlglot")
ROUNDS = (("seed",), ("run",), ("test",), ("seed",), ("run",))  # the last two see existing tables
#: dbt-databricks' own metadata statements (``DESCRIBE TABLE EXTENDED ... AS JSON`` is newer than sqlglot).
METADATA = re.compile(r"^\s*(/\*.*?\*/)?\s*(show|describe)\b", re.I | re.S)

# -- the harness (runs in a subprocess) -------------------------------------------------------------


class FakeWarehouse:
    """Records every statement dbt sends and keeps the set of relations it created."""

    CREATED = re.compile(r"create\s+(?:or\s+replace\s+)?(table|view)\s+`[^`]+`\.`[^`]+`\.`([^`]+)`", re.I)

    def __init__(self) -> None:
        self.relations: dict[str, str] = {}
        self.statements: list[dict[str, Any]] = []
        self.round = 0

    def execute(self, sql: str, bindings: Any) -> tuple[list[str], list[tuple]]:
        """Record one statement; return (column names, rows) for it."""
        self.statements.append({"round": self.round, "node": _node_of(sql), "sql": sql,
                                "bindings": [None if b is None else str(b) for b in bindings or []]})
        for kind, name in self.CREATED.findall(sql):
            self.relations[name.lower()] = kind.lower()
        if "`information_schema`.`tables`" in sql:
            wanted = re.search(r"table_name\s*=\s*'([^']+)'", sql)
            names = [n for n in self.relations if wanted is None or n == wanted.group(1)]
            return (["table_name", "table_type", "file_format", "table_owner", "databricks_table_type"],
                    [(n, self.relations[n], "delta" if self.relations[n] == "table" else None, "owner",
                      "managed" if self.relations[n] == "table" else None) for n in names])
        if re.search(r"count\(\*\)\s+as\s+failures", sql, re.I):
            return ["failures", "should_warn", "should_error"], [(0, False, False)]
        return [], []


class _Cursor:
    def __init__(self, warehouse: FakeWarehouse, connection: _Connection):
        self.warehouse, self.connection = warehouse, connection
        self.description: list[tuple] | None = None
        self.rows: list[tuple] = []
        self.query_id = "render-only"

    def execute(self, sql: str, parameters: Any = None, **_: Any) -> _Cursor:
        columns, self.rows = self.warehouse.execute(sql, parameters)
        self.description = [(c, "string", None, None, None, None, None) for c in columns] or None
        return self

    def schemas(self, *_: Any, **__: Any) -> _Cursor:
        self.description, self.rows = None, []
        return self

    tables = schemas

    def fetchall(self) -> list[tuple]:
        rows, self.rows = self.rows, []
        return rows

    def fetchone(self) -> tuple | None:
        return self.rows.pop(0) if self.rows else None

    def fetchmany(self, size: int) -> list[tuple]:
        rows, self.rows = self.rows[:size], self.rows[size:]
        return rows

    def close(self) -> None:
        pass

    cancel = close


class _Connection:
    def __init__(self, warehouse: FakeWarehouse):
        self.warehouse = warehouse

    def cursor(self) -> _Cursor:
        return _Cursor(self.warehouse, self)

    def get_session_id_hex(self) -> str:
        return "render-only"

    def close(self) -> None:
        pass


def _node_of(sql: str) -> str | None:
    match = re.match(r"\s*/\*\s*(\{.*?\})\s*\*/", sql, re.S)
    if not match:
        return None
    try:
        return json.loads(match.group(1)).get("node_id")
    except json.JSONDecodeError:
        return None


def render(out_dir: Path) -> dict[str, Any]:
    """Run the dbt rounds against the fake warehouse; return what happened."""
    from unittest import mock

    from dbt.cli.main import dbtRunner

    profiles = out_dir / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "profiles.example.yml", profiles / "profiles.yml")
    os.environ.update({
        "DBT_PROFILES_DIR": str(profiles), "HEARTBEAT_TARGET": "databricks-sql", "HEARTBEAT_CATALOG": "main",
        "HEARTBEAT_SCHEMA": "heartbeat", "HEARTBEAT_DBT_TARGET_PATH": str(out_dir / "target"),
        "DATABRICKS_HOST": "https://render-only.invalid", "DATABRICKS_HTTP_PATH": "/sql/1.0/warehouses/render",
        "DATABRICKS_TOKEN": "dapi-render-only", "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
    })
    os.environ.pop("HEARTBEAT_SEED_DIR", None)
    os.chdir(REPO)
    warehouse = FakeWarehouse()
    rounds = []
    with mock.patch("databricks.sql.connect", lambda **_: _Connection(warehouse)):
        for number, args in enumerate(ROUNDS):
            warehouse.round = number
            result = dbtRunner().invoke([*args, "--log-path", str(out_dir / "logs"), "--no-use-colors"])
            nodes = [{"node": r.node.unique_id, "status": str(r.status), "message": r.message}
                     for r in (result.result or [])] if result.result is not None else []
            rounds.append({"args": list(args), "success": result.success,
                           "exception": None if result.exception is None else str(result.exception), "nodes": nodes})
    manifest = json.loads((out_dir / "target" / "manifest.json").read_text())
    project_nodes = sorted(k for k, v in manifest["nodes"].items() if v["package_name"] == "heartbeat")
    project_macros = sorted(k for k, v in manifest["macros"].items() if v["package_name"] == "heartbeat")
    return {"rounds": rounds, "statements": warehouse.statements, "nodes": project_nodes, "macros": project_macros,
            "node_macros": {k: manifest["nodes"][k]["depends_on"]["macros"] for k in project_nodes},
            "ephemeral": [k for k in project_nodes if manifest["nodes"][k]["config"]["materialized"] == "ephemeral"],
            "macro_macros": {k: v["depends_on"]["macros"] for k, v in manifest["macros"].items()}}


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("databricks_render")
    proc = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "render.json").read_text())


def _sql_of(statement: dict[str, Any]) -> str:
    """The statement with its ``%s`` bindings inlined as literals (as the connector would send them)."""
    values = iter(statement["bindings"])
    return re.sub(r"%s", lambda _: "NULL" if (v := next(values)) is None else "'" + v.replace("'", "\\'") + "'",
                  statement["sql"])


def _parse(sql: str):
    import sqlglot
    from sqlglot.errors import ErrorLevel

    return [tree for tree in sqlglot.parse(sql, read="databricks", error_level=ErrorLevel.RAISE) if tree is not None]


def _round_nodes(rendered: dict[str, Any], number: int) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in rendered["rounds"][number]["nodes"]}


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_every_model_builds_both_fresh_and_incremental(rendered):
    models = [n for n in rendered["nodes"] if n.startswith("model.") and n not in rendered["ephemeral"]]
    assert models, "no models found"
    for number in (1, 4):
        results = _round_nodes(rendered, number)
        assert rendered["rounds"][number]["success"], results
        assert sorted(results) == sorted(models)
    merges = [s for s in rendered["statements"] if s["round"] == 4 and re.search(r"^\s*merge\s+into", s["sql"], re.I | re.M)]
    # the control table and the sensor state (updated in place, so followers keep their place) merge
    assert sorted(s["node"] for s in merges) == ["model.heartbeat.heartbeat_control",
                                                 "model.heartbeat.heartbeat_sensor_state"]
    assert "create or replace table `main`.`heartbeat`.`heartbeat_control`" in " ".join(
        s["sql"] for s in rendered["statements"] if s["round"] == 1)


def test_every_data_test_renders_and_runs(rendered):
    tests = [n for n in rendered["nodes"] if n.startswith("test.")]
    results = _round_nodes(rendered, 2)
    assert tests and sorted(results) == sorted(tests)
    assert rendered["rounds"][2]["success"], results


def test_seed_loads_with_dbt_databricks(rendered):
    for number in (0, 3):
        outcome = rendered["rounds"][number]
        assert outcome["success"], outcome
    table = "`main`.`heartbeat`.`heartbeat_sensor_config`"
    seed_sql = [s["sql"] for s in rendered["statements"] if s["round"] in (0, 3) and table in s["sql"]]
    assert any(f"create  table {table}" in sql for sql in seed_sql)            # first load
    assert any(f"create or replace table {table}" in sql for sql in seed_sql)  # re-load: a new Delta version
    assert sum(f"insert overwrite {table}" in sql for sql in seed_sql) == 2
    assert not any("location" in sql.lower() for sql in seed_sql)  # managed Unity Catalog tables


def test_every_statement_is_valid_databricks_sql(rendered):
    """Project SQL (DDL, MERGE, INSERT, queries) must parse fully; the adapter's own SHOW/DESCRIBE
    metadata statements only have to be accepted."""
    import sqlglot.expressions as exp

    checked = 0
    for statement in rendered["statements"]:
        sql = _sql_of(statement)
        if METADATA.match(sql):
            continue
        trees = _parse(sql)
        assert trees and not any(isinstance(t, exp.Command) for t in trees), \
            f"{statement['node']}: sqlglot passed this through without parsing it:\n{sql}"
        checked += 1
    nodes = {s["node"] for s in rendered["statements"] if s["node"]}
    executed = {n for n in rendered["nodes"] if not n.startswith("seed.") and n not in rendered["ephemeral"]}
    assert checked > 20 and executed <= nodes
    for ephemeral in rendered["ephemeral"]:  # inlined as a CTE into the models that use it
        assert any(f"__dbt__cte__{ephemeral.split('.')[-1]}" in s["sql"] for s in rendered["statements"]), ephemeral


def test_every_project_macro_is_used_by_a_rendered_node(rendered):
    """No dead macros: each one is reached from a rendered model or test, from a dispatch override
    (``spark__...``: dbt picks those by adapter; see test_seed_loads_with_dbt_databricks), or from a macro the
    runner renders and runs itself (its folds: lakehouse/control_table.py RUNNER_MACROS), each of which exists."""
    from heartbeat_runner.lakehouse.control_table import RUNNER_MACROS

    runner = [f"macro.heartbeat.{name}" for name in RUNNER_MACROS]
    assert [m for m in runner if m not in rendered["macros"]] == []
    overrides = [m for m in rendered["macros"] if re.search(r"\.(spark|databricks|default)__", m)]
    used, todo = set(), [m for deps in rendered["node_macros"].values() for m in deps] + overrides + runner
    while todo:
        macro = todo.pop()
        if macro not in used:
            used.add(macro)
            todo.extend(rendered["macro_macros"].get(macro, []))
    assert [m for m in rendered["macros"] if m not in used] == []


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    (target / "render.json").write_text(json.dumps(render(target), indent=1))
