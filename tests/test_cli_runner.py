"""The tests' in-process CLI (tests/cli_runner.py) answers as a real ``python -m heartbeat_runner`` does.

Most tests run read-only and one-shot commands through the CLI's ``main`` in their own process, to save the
1.7-2.6 s of a cold start each. That is only sound while both give the same exit code, the same output and the
same refusals, and while what depends on process state still runs as a process: this module holds both to it.
"""

from __future__ import annotations

import os
import sys

import cli_runner
import connect_sessions
import pytest
from harness import HEADER
from harness import config_row as row

#: commands whose whole answer does not depend on the machine's state: usage errors, a refused flag, a valid and
#: an invalid config, a missing lakehouse (nothing is created)
CASES = [
    ["--version"],
    ["runs", "--limit", "-3"],
    ["frobnicate"],
    ["validate", "--config", "{good}"],
    ["validate", "--json", "--config", "{bad}"],
    ["status", "--json", "--lakehouse-dir", "{missing}"],
]


def _plain_env(**more: str) -> dict[str, str]:
    """This process's environment without the Spark Connect address an in-process engine of an earlier test in
    this worker may have left in it (a user's shell has none)."""
    return {**{k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}, **more}


def _both(args: list[str], env: dict[str, str], tmp_path):
    in_process = cli_runner.run_cli(args, env=env, cwd=tmp_path)
    cli_runner.force_processes(True)
    try:
        process = cli_runner.run_cli(args, env=env, cwd=tmp_path)
    finally:
        cli_runner.force_processes(False)
    return in_process, process


def test_in_process_and_process_give_the_same_exit_code_output_and_refusals(tmp_path):
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    good.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    bad.write_text("\n".join([HEADER, row("no_such_source", "x", "J1", hard="maybe")]) + "\n")
    env = _plain_env(HEARTBEAT_HOME=str(tmp_path / "lh"))
    assert not cli_runner.needs_process(["status"], env) or cli_runner.ALL_PROCESSES
    for case in CASES:
        args = [a.format(good=good, bad=bad, missing=tmp_path / "missing") for a in case]
        in_process, process = _both(args, env, tmp_path)
        assert in_process.returncode == process.returncode, (args, in_process, process)
        assert in_process.stdout == process.stdout, args
        # stderr: the same lines; a usage message names the program as the process saw it
        assert in_process.stderr.replace(sys.argv[0], "").splitlines()[-1:] == process.stderr.splitlines()[-1:], args
        assert "Traceback" not in in_process.stderr
    assert not (tmp_path / "missing").exists() and not (tmp_path / "lh").exists(), "a read-only command created something"
    assert os.environ.get("HEARTBEAT_HOME") != str(tmp_path / "lh"), "the command's environment leaked into the test's"


@pytest.mark.parametrize(("args", "env"), [
    (["run", "--loop"], {}),
    (["serve"], {}),
    (["run"], {"HEARTBEAT_CRASH_AT": "after_sensing"}),
    (["run"], {"HEARTBEAT_FAIL_AT": "after_sensing:1"}),
    (["status"], {"HEARTBEAT_TARGET": "spark"}),
    (["status"], {"HEARTBEAT_TARGET": "spark-local", "SPARK_REMOTE": "sc://127.0.0.1:1"}),
    (["validate"], {"PYTHONPATH": "/opt/plugins"}),
])
def test_what_depends_on_process_state_runs_as_a_process(args, env):
    """Crashes, per-process fault counts, loops, servers, remote engines and an import path of the command's own
    (where plugins are found) never run inside the test."""
    assert cli_runner.needs_process(args, _plain_env(**env))


@pytest.mark.skipif(cli_runner.ALL_PROCESSES, reason="HEARTBEAT_TEST_CLI=process runs every command as a process")
def test_a_command_beside_the_tests_own_engine_runs_here_on_its_own_and_leaves_the_tests_engine_as_it_was(hb):
    """A test that holds an embedded engine (``hb``: a Spark Connect session, SPARK_REMOTE in the environment)
    still runs its one-shot commands in its process: the command opens its own engine, answers as a process
    does, and the test's session is its default again afterwards and still answers."""
    import json

    from pyspark.sql.connect.session import SparkSession as ConnectSession

    hb.create_table("sales.orders", "id int")
    hb.seed(row("delta_table", "sales.orders", "J1"))
    hb.tick()
    mine = ConnectSession._get_default_session()
    assert mine is not None and os.environ.get("SPARK_REMOTE")
    env = {**os.environ, **hb.settings.lakehouse_env(), "HEARTBEAT_HOME": str(hb.home),
           "HEARTBEAT_CONFIG": str(hb.config_path), "HEARTBEAT_JOBS_FILE": str(hb.jobs_path)}
    assert not cli_runner.needs_process(["status", "--json"], env)
    here, process = _both(["status", "--json"], env, hb.root)
    assert here.returncode == process.returncode == 0, (here.stderr, process.stderr)
    assert [(r["trigger_job_id"], r["status"]) for r in json.loads(here.stdout)] == \
        [(r["trigger_job_id"], r["status"]) for r in json.loads(process.stdout)] == [("J1", None)]
    assert ConnectSession._get_default_session() is mine         # the test's engine is the default again
    hb.insert("sales.orders", "(1)")
    assert [s.outcome.value for s in hb.tick().sensed] == ["NEW_DATA"]  # ...and still answers


def test_a_session_left_current_after_its_server_ended_is_found_and_taken_out():
    """What conftest checks after every test: a Spark Connect session left as the process's current one after
    its server ended is found (a later column function would retry against it for minutes), and forgetting
    it empties the slots; one made inside ``set_aside`` is never current afterwards."""
    from pyspark.sql import SparkSession

    from heartbeat_runner.engines.sail_process import SailProcess

    server = SailProcess.start()
    with connect_sessions.set_aside():
        try:
            session = SparkSession.builder.remote(server.url).create()
            assert session.sql("SELECT 1 AS one").collect()[0]["one"] == 1
            assert session in connect_sessions.current() and not connect_sessions.dead_current()
        finally:
            server.stop()
        assert connect_sessions.dead_current() == [session]
        connect_sessions.forget([session])
        assert session not in connect_sessions.current() and not connect_sessions.dead_current()
    assert session not in connect_sessions.current()


@pytest.mark.skipif(cli_runner.ALL_PROCESSES, reason="HEARTBEAT_TEST_CLI=process runs every command as a process")
def test_plain_one_shot_commands_run_in_process_unless_switched():
    assert not cli_runner.needs_process(["status", "--json"], _plain_env())
    cli_runner.force_processes(True)
    try:
        assert cli_runner.needs_process(["status", "--json"], _plain_env())
    finally:
        cli_runner.force_processes(False)
