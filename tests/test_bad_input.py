"""Bad input at the CLI and the page API: a one-line error naming the problem, a non-zero exit
(or a 4xx answer), no traceback, and nothing created or changed.

The CLI's own ``main`` in this process for most cases (tests/cli_runner.py: as a fresh process would see
its environment, working folder and output), real ``python -m heartbeat_runner`` processes for the rest.
The cases that need a lakehouse share one, built by real ticks: jobs J1 and J2 each ran once (trigger files).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cli_runner import run_cli
from harness import HEADER, CliLakehouse, marker_jobs_file
from harness import config_row as row

#: (command and flags, what the one-line error must name); argparse refuses these with exit 2
REFUSED_FLAGS = [
    (["runs", "--limit", "-3"], "--limit"),
    (["runs", "--limit", "0"], "--limit"),
    (["runs", "--limit", "many"], "--limit"),
    (["runs", "--limit", "99999999999999999999"], "--limit"),
    (["run", "--loop", "--interval", "-1"], "--interval"),
    (["run", "--interval", "nan"], "--interval"),
    (["run", "--wait-lease", "-5"], "--wait-lease"),
    (["run", "--loop", "--metrics-port", "0"], "--metrics-port"),  # as HEARTBEAT_METRICS_PORT=0 is
    (["ui", "--port", "70000"], "--port"),
    (["ui", "--port", "-1"], "--port"),
    (["ui", "--refresh", "0"], "--refresh"),
    (["ui", "--refresh", "inf"], "--refresh"),
    (["serve", "--port", "http"], "--port"),
    (["status", "--watch", "-2"], "--watch"),
    (["status", "--target", "mainframe"], "--target"),
    (["pause"], "--job-id"),
    (["retry"], "--job-id"),
    (["trigger", "--reason", "x"], "--job-id"),
    (["reset", "--job-id", "J1"], "--reason"),
    (["frobnicate"], "frobnicate"),
]

#: Commands that need an existing lakehouse (and create none).
NEEDS_A_LAKEHOUSE = [
    ["status"], ["status", "--json"], ["runs"], ["runs", "--run-id", "x"], ["explain", "--job-id", "J1"],
    ["pause", "--job-id", "J1"], ["resume", "--job-id", "J1"], ["complete", "--job-id", "J1"],
    ["retry", "--job-id", "J1"], ["trigger", "--job-id", "J1"],
    ["reset", "--job-id", "J1", "--reason", "r"], ["maintain"], ["rebuild"], ["ui", "--port", "0"],
]


def heartbeat(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m heartbeat_runner *args``: in this process where that proves the same (tests/cli_runner.py)."""
    return run_cli(args, env=os.environ if env is None else env, cwd=cwd or Path.cwd())


def assert_clean_refusal(proc: subprocess.CompletedProcess, *, names: str, code: int | None = None) -> None:
    """Refused with ``code`` (any non-zero when None), a message naming ``names``, and no traceback."""
    assert proc.returncode != 0 if code is None else proc.returncode == code, (proc.returncode, proc.stderr)
    assert names in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


@pytest.mark.parametrize(("args", "names"), REFUSED_FLAGS, ids=[" ".join(a) for a, _ in REFUSED_FLAGS])
def test_bad_flags_are_refused_before_anything_runs(tmp_path, args, names):
    home = tmp_path / "lakehouse"
    proc = heartbeat("--lakehouse-dir", str(home), *args, cwd=tmp_path)
    assert_clean_refusal(proc, names=names, code=2)
    assert not home.exists()


@pytest.mark.parametrize("args", NEEDS_A_LAKEHOUSE, ids=[" ".join(a) for a in NEEDS_A_LAKEHOUSE])
def test_a_mistyped_lakehouse_is_an_error_and_nothing_is_created(tmp_path, args):
    home = tmp_path / "lakehuose"
    proc = heartbeat(*args, "--lakehouse-dir", str(home), cwd=tmp_path)
    assert_clean_refusal(proc, names=f"no lakehouse at {home}", code=1)
    assert not home.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flags", "env", "named"), [(["--wake-port", "0"], {}, "--wake-port"),
                                                     ([], {"HEARTBEAT_WAKE_PORT": "0"}, "HEARTBEAT_WAKE_PORT")])
