"""`serve` keeps the engine up so plain `dbt` (a separate process) sees the lakehouse."""

import os
import subprocess
import sys
import time

import pytest
from harness import HEADER
from harness import config_row as row


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_plain_dbt_against_the_served_engine(tmp_path):
    from heartbeat_runner.core.settings import load_settings, package_project_dir
    from heartbeat_runner.interfaces.serve import client_environment

    home = tmp_path / "lh"
    config = tmp_path / "cfg.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "db.t", "J1")]) + "\n")
    env = {**os.environ, "HEARTBEAT_HOME": str(home), "HEARTBEAT_CONFIG": str(config)}
    subprocess.run([sys.executable, "-m", "heartbeat_runner", "seed"], env=env, check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "heartbeat_runner", "serve", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "export SPARK_REMOTE=" in _read_until(server, "Ctrl-C to stop.")
        client = {**os.environ, **client_environment(load_settings(lakehouse_dir=str(home)), port),
                  "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"}
        show = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "dbt"), "show", "--inline", "select trigger_job_id, status from heartbeat.heartbeat_control",
             "--project-dir", str(package_project_dir()), "--target-path", str(tmp_path / "target"),
             "--log-path", str(tmp_path / "logs")],
            env=client, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert show.returncode == 0, show.stdout + show.stderr
        assert "J1" in show.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_until(process, marker: str, timeout: float = 60) -> str:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError("".join(seen))
