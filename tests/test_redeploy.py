"""A redeploy under a running loop: the bundle uploads new project files (HEARTBEAT_PROJECT_DIR) while a
continuous job's run keeps the wheel it started with. The loop must not tick on with old code against new
models: before its next tick it stops with a distinct non-zero exit code (so the platform fails the run and
starts a new one, on the new wheel) and gives the tick lease up (the new run does not wait for it to expire).
A redeploy of the same files (same bytes) changes nothing.
"""

from __future__ import annotations

import json
import signal
import sys

import pytest
from harness import HEADER, CliLakehouse, project_copy, wait_for
from harness import config_row as row

from heartbeat_runner.runner.loop import EXIT_PROJECT_CHANGED

pytestmark = pytest.mark.slow


def test_a_loop_whose_project_is_redeployed_stops_non_zero_and_releases_its_lease(tmp_path):
    """One loop: the same bytes written again keep it ticking; a changed model stops it with
    EXIT_PROJECT_CHANGED, and a tick right after is not skipped for the loop's lease."""
    project = project_copy(tmp_path)
    config, jobs = tmp_path / "cfg.csv", tmp_path / "jobs.yml"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    jobs.write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'print(1)']\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs,
                        env={"HEARTBEAT_PROJECT_DIR": str(project)})
    lake.cli("seed")
    loop = lake.start("run", "--loop", "--interval", "1", "--no-wakeups")
    model = next((project / "models").rglob("*.sql"))
    try:
        alive = lake.home / "locks" / "heartbeat.alive"
        wait_for(lambda: alive.exists() or loop.poll() is not None, 180, "the loop's first tick")
        assert loop.poll() is None, loop.communicate()
        # a redeploy of the same version: compared by content, so the loop ticks on
        first = json.loads(alive.read_text())["ticked_at"]
        model.write_bytes(model.read_bytes())
        wait_for(lambda: json.loads(alive.read_text())["ticked_at"] > first + 1.5 or loop.poll() is not None, 60,
                 "two more ticks")
        assert loop.poll() is None, loop.communicate()
        # the redeploy of a new version: a model's file changes (here: a comment)
        model.write_text(model.read_text() + "\n-- redeployed\n")
        out, err = loop.communicate(timeout=120)
    finally:
        if loop.poll() is None:
            loop.send_signal(signal.SIGKILL)
            loop.communicate()
    assert loop.returncode == EXIT_PROJECT_CHANGED, err[-3000:]
    assert f"the dbt project {project} changed since this loop started" in err and "Traceback" not in err
    # the lease was given up: a tick right after runs instead of being skipped for the loop's lease
    after = json.loads(lake.cli("run", "--json", "--wait-lease", "0").stdout)
    assert not after.get("skipped"), after