def test_a_wake_port_without_a_token_is_refused_naming_where_the_port_came_from(tmp_path, flags, env, named):
    """The refusal names the flag when the port came from ``--wake-port`` (it named the variable, which the user
    never set), and comes before the engine starts: the empty lakehouse folder stays empty."""
    import os

    home = tmp_path / "lakehouse"
    home.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in ("HEARTBEAT_WAKE_TOKEN", "HEARTBEAT_WAKE_PORT")}
    proc = heartbeat("run", "--loop", *flags, "--lakehouse-dir", str(home), env={**base, **env}, cwd=tmp_path)
    assert_clean_refusal(proc, names=f"{named} is set but HEARTBEAT_WAKE_TOKEN is not", code=1)
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("args", [["status"], ["run"], ["seed"], ["runs", "--json"]])
def test_a_file_given_as_the_lakehouse_is_an_error(tmp_path, args):
    home = tmp_path / "notes.txt"
    home.write_text("not a lakehouse\n")
    proc = heartbeat(*args, "--lakehouse-dir", str(home), cwd=tmp_path)
    assert_clean_refusal(proc, names="is a file, not a folder", code=1)
    assert home.read_text() == "not a lakehouse\n"


def test_json_commands_print_their_error_as_json_on_stdout(tmp_path):
    proc = heartbeat("status", "--json", "--lakehouse-dir", str(tmp_path / "missing"), cwd=tmp_path)
    assert proc.returncode == 1 and "no lakehouse at" in json.loads(proc.stdout)["error"]


def test_validate_json_prints_every_problem_as_json_on_stdout(tmp_path):
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "s.orders", "J1", hard="maybe"),
                                 row("no_such_source", "x", "J2")]) + "\n")
    proc = heartbeat("validate", "--json", "--config", str(config), "--lakehouse-dir", str(tmp_path / "lh"),
                     cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["valid"] is False and len(answer["problems"]) >= 2
    assert all(str(config) in problem for problem in answer["problems"]), answer
    assert not (tmp_path / "lh").exists()


def test_every_documented_target_is_accepted_by_the_parser(tmp_path):
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    for target in ("local", "spark-local", "spark", "databricks"):
        proc = heartbeat("validate", "--target", target, "--config", str(config), cwd=tmp_path)
        assert proc.returncode == 0 and "invalid choice" not in proc.stderr, (target, proc.stderr)


# -- with a lakehouse ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> CliLakehouse:
    """Two jobs, J1 and J2, that each ran once and completed."""
    root = tmp_path_factory.mktemp("bad_input")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop1", "J1"), row("trigger_file", "drop2", "J2")])
                      + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "J1", "J2"))
    lake.cli("seed")
    lake.cli("run")  # baseline
    lake.drop_trigger_file("drop1", "a.ready")
    lake.drop_trigger_file("drop2", "a.ready")
    lake.cli("run")  # triggers both
    deadline = time.monotonic() + 120
    while {e["trigger_job_id"] for e in lake.events("COMPLETED")} != {"J1", "J2"}:
        assert time.monotonic() < deadline, "J1 and J2 did not complete"
        time.sleep(0.5)
        lake.cli("run")
    return lake


def test_reset_since_a_future_time_is_refused_and_changes_nothing(lake):
    before = len(lake.events())
    proc = lake.cli("reset", "--job-id", "J1", "--since", "2099-01-01", "--reason", "typo", check=False)
    assert_clean_refusal(proc, names="in the future", code=1)
    assert len(lake.events()) == before


def test_unknown_ids_are_named(lake):
    before = len(lake.events())
    assert_clean_refusal(lake.cli("runs", "--run-id", "no-such-run", check=False), names="no-such-run", code=1)
    assert_clean_refusal(lake.cli("explain", "--job-id", "J9", check=False), names="J9", code=1)
    assert_clean_refusal(lake.cli("pause", "--job-id", "J9", check=False), names="J9", code=1)
    assert len(lake.events()) == before


def test_ui_on_a_busy_port_says_so(lake):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = lake.cli("ui", "--port", str(port), check=False)
    assert_clean_refusal(proc, names=f"cannot listen on 127.0.0.1:{port}", code=1)


def test_the_page_serves_a_runs_output_only_under_its_own_job(lake):
    runs = {e["trigger_job_id"]: e["job_run_id"] for e in lake.events("TRIGGERED")}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    page = lake.start("ui", "--port", str(port))
    try:
        base = f"http://127.0.0.1:{port}/api/jobs"
        deadline = time.monotonic() + 120
        while True:
            try:
                own = urllib.request.urlopen(f"{base}/J2/runs/{runs['J2']}/output", timeout=10)
                break
            except (urllib.error.URLError, ConnectionError):
                assert page.poll() is None and time.monotonic() < deadline, page.stderr.read() if page.stderr else ""
                time.sleep(0.5)
        assert own.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/J1/runs/{runs['J2']}/output", timeout=10)
        assert refused.value.code == 404 and "not a run of that job" in json.loads(refused.value.read())["error"]
    finally:
        page.terminate()
        page.wait(timeout=60)
