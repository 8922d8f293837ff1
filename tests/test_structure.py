"""The package's import graph has no cycle, and every import points down the layers.

Every import counts, lazy ones inside functions too. The layers, lowest first, are the
folders of ``heartbeat_runner`` (docs/architecture.md): a module may import its own folder
and the folders below it, never one above.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "heartbeat_runner"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from a import b`` counts b when b is a module)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(f"{t}.")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


#: the layer folders from the bottom up; folders in one tuple are siblings of one rank and may not import each
#: other (``jobs`` and ``senders``: the outbound adapters for runs and for alert messages)
LAYERS = (("core",), ("engines",), ("lakehouse",), ("sensing",), ("jobs", "senders"), ("policies",), ("runner",),
          ("interfaces",))
FOLDERS = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}


def layer_of(module: str) -> int | None:
    """Rank of a module's layer folder; None for the package root (``__init__``, ``__main__``)."""
    parts = module.split(".")
    return FOLDERS.get(parts[1]) if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every ``a -> b`` where b's layer is above a's, or beside it in another folder of the same rank."""
    found = []
    for name, targets in sorted(graph.items()):
        rank = layer_of(name)
        for target in sorted(targets):
            target_rank = layer_of(target)
            if rank is None or target_rank is None:
                continue
            sideways = target_rank == rank and name.split(".")[1] != target.split(".")[1]
            if target_rank > rank or sideways:
                found.append(f"{name} ({name.split('.')[1]}) -> {target} ({target.split('.')[1]})")
    return found


def test_every_module_lives_in_a_layer():
    loose = [m for m in import_graph() if layer_of(m) is None and m not in {"heartbeat_runner", "heartbeat_runner.__main__"}]
    assert loose == [], f"modules outside the layer folders: {loose}"


def test_imports_point_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_the_checker_finds_an_upward_import():
    graph = {"heartbeat_runner.lakehouse.store": {"heartbeat_runner.policies.catch_up"},
             "heartbeat_runner.policies.catch_up": {"heartbeat_runner.core.windows"}}
    assert upward_imports(graph) == [
        "heartbeat_runner.lakehouse.store (lakehouse) -> heartbeat_runner.policies.catch_up (policies)"]


def test_the_checker_finds_an_import_between_siblings():
    graph = {"heartbeat_runner.senders.send": {"heartbeat_runner.jobs.databricks_workspace"}}
    assert upward_imports(graph) == [
        "heartbeat_runner.senders.send (senders) -> heartbeat_runner.jobs.databricks_workspace (jobs)"]


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def fault_points_used() -> set[str]:
    """The fault points the package's code names (``FaultPoint.X``, or a step of ``ARCHIVE_STEPS``)."""
    from heartbeat_runner.core.faults import ARCHIVE_STEPS, FaultPoint

    used: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "faults.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "FaultPoint":
                used.add(FaultPoint[node.attr].value)
            elif isinstance(node, ast.Name) and node.id == "ARCHIVE_STEPS":
                used |= {point.value for steps in ARCHIVE_STEPS.values() for point in vars(steps).values()}
    return used


def test_every_fault_point_is_in_the_one_registry_and_used():
    """crash_point/fail_point take a FaultPoint (mypy rejects a bare string); every member is reached by the code."""
    from heartbeat_runner.core.faults import FaultPoint

    assert fault_points_used() == {p.value for p in FaultPoint}


# -- the tick: its order in one short module, its mechanisms each guarded ---------------------------------

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def test_the_tick_module_holds_the_order_and_its_steps_live_in_their_own_modules():
    """runner/tick.py is the order of the steps (at most 400 lines, as issue 54 asks); each step is a module of
    its own that does not import the order back."""
    tick = PACKAGE / "runner" / "tick.py"
    assert len(tick.read_text().splitlines()) <= 400
    for step in ("sensing_step", "triggering", "reconciliation", "tick_report", "tick_parts", "tick_result"):
        text = (PACKAGE / "runner" / f"{step}.py").read_text()
        assert "heartbeat_runner.runner.tick import" not in text, step


def test_every_test_the_architecture_names_as_a_guard_exists():
    """docs/architecture.md's table of what a change to the tick must respect names real tests."""
    section = ARCHITECTURE.read_text().split("## Changing the tick", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", section)
    assert len(named) >= 10
    for path, name in named:
        source = PACKAGE.parent / path
        assert source.is_file(), path
        if name:
            assert re.search(rf"^def {name}\(", source.read_text(), re.M), f"{path}::{name}"
