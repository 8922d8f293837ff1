"""The dbt docs catalog is complete: every model, source, seed and column has a description, and
each one documents exactly the columns it really has.

The project is parsed by the real dbt CLI (`dbt parse`: no connection, no engine). A model's output
columns are derived from its SQL as parsed by dbt: rendered with the project's own macros (``ref``,
``source`` and ``var`` stubbed; the non-incremental branch, whose columns the incremental one repeats),
then its ``*`` selects expanded by sqlglot against the columns of what it reads: the runner's tables
(``heartbeat_runner.lakehouse.store.TABLE_COLUMNS``, the columns it creates them with), the seed (its CSV header)
and the other models (derived first). The runner's tables and the seed are held to those same columns.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import pytest
import sqlglot
from sqlglot.optimizer.qualify import qualify

from heartbeat_runner.lakehouse.store import TABLE_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "heartbeat"


@dataclass(frozen=True)
class Documented:
    """One documented thing of the catalog: its description and those of the columns its yml lists."""

    kind: str  # "model", "source", "source table" or "seed"
    name: str
    description: str
    columns: dict[str, str] = field(default_factory=dict)


def undocumented(items: list[Documented]) -> list[str]:
    """What has no description, one line each, naming the thing and the column."""
    problems = []
    for item in items:
        if not item.description.strip():
            problems.append(f"{item.kind} {item.name}: no description")
        problems += [f"{item.kind} {item.name}, column {column}: no description"
                     for column, description in item.columns.items() if not description.strip()]
    return problems


def column_mismatches(kind: str, documented: dict[str, list[str]], actual: dict[str, list[str]]) -> list[str]:
    """Columns a relation has but its yml does not list, and columns its yml lists that it does not have."""
    problems = []
    for name, columns in actual.items():
        listed = documented.get(name, [])
        problems += [f"{kind} {name}: column {c} is not listed in its yml (add it with a description)"
                     for c in columns if c not in listed]
        problems += [f"{kind} {name}: its yml lists column {c}, which it does not have" for c in listed
                     if c not in columns]
    return problems


def parse_project(tmp: Path):
    """The manifest of ``dbt parse`` on the project, with every file dbt writes under ``tmp``."""
    from dbt.cli.main import dbtRunner

    profiles = tmp / "profiles"
    profiles.mkdir()
    (profiles / "profiles.yml").write_text((ROOT / "profiles.example.yml").read_text())
    with pytest.MonkeyPatch.context() as env:
        env.delenv("HEARTBEAT_SEED_DIR", raising=False)  # the project's own seeds/
        env.setenv("HEARTBEAT_DBT_TARGET_PATH", str(tmp / "target"))
        env.setenv("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
        result = dbtRunner().invoke([
            "parse", "--project-dir", str(ROOT), "--profiles-dir", str(profiles), "--target", "local",
            "--target-path", str(tmp / "target"), "--log-path", str(tmp / "logs"),
            "--no-partial-parse", "--quiet", "--no-use-colors",
        ])
    assert result.success, f"dbt parse failed: {result.exception}"
    return result.result


def of_type(manifest, resource_type: str) -> list:
    return [n for n in manifest.nodes.values()
            if n.resource_type.value == resource_type and n.package_name == PACKAGE]


def seed_header(seed) -> list[str]:
    with (Path(seed.root_path) / seed.original_file_path).open(newline="") as f:
        return next(csv.reader(f))


def model_output_columns(manifest) -> dict[str, list[str]]:
    """Each model's output columns: the names its final SELECT gives, ``*`` expanded."""
    macros = "\n".join(m.macro_sql for m in manifest.macros.values()
                       if m.package_name == PACKAGE and m.macro_sql.lstrip().startswith("{% macro"))
    env = jinja2.Environment(extensions=["jinja2.ext.do"], undefined=jinja2.StrictUndefined)
    env.globals.update(ref=lambda *names: names[-1], source=lambda _source, table: table,
                       config=lambda *args, **kwargs: "", is_incremental=lambda: False,
                       var=lambda _name, default=None: default, this="this",
                       # as dbt parses: nothing executes, and the environment gives the defaults
                       execute=False, env_var=lambda _name, default="": default,
                       # dbt's `return` hands a value back from a macro; here it is only rendered (a macro's
                       # value feeds config(), which is a no-op above)
                       **{"return": lambda value: value})
    schema = {seed.name: dict.fromkeys(seed_header(seed), "string") for seed in of_type(manifest, "seed")}
    schema.update({table: dict.fromkeys(columns, "string") for table, columns in TABLE_COLUMNS.items()})
    models = {m.name: m for m in of_type(manifest, "model")}
    derived: dict[str, list[str]] = {}

    def derive(name: str) -> list[str]:
        if name not in derived:
            model = models[name]
            for upstream in model.depends_on.nodes:
                if upstream.startswith("model.") and upstream.split(".")[-1] in models:
                    derive(upstream.split(".")[-1])
            sql = env.from_string(macros + "\n" + model.raw_code).render()
            query = qualify(sqlglot.parse_one(sql, read="spark"), schema=schema, dialect="spark",
                            validate_qualify_columns=False, quote_identifiers=False)
            columns = list(query.named_selects)
            assert columns and "*" not in columns, f"model {name}: cannot tell its output columns ({columns})"
            derived[name] = columns
            schema[name] = dict.fromkeys(columns, "string")
        return derived[name]

    for name in models:
        derive(name)
    return derived


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return parse_project(tmp_path_factory.mktemp("dbt_docs"))


