"""The ``preprocess_query`` guard: a config row may filter its new rows, nothing else.

A row's ``preprocess_query`` runs inside the runner's own Spark session, next to
Heartbeat's tables. It is therefore parsed (sqlglot, Spark/Databricks dialect) and
accepted only when it is:

- exactly one statement, a query (``SELECT``, or a set operation of them), with
  CTEs and subqueries allowed;
- read-only: no DDL, DML, ``CACHE``, ``SET``, ``USE`` or other command anywhere in it;
- reading ``sensor_new_data`` only: every table it names is ``sensor_new_data`` or
  one of its own CTEs (no qualified name, no path, no table function such as
  ``range()`` or ``read_files()``);
- free of functions that reach the JVM (``reflect``, ``java_method``).

The same check runs when the config is validated and again, on the config as the
control table holds it, right before a query runs: a table edited behind the CSV's
back cannot bypass it. This module is a leaf (sqlglot and the standard library only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

NEW_ROWS_TABLE = "sensor_new_data"
#: The dialect the guard parses with: Spark SQL as Databricks speaks it (a superset of Spark's).
DIALECT = "databricks"

_UPSTREAM_KEY = re.compile(r"\?upstream_key\b")
_NEW_ROWS = re.compile(rf"\b{NEW_ROWS_TABLE}\b", re.IGNORECASE)
#: Statement kinds that change something or run a command; none may appear anywhere in the query.
_FORBIDDEN_NODES = tuple(
    getattr(exp, name) for name in (
        "Alter", "Analyze", "Cache", "Command", "Commit", "Copy", "Create", "Delete", "Describe", "Drop",
        "Grant", "Insert", "LoadData", "Merge", "Pragma", "Refresh", "Revoke", "Rollback", "Set", "Show",
        "Transaction", "TruncateTable", "Uncache", "Update", "Use",
    ) if hasattr(exp, name)
)
#: Functions that call into the JVM: a read-only filter never needs them.
_FORBIDDEN_FUNCTIONS = frozenset({"reflect", "java_method", "try_reflect"})


@dataclass(frozen=True)
class QueryProblem:
    """Why a preprocess_query was refused; ``line``/``col`` point into the query when known."""

    message: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = f" (query line {self.line}, col {self.col})" if self.line is not None else ""
        return f"{self.message}{where}"


class UnsafeQueryError(ValueError):
    """A preprocess_query the guard refuses (raised at sensing time)."""


def render_upstream_key(query: str, upstream_key: str | None) -> str:
    """Replace ``?upstream_key`` with the row's upstream_key (a validated identifier)."""
    if not _UPSTREAM_KEY.search(query):
        return query
    if not upstream_key:
        raise UnsafeQueryError("preprocess_query uses ?upstream_key but upstream_key is empty")
    return _UPSTREAM_KEY.sub(upstream_key, query)


def check_preprocess_query(query: str, upstream_key: str | None = None) -> QueryProblem | None:
    """The first reason ``query`` may not run as a preprocess_query, or None when it may."""
    try:
        rendered = render_upstream_key(query, upstream_key or "upstream_key")
        statements = [s for s in sqlglot.parse(rendered, read=DIALECT) if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        near = f" near {first['highlight']!r}" if first.get("highlight") else ""
        return QueryProblem(f"is not valid Spark SQL{near}", first.get("line"), first.get("col"))
    except TokenError as exc:
        return QueryProblem(f"is not valid Spark SQL: {exc}")
    if len(statements) != 1:
        return QueryProblem(f"must be a single SELECT statement; found {len(statements)} statements")
    return _check_statement(statements[0])


def _check_statement(root: exp.Expr) -> QueryProblem | None:
    if not isinstance(root, exp.Query):
        return QueryProblem(f"must be a read-only SELECT; found {_kind(root)}")
    for node in root.walk():
        if isinstance(node, _FORBIDDEN_NODES):
            return QueryProblem(f"must be read-only; it contains {_kind(node)}")
        if isinstance(node, exp.Func) and _function_name(node) in _FORBIDDEN_FUNCTIONS:
            return QueryProblem(f"may not call {_function_name(node)}()")
    cte_names = {cte.alias_or_name.lower() for cte in root.find_all(exp.CTE)}
    tables = list(root.find_all(exp.Table))
    for table in tables:
        problem = _check_table(table, cte_names)
        if problem is not None:
            return problem
    if not any(t.name.lower() == NEW_ROWS_TABLE for t in tables):
        return QueryProblem(f"does not read {NEW_ROWS_TABLE}, so it cannot filter the new rows")
    return None


def _check_table(table: exp.Table, cte_names: set[str]) -> QueryProblem | None:
    if not isinstance(table.this, exp.Identifier):
        return QueryProblem(f"may read only {NEW_ROWS_TABLE}; it calls the table function {table.this.sql(DIALECT)}")
    qualified = bool(table.db or table.catalog)
    name = table.name.lower()
    if not qualified and (name == NEW_ROWS_TABLE or name in cte_names):
        return None
    shown = ".".join(part for part in (table.catalog, table.db, table.name) if part)
    return QueryProblem(f"may read only {NEW_ROWS_TABLE} (and its own CTEs); it reads {shown}")


def _function_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def _kind(node: exp.Expr) -> str:
    return node.key.upper().replace("_", " ")


def render_preprocess_query(query: str, upstream_key: str | None, view_name: str = NEW_ROWS_TABLE) -> str:
    """The query to run over ``view_name``; raise UnsafeQueryError unless the guard accepts it.

    Only after the check are ``?upstream_key`` rendered and ``sensor_new_data`` pointed at
    ``view_name``; neither can add a statement or a table to a query that passed.
    """
    problem = check_preprocess_query(query, upstream_key)
    if problem is not None:
        raise UnsafeQueryError(f"preprocess_query refused: {problem}")
    return _NEW_ROWS.sub(view_name, render_upstream_key(query, upstream_key))
