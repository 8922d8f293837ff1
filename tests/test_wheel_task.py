"""The wheel-task contract of Databricks, on the everyday leg: the runtime calls the ``heartbeat`` entry point and
ignores what it returns; only an exception or a non-zero ``SystemExit`` fails the task (and pages someone).

The entry point is looked up as the runtime looks it up (``tests/databricks_runtime.py``: the distribution's
``console_scripts``), from metadata written out of this checkout's ``pyproject.toml`` ``[project.scripts]``
(what the wheel build writes into ``entry_points.txt``), so the test sees this checkout's declaration even
where the installed metadata is another checkout's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import tomllib
from databricks_runtime import run_task
from harness import HEADER
from harness import config_row as row

REPO = Path(__file__).resolve().parent.parent


def checkout_distribution(folder: Path) -> list[str]:
    """A dist-info of this checkout (name, version, console scripts) in ``folder``; the search path holding it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    info = folder / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    scripts = "".join(f"{name} = {target}\n" for name, target in project["scripts"].items())
    (info / "entry_points.txt").write_text("[console_scripts]\n" + scripts)
    return [str(folder)]


@pytest.fixture
def wheel_task(tmp_path, monkeypatch):
    """Run the ``heartbeat`` entry point as a wheel task would, in a fresh HEARTBEAT_HOME; its exit as the run sees it."""
    path = checkout_distribution(tmp_path / "site")
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("HEARTBEAT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HEARTBEAT_HOME", str(tmp_path / "lh"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run_task sets it, as the runtime does

    def run(*parameters: str) -> int:
        return run_task("heartbeat_runner", "heartbeat", list(parameters), path=path)
    return run


def test_a_wheel_task_whose_seed_config_is_broken_ends_failed(tmp_path, wheel_task, capsys):
    broken = tmp_path / "heartbeat_sensor_config.csv"
    broken.write_text("\n".join([HEADER, row("delta_table", "db.t", "J1", state="MAYBE")]) + "\n")
    assert wheel_task("seed", "--config", str(broken)) != 0  # FAILED, so on_failure notifications fire
    err = capsys.readouterr().err
    assert "line 2, column job_state" in err and "Traceback" not in err


def test_a_wheel_task_that_succeeds_ends_successful(tmp_path, wheel_task, capsys):
    good = tmp_path / "heartbeat_sensor_config.csv"
    good.write_text("\n".join([HEADER, row("delta_table", "db.t", "J1")]) + "\n")
    assert wheel_task("validate", "--config", str(good)) == 0
    assert "Traceback" not in capsys.readouterr().err
