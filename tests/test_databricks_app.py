"""The status page started as Databricks Apps starts it: the app resource's ``config`` command and environment
(resources/heartbeat_ui.app.yml), the wheel alone (no dbt project, no profiles: HEARTBEAT_PROJECT_DIR unset, so
the package's folder), a working directory with no checkout in it. It serves the overview, and an operator
action is recorded; the runner's next tick shows it in the control table.

What stands in for the platform: the package copied out of this checkout into a folder of its own (what the
wheel installs into site-packages; a test of the wheel's files is in test_wheel_task.py), the local engine on a
lakehouse a runner seeded instead of Databricks Connect to serverless (the reads are not under test here: the
Databricks-shaped leg reads through the catalog), and the sign-in's X-Forwarded-Email header.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from harness import HEADER, CliLakehouse
from harness import config_row as row

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
OPERATOR = "ops@example.com"


def app_config() -> tuple[list[str], dict[str, str]]:
    """The app resource's command and environment, as the bundle deploys them."""
    (app,) = yaml.safe_load((REPO / "resources" / "heartbeat_ui.app.yml").read_text())["resources"]["apps"].values()
    return list(app["config"]["command"]), {e["name"]: str(e["value"]) for e in app["config"]["env"]}


def installed_wheel(site: Path) -> Path:
    """The package as the wheel installs it: ``heartbeat_runner`` alone in a folder on the path."""
    shutil.copytree(REPO / "heartbeat_runner", site / "heartbeat_runner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert not (site / "dbt_project.yml").exists()
    return site


def post(url: str, action: str, job_id: str, user: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/api/actions/{action}", method="POST", data=json.dumps({"job_id": job_id, "reason": "test"}).encode(),
        headers={"Content-Type": "application/json", "X-Heartbeat-Action": "confirm", "X-Forwarded-Email": user})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_the_app_started_as_databricks_apps_starts_it_serves_the_overview_and_records_an_action(tmp_path):
    config, jobs = tmp_path / "cfg.csv", tmp_path / "jobs.yml"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    jobs.write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'print(1)']\n")
    runner = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs)
    runner.cli("seed")
    runner.cli("run")

    command, env = app_config()
    assert command[:3] == ["python", "-m", "heartbeat_runner"] and "ui" in command
    # actions on, as docs/databricks.md says to turn them on; the local engine stands in for Databricks Connect
    target = command.index("--target")
    command = [sys.executable, *command[1:target], "--target", "local", *command[target + 2:], "--allow-actions"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = tmp_path / "app"
    workdir.mkdir()
    app_env = {
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "JAVA_HOME")},
        **{k: v for k, v in env.items() if "${" not in v and k != "DATABRICKS_SERVERLESS_COMPUTE_ID"},
        # what Databricks Apps sets; the lakehouse the runner keeps (a catalog's schema on Databricks)
        "DATABRICKS_APP_NAME": "heartbeat-ui", "DATABRICKS_APP_PORT": str(port),
        "HEARTBEAT_HOME": str(runner.home), "HEARTBEAT_UI_OPERATORS": OPERATOR,
        "PYTHONPATH": str(installed_wheel(tmp_path / "site-packages")),
    }
    assert "HEARTBEAT_PROJECT_DIR" not in app_env
    server = subprocess.Popen(command, env=app_env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/api/meta", timeout=10) as answer:
                    meta = json.loads(answer.read())
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.communicate()[0][-6000:]
                time.sleep(0.5)
        assert meta["actions_enabled"] is True
        with urllib.request.urlopen(base + "/api/overview", timeout=60) as answer:
            assert [j["job_id"] for j in json.loads(answer.read())["jobs"]] == ["J1"]

        status, done = post(base, "pause", "J1", OPERATOR)
        assert status == 200, (done, server.poll())
        assert "J1 paused by ops@example.com" in done["done"] and "the runner's next tick" in done["done"]
        assert post(base, "pause", "J1", "analyst@example.com")[0] == 403
    finally:
        server.terminate()
        out = server.communicate(timeout=60)[0]
    assert "Traceback" not in out, out[-3000:]
    paused = runner.events("JOB_PAUSED")
    assert [json.loads(e["payload"])["by"] for e in paused] == [OPERATOR]
    # the process holding the dbt project (the runner) derives the control table from the event
    runner.cli("run")
    assert {r["job_state"] for r in runner.table("heartbeat_control") if r["is_active"]} == {"PAUSED"}
