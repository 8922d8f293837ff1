"""A cold tick loads only what it needs: the command line without the engine, dbt or a dataframe library,
and a tick with nothing new without dbt."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

from harness import HEADER, CliLakehouse, Harness, marker_jobs_file, project_copy
from harness import config_row as row

REPO = Path(__file__).resolve().parents[1]


def _modules_after(*argv: str, tmp_path: Path, env: dict[str, str] | None = None) -> set[str]:
    """The modules ``python -m heartbeat_runner ARGV`` has loaded when it exits (it must exit 0)."""
    probe = ("import runpy, sys, atexit\n"
             "out = sys.argv[1]\n"
             "atexit.register(lambda: open(out, 'w').write('\\n'.join(sys.modules)))\n"
             f"sys.argv = ['heartbeat', *{list(argv)!r}]\n"
             "runpy.run_module('heartbeat_runner', run_name='__main__')\n")
    out = tmp_path / "modules.txt"
    done = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return set(out.read_text().split())


def test_the_version_and_the_command_line_load_no_engine_dbt_or_dataframe_library(tmp_path):
    loaded = _modules_after("--version", tmp_path=tmp_path)
    assert "heartbeat_runner.interfaces.cli" in loaded, "the probe ran the command line"
    heavy = {"dbt.cli.main", "pyspark", "pyspark.sql.connect.session", "pandas", "pyarrow", "databricks.sdk",
             "deltalake"}
    assert not heavy & loaded


def test_a_tick_with_nothing_new_loads_no_dbt(tmp_path):
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drops", "J1")]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", "J1"))
    lake.home.mkdir(parents=True)
    lake.cli("seed")
    lake.cli("run")  # the first tick sets the baseline
    loaded = _modules_after("run", tmp_path=tmp_path, env=lake.env)
    assert "heartbeat_runner.runner.tick" in loaded, "the probe ran a tick"
    assert "dbt.cli.main" not in loaded, "nothing moved: no build, so dbt is not even imported"