def catalog(manifest) -> list[Documented]:
    items = [Documented("model", m.name, m.description, {c: i.description for c, i in m.columns.items()})
             for m in of_type(manifest, "model")]
    items += [Documented("seed", s.name, s.description, {c: i.description for c, i in s.columns.items()})
              for s in of_type(manifest, "seed")]
    tables = [t for t in manifest.sources.values() if t.package_name == PACKAGE]
    items += [Documented("source", t.source_name, t.source_description)
              for t in {t.source_name: t for t in tables}.values()]
    items += [Documented("source table", f"{t.source_name}.{t.name}", t.description,
                         {c: i.description for c, i in t.columns.items()}) for t in tables]
    return items


def test_every_model_source_seed_and_column_has_a_description(manifest):
    items = catalog(manifest)
    assert {i.kind for i in items} == {"model", "seed", "source", "source table"}
    problems = undocumented(items)
    assert not problems, "undocumented in models/*.yml:\n" + "\n".join(problems)


def test_every_model_lists_exactly_the_columns_its_final_select_outputs(manifest):
    models = of_type(manifest, "model")
    assert {m.name for m in models} == {p.stem for p in (ROOT / "models").glob("*.sql")}
    problems = column_mismatches("model", {m.name: list(m.columns) for m in models}, model_output_columns(manifest))
    assert not problems, "models/schema.yml:\n" + "\n".join(problems)


def test_the_runner_tables_and_the_seed_list_exactly_their_columns(manifest):
    tables = {t.name: list(t.columns) for t in manifest.sources.values() if t.package_name == PACKAGE}
    problems = column_mismatches("source table", tables, {t: TABLE_COLUMNS[t] for t in tables})
    seeds = of_type(manifest, "seed")
    problems += column_mismatches("seed", {s.name: list(s.columns) for s in seeds},
                                  {s.name: seed_header(s) for s in seeds})
    assert not problems, "models/sources.yml, models/seed_properties.yml:\n" + "\n".join(problems)


def test_the_checks_name_what_is_missing():
    """A model added without docs, or a column dropped from a select, fails with its name."""
    assert undocumented([Documented("model", "new_model", "", {"a": "A.", "b": " "})]) == [
        "model new_model: no description", "model new_model, column b: no description"]
    assert column_mismatches("model", {"m": ["a", "gone"]}, {"m": ["a", "new"], "n": ["x"]}) == [
        "model m: column new is not listed in its yml (add it with a description)",
        "model m: its yml lists column gone, which it does not have",
        "model n: column x is not listed in its yml (add it with a description)",
    ]
