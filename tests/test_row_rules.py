"""One derivation (issue 54): the control table's per-row rules are written once, in macros/heartbeat_row_rules.sql,
and both the model that derives every row (models/heartbeat_control.sql) and every fold that brings rows up to date
with one commit (macros/heartbeat_folds.sql) call them. No engine: the SQL text is parsed.

What is checked, precisely, and why:

- each rule (RULES: a ruled column and its macro) is a macro defined once, in heartbeat_row_rules.sql, and no other
  macro file defines a macro of the same name (dbt would take either: the folds and the model could read two rules);
- the model selects each ruled column as exactly one call of its rule macro (``{{ rule(...) }} as column``), and
  decides what is pending with heartbeat_is_pending: the derivation states no rule itself;
- every fold the runner runs (``FoldKind``, so a new fold is checked too) assigns ``status``, and each ruled column it
  assigns, as exactly one call of that column's rule macro (``column = {{ rule(...) }}``, nothing around it): a fold
  computes the rule's new inputs and calls the rule, it never writes ``status = case ...`` or keeps a column
  ``case when ... else control.column end``;
- neither the folds nor the model name a status only a rule gives ('IN_PROGRESS', 'NEW_EVENT_AVAILABLE'); no fold
  compares an event's time itself (``event_ts >``: pending is heartbeat_is_pending's, and the model compares an
  event's time with where its row's data was consumed only through it); no fold reads a row's stored ``status``:
  folds read what the status columns keep through the rules' own readers (heartbeat_built_lifecycle_ts,
  heartbeat_built_first_pending_ts).

That the rules give the same rows on both paths is tests/test_fold.py's (folded tables compared with derived ones,
and a rule changed on the fold path alone is caught there).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from heartbeat_runner.lakehouse.control_table import FoldKind

ROOT = Path(__file__).resolve().parent.parent
MACROS = ROOT / "macros"
RULES_FILE = MACROS / "heartbeat_row_rules.sql"
FOLDS_FILE = MACROS / "heartbeat_folds.sql"
MODEL_FILE = ROOT / "models" / "heartbeat_control.sql"

#: each column a per-row rule decides -> the macro of heartbeat_row_rules.sql that states the rule
RULES = {
    "status": "heartbeat_row_status",
    "status_change_timestamp": "heartbeat_status_change_ts",
    "job_start_timestamp": "heartbeat_job_start_ts",
    "job_end_timestamp": "heartbeat_job_end_ts",
    "pending_event_ids": "heartbeat_pending_ids",
    "consecutive_failures": "heartbeat_consecutive_failures",
    "last_error": "heartbeat_last_error",
    "sequence_run": "heartbeat_sequence_run",
    "sequence_runs": "heartbeat_sequence_runs",
    "sequence_windows": "heartbeat_sequence_windows",
}
#: columns of the model's intermediate relations a rule decides too (the folds compute them as a rule's input)
MODEL_ONLY_RULES = {
    "lifecycle_end_ts": "heartbeat_lifecycle_end_ts",
    "consumed_after": "heartbeat_consumed_after",
}
#: the other rules: whether an event is pending, when a run ended, what a built row keeps in its status columns
OTHER_RULES = ("heartbeat_is_pending", "heartbeat_run_ended_at", "heartbeat_built_lifecycle_ts",
               "heartbeat_built_first_pending_ts")
#: statuses only heartbeat_row_status gives (COMPLETED and FAILED are event types too)
RULE_ONLY_STATUSES = ("'IN_PROGRESS'", "'NEW_EVENT_AVAILABLE'")

MACRO = re.compile(r"\{%-?\s*macro\s+(\w+)\s*\((.*?)\)\s*-?%\}(.*?)\{%-?\s*endmacro\s*-?%\}", re.DOTALL)
JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)
#: ``{{ macro(...) }} as column`` in a select list (the call holds no ``}}``)
SELECTED_CALL = re.compile(r"\{\{\s*(\w+)\((?:(?!\}\}).)*\)\s*\}\}\s+as\s+(\w+)\b", re.DOTALL)
#: the right-hand side that is one call of ``macro`` and nothing else
ONE_CALL = r"\{\{\s*%s\((?:(?!\}\}).)*\)\s*\}\}"


def code(text: str) -> str:
    """SQL and Jinja without the Jinja comments (the prose may name anything)."""
    return JINJA_COMMENT.sub("", text)


def macros(text: str) -> dict[str, str]:
    """Each macro defined in ``text``: its name -> its body."""
    return {name: body for name, _, body in MACRO.findall(code(text))}


def assignments(merge: str) -> dict[str, str]:
    """The ``column = expression`` pairs of a MERGE's ``update set``, split at its top-level commas (outside
    parentheses, quotes and Jinja expressions)."""
    body = re.split(r"\bupdate\s+set\b", merge, maxsplit=1)[1]
    parts, depth, quote, current, i = [], 0, "", "", 0
    while i < len(body):
        ch, pair = body[i], body[i:i + 2]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif pair in ("{{", "{%"):
            depth, current, i = depth + 1, current + pair, i + 2
            continue
        elif pair in ("}}", "%}"):
            depth, current, i = depth - 1, current + pair, i + 2
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current, i = "", i + 1
            continue
        current += ch
        i += 1
    parts.append(current)
    found = {}
    for part in parts:
        column, _, value = part.partition("=")
        found[column.strip()] = value.strip()
    return found


def restated(fold: str) -> list[str]:
    """What a fold's body (its SQL and Jinja) does itself that a rule should: empty when it only calls the rules."""
    problems = []
    assigned = assignments(fold)
    if "status" not in assigned:
        problems.append("assigns no status")
    for column, value in assigned.items():
        rule = RULES.get(column)
        if rule and not re.fullmatch(ONE_CALL % rule, value, re.DOTALL):
            problems.append(f"{column} = {value!r} is not one call of {rule}")
    problems += [f"names the status {s}" for s in RULE_ONLY_STATUSES if s in fold]
    if re.search(r"\.\s*status\b", fold):
        problems.append("reads a row's stored status")
    if re.search(r"event_ts\s*>", fold):
        problems.append("compares event times itself")
    return problems


