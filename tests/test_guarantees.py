"""The list of what the suite guarantees (tests/README.md) stays true: every item names tests that exist,
no id is listed twice, and the list only grows from its baseline (tests/guarantees_baseline.txt, the ids
at 7fe6466).

No engine and no pytest collection: the test modules are parsed with ``ast`` for their test functions
(class methods too), so this runs in the everyday leg in well under a second.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent
README = TESTS / "README.md"
BASELINE = TESTS / "guarantees_baseline.txt"

#: ``- **G-ID** behaviour — tests/test_a.py::test_b, tests/test_c.py::Class::test_d``
ITEM = re.compile(r"^- \*\*(?P<id>G-[A-Za-z0-9_.-]+)\*\*\s+(?P<rest>.*)$")
SEPARATOR = " — "
NODE_ID = re.compile(r"^tests/(?P<module>test_[A-Za-z0-9_]+\.py)(?P<names>(?:::[A-Za-z_][A-Za-z0-9_]*)+)$")


def items(text: str) -> list[tuple[str, list[str]]]:
    """Each item of the list: its id and the node ids after its last separator (empty when it names none)."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):  # an example in a code block is not an item
            fenced = not fenced
            continue
        match = None if fenced else ITEM.match(line.strip())
        if match is None:
            continue
        rest = match["rest"]
        tests = rest.rpartition(SEPARATOR)[2].split(",") if SEPARATOR in rest else []
        found.append((match["id"], [t.strip() for t in tests if t.strip()]))
    return found


@cache
def defined_tests(module: str) -> frozenset[str]:
    """``test_x`` and ``Class::test_x`` for every test function of ``tests/<module>`` (empty if it is gone)."""
    path = TESTS / module
    if not path.is_file():
        return frozenset()
    names: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}::")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                names.add(prefix + node.name)

    walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body, "")
    return frozenset(names)


def problems_of(listed: list[tuple[str, list[str]]]) -> list[str]:
    """What is wrong with the items: one line per problem, naming the item."""
    problems = []
    for gid, tests in listed:
        if not tests:
            problems.append(f"{gid}: names no test")
        for test in tests:
            match = NODE_ID.match(test)
            if match is None:
                problems.append(f"{gid}: {test!r} is not a node id like tests/test_x.py::test_name")
            elif match["names"][2:] not in defined_tests(match["module"]):
                problems.append(f"{gid}: {test} does not exist")
    return problems


def baseline_ids() -> list[str]:
    return [line.strip() for line in BASELINE.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_guarantee_names_tests_that_exist():
    listed = items(README.read_text(encoding="utf-8"))
    assert listed, f"no item found in {README}"
    problems = problems_of(listed)
    assert not problems, "tests/README.md:\n" + "\n".join(problems)


def test_guarantee_ids_are_unique():
    counts = Counter(gid for gid, _ in items(README.read_text(encoding="utf-8")))
    twice = sorted(gid for gid, n in counts.items() if n > 1)
    assert not twice, f"listed more than once in tests/README.md: {', '.join(twice)}"


def test_the_baseline_guarantees_are_all_still_listed():
    listed = {gid for gid, _ in items(README.read_text(encoding="utf-8"))}
    baseline = baseline_ids()
    assert len(baseline) == len(set(baseline)), "tests/guarantees_baseline.txt lists an id twice"
    gone = [gid for gid in baseline if gid not in listed]
    assert not gone, ("the list may only grow; gone from tests/README.md (keep the item and name the test "
                      f"that now checks it): {', '.join(gone)}")


def test_every_fault_point_has_an_item():
    """Every member of core/faults.py's registry is listed as crashed, raised or hung (issue 52: every fault
    point stays crashed or raised in at least one test)."""
    from heartbeat_runner.core.faults import FaultPoint

    listed = {gid for gid, _ in items(README.read_text(encoding="utf-8"))}
    missing = [point.value for point in FaultPoint
               if not any(f"G-{kind}-{point.value}" in listed for kind in ("CRASH", "FAIL", "HANG"))]
    assert not missing, f"fault points without a G-CRASH-/G-FAIL-/G-HANG- item in tests/README.md: {missing}"


def test_the_checks_name_the_item_that_is_wrong():
    """The guard itself: a missing test, a vanished test, a malformed reference and a repeated id are each
    reported with the item's id."""
    text = "\n".join([
        "```",
        "- **G-EXAMPLE** in a code block — tests/test_a.py::test_b",
        "```",
        "- **G-A** a behaviour — tests/test_guarantees.py::test_guarantee_ids_are_unique",
        "- **G-B** a behaviour with no test",
        "- **G-C** a behaviour — tests/test_guarantees.py::test_that_was_removed",
        "- **G-D** a behaviour — tests/test_no_such_module.py::test_x",
        "- **G-E** a behaviour — test_guarantees.py::test_guarantee_ids_are_unique",
        "- **G-A** the same id again — tests/test_guarantees.py::test_guarantee_ids_are_unique",
    ])
    listed = items(text)
    assert [gid for gid, _ in listed] == ["G-A", "G-B", "G-C", "G-D", "G-E", "G-A"]
    problems = problems_of(listed)
    assert [p.split(":")[0] for p in problems] == ["G-B", "G-C", "G-D", "G-E"], problems
    assert Counter(gid for gid, _ in listed)["G-A"] == 2
