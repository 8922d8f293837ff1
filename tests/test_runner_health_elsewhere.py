"""The runner's health seen from another machine: a runner on a job cluster leaves its liveness file on the
cluster's disk, so `status`, `check` and the page elsewhere (a laptop, the App) read its ticks from the
lakehouse (``heartbeat_runs``).

"Another machine" here: a second HEARTBEAT_HOME whose tables are the first one's (both ``warehouse`` folders
link to one) but whose own folder (liveness file, lease, alerts) is its own, as a laptop's is beside a job
cluster's ``/local_disk0``.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys

import pytest
from harness import HEADER, CliLakehouse, wait_for
from harness import config_row as row

pytestmark = pytest.mark.slow


def test_status_and_check_from_another_home_on_the_same_lakehouse_say_the_runner_ticks(tmp_path):
    config, jobs = tmp_path / "cfg.csv", tmp_path / "jobs.yml"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    jobs.write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'print(1)']\n")
    tables = tmp_path / "catalog"
    tables.mkdir()
    cluster = CliLakehouse(tmp_path / "cluster", config=config, jobs_file=jobs)
    cluster.home.mkdir()
    (cluster.home / "warehouse").symlink_to(tables, target_is_directory=True)
    cluster.cli("seed")
    # the laptop: the same tables, its own folder (no liveness file of its own)
    laptop = CliLakehouse(tmp_path / "laptop", config=config, jobs_file=jobs)
    shutil.copytree(cluster.home, laptop.home, symlinks=True, ignore=shutil.ignore_patterns("locks"))

    before = laptop.cli("check", check=False)
    assert before.returncode == 2 and "no tick recorded" in before.stdout  # nobody ticked yet anywhere

    # every idle tick written at once (HEARTBEAT_IDLE_FLUSH=0), and a long interval: the laptop reads while the
    # runner waits for its next tick, not while it writes
    runner = cluster.start("run", "--loop", "--interval", "120", env={"HEARTBEAT_IDLE_FLUSH": "0"})
    try:
        wait_for(lambda: (cluster.home / "warehouse" / "heartbeat" / "heartbeat_runs").is_dir()
                 and bool(cluster.table("heartbeat_runs")) or runner.poll() is not None, 180, "the first tick's row")
        assert runner.poll() is None, runner.communicate()
        assert not (laptop.home / "locks" / "heartbeat.alive").exists()

        shown = laptop.cli("status", env={"COLUMNS": "200"})
        assert "runner: ticking (last tick ended" in shown.stdout, (shown.stdout, shown.stderr, cluster.table("heartbeat_runs"))
        rows = json.loads(laptop.cli("status", "--json").stdout)
        assert rows and all(r["runner_healthy"] is True and r["runner_last_tick_at"] for r in rows)
        checked = laptop.cli("check", "--json")
        found = json.loads(checked.stdout)
        assert found["healthy"] is True and "read from heartbeat_runs; that tick: OK" in found["message"]
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.communicate(timeout=60)