def test_every_rule_is_one_macro_defined_once_in_the_rules_file():
    rules = macros(RULES_FILE.read_text())
    assert set(RULES.values()) | set(MODEL_ONLY_RULES.values()) | set(OTHER_RULES) <= set(rules)
    for other in sorted(MACROS.glob("*.sql")):
        if other != RULES_FILE:
            assert not set(macros(other.read_text())) & set(rules), f"{other.name} defines a rule macro again"


def test_the_model_selects_each_ruled_column_through_its_rule_macro():
    model = code(MODEL_FILE.read_text())
    selected = set(SELECTED_CALL.findall(model))
    for column, rule in {**RULES, **MODEL_ONLY_RULES}.items():
        assert (rule, column) in selected, f"the model does not select {column} as {{{{ {rule}(...) }}}}"
    assert "heartbeat_is_pending(" in model
    assert not [s for s in RULE_ONLY_STATUSES if s in model], "the model names a status only the rule gives"
    assert not re.search(r"event_ts\s*>\s*[\w.]*consumed_after", model), "the model decides pending outside the rule"


@pytest.mark.parametrize("kind", list(FoldKind), ids=lambda kind: kind.name)
def test_every_fold_assigns_each_ruled_column_through_its_rule_macro_and_restates_none(kind):
    folds = macros(FOLDS_FILE.read_text())
    assert kind.macro in folds, f"{kind.macro} is not a macro of {FOLDS_FILE.name}"
    fold = folds[kind.macro]
    assert restated(fold) == []
    assert "heartbeat_row_status(" in fold


def test_the_new_data_fold_decides_what_is_pending_with_the_rule():
    fold = macros(FOLDS_FILE.read_text())[FoldKind.NEW_DATA.macro]
    assert "heartbeat_is_pending(" in fold


def test_the_check_finds_a_fold_that_restates_a_rule():
    """The check itself: the fold as it was before the rules were shared (each rule written out) fails it."""
    before = """
merge into {{ ref('heartbeat_control') }} as control using {{ new_data }} as n on n.source_key = control.source_key
when matched then update set
  status = case when n.event_ts > control.row_created_timestamp
                 and coalesce(control.status, '') not in ('IN_PROGRESS', 'FAILED') then 'NEW_EVENT_AVAILABLE'
                else control.status end,
  job_start_timestamp = {{ heartbeat_job_start_ts('x', 'y') }} + 0,
  last_error = {{ heartbeat_last_error('a', 'b', 'c', 'd', 'e') }},
  updated_at = current_timestamp()
"""
    problems = restated(before)
    assert any(p.startswith("status = ") for p in problems)
    assert any(p.startswith("job_start_timestamp = ") for p in problems)
    assert not any(p.startswith("last_error") for p in problems)
    assert {"names the status 'IN_PROGRESS'", "names the status 'NEW_EVENT_AVAILABLE'",
            "reads a row's stored status", "compares event times itself"} <= set(problems)
    assert restated("merge into t using s on true when matched then update set updated_at = current_timestamp()") \
        == ["assigns no status"]
