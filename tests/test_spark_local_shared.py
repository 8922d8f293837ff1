"""Apache Spark as a lakehouse's one engine: shared by every command, recorded in the lakehouse, with
a sensor state table that followers can keep following.

A Spark JVM takes 10-40 s to start here, so these tests reuse the session's JVM (``hb`` on the Spark
shapes): the test process holds it, and the CLI processes the tests start join it through its Spark
Connect address (lakehouse/spark_share.py) instead of starting their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from harness import Harness
from harness import config_row as row

from heartbeat_runner.core.records import JobStatus
from heartbeat_runner.core.settings import load_settings
from heartbeat_runner.lakehouse import made_by, spark_share
from heartbeat_runner.lakehouse.store import Cond
from heartbeat_runner.runner.tick import COUNT_FIGURES

#: a Spark test here is a few ticks of a JVM, each up to a minute or more on 2 loaded cores
pytestmark = pytest.mark.timeout(1800)

#: seconds a CLI process joining the held engine may take (a Spark Connect client and a few queries,
#: on 2 loaded cores): generous, a bound against hanging rather than a speed check
CLI_TIMEOUT_S = 240
#: seconds a Spark tick's job may take to be seen finished (ticks of a loaded JVM)
JOB_TIMEOUT_S = 300
#: seconds the whole demo may take on Spark (a JVM start, ~20 dbt nodes, a dozen ticks)
DEMO_TIMEOUT_S = 1200


def _cli(hb: Harness, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m heartbeat_runner ARGS`` on the harness's lakehouse and engine, from another process."""
    settings_env = {"HEARTBEAT_HOME": str(hb.home), "HEARTBEAT_CONFIG": str(hb.config_path),
                    "HEARTBEAT_JOBS_FILE": str(hb.jobs_path), **hb.settings.lakehouse_env(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "heartbeat_runner", *args], env={**os.environ, **settings_env},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=hb.root)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    return proc


@pytest.mark.engines("spark-connect", "spark-classic")
def test_commands_from_other_processes_join_the_held_engine_and_a_job_completes_itself(hb):
    """While this process holds the lakehouse's Spark, a job's final `complete`, `status` and `pause`
    run in other processes through it: none starts a JVM, none meets the Derby lock, and the server
    logs no error when they leave (with reattachable executions it logged ``ERROR ErrorUtils: Spark
    Connect RPC error during: async-grpc-response-sender`` now and then, see _connect_session)."""
    address = spark_share.holder_address(hb.settings.effective_spark_dir.resolve())
    assert address is not None and address.pid == os.getpid()
    hb.create_table("shared_sales.orders", "id bigint")
    complete = f"{sys.executable} -m heartbeat_runner complete --job-id J1"
    hb.jobs_path.write_text(f'jobs:\n  "J1":\n    command: "{complete}"\n  "J2":\n    command: ["true"]\n')
    hb.seed(row("delta_table", "shared_sales.orders", "J1"), row("delta_table", "shared_sales.orders", "J2"))
    hb.tick()
    hb.insert("shared_sales.orders", "(1)")
    assert sorted(hb.tick().triggered_job_ids) == ["J1", "J2"]

    hb.wait_for_jobs(timeout=JOB_TIMEOUT_S)

    assert hb.job_status("J1") == {JobStatus.COMPLETED.value}
    job_logs = "".join(p.read_text() for p in (hb.home / "jobs" / "runs").glob("*/output.log"))
    assert "job J1: recorded" in job_logs and "XSDB6" not in job_logs and "Starting Apache Spark" not in job_logs
    status = _ok(_cli(hb, "status", "--json"))
    assert "Starting Apache Spark" not in status.stderr and "XSDB6" not in status.stderr
    assert {r["trigger_job_id"] for r in json.loads(status.stdout)} == {"J1", "J2"}
    _ok(_cli(hb, "pause", "--job-id", "J2"))
    assert {r["job_state"] for r in hb.rows("J2")} == {"PAUSED"}
    server_log = hb.settings.effective_spark_dir / "spark-connect" / "server.log"
    assert _alarms(server_log.read_text() if server_log.exists() else "") == []


def test_a_lakehouse_refuses_the_engine_that_did_not_make_it(tmp_path):
    """`status` with Spark on a Sail lakehouse (and the reverse) stops with a message naming both engines
    and the way out, before a JVM starts or a table is written."""
    (tmp_path / "sail").mkdir()
    with Harness(tmp_path / "sail") as hb:
        hb.seed(row("trigger_file", "drops", "J1"))
    tables = sorted(p.name for p in (hb.home / "warehouse" / "heartbeat").iterdir())

    proc = _cli(hb, "status", env={"HEARTBEAT_TARGET": "spark-local"})

    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "made by target 'local'" in proc.stderr and "target 'spark-local'" in proc.stderr
    assert made_by.MIGRATE_DOC in proc.stderr
    assert not (hb.home / "spark").exists()
    assert sorted(p.name for p in (hb.home / "warehouse" / "heartbeat").iterdir()) == tables

    spark_home = tmp_path / "spark-made"
    made_by.check_and_record(load_settings(lakehouse_dir=str(spark_home), env={"HEARTBEAT_TARGET": "spark-local"}))
    sail = _cli(hb, "status", env={"HEARTBEAT_HOME": str(spark_home), "HEARTBEAT_TARGET": "local"})
    assert sail.returncode == 1 and "made by target 'spark-local'" in sail.stderr
    assert not (spark_home / "warehouse").exists()


@pytest.mark.engines("spark-classic")
def test_a_follower_keeps_its_place_in_the_sensor_state_across_rebuilds(hb):
    """heartbeat_sensor_state is updated in place: the same table id at every rebuild, and a follower
    that remembers a version reads every change since it through the change data feed."""
    state = hb.app.store.name("heartbeat_sensor_state")
    hb.create_table("follow_sales.orders", "id bigint")
    hb.create_table("follow_sales.refunds", "id bigint")
    hb.jobs(J1=0, J2=0)
    hb.seed(row("delta_table", "follow_sales.orders", "J1"), row("delta_table", "follow_sales.refunds", "J2"))
    hb.tick()

    def detail() -> tuple[str, int]:
        found = hb.spark.sql(f"DESCRIBE DETAIL {state}").collect()[0]
        return found["id"], int(hb.spark.sql(f"DESCRIBE HISTORY {state} LIMIT 1").collect()[0]["version"])

    table_id, place = detail()
    seen: dict[str, str] = {}
    for rebuild, table in enumerate(("orders", "refunds", "orders"), start=1):
        hb.insert(f"follow_sales.{table}", f"({rebuild})")
        hb.tick()
        hb.wait_for_jobs(timeout=JOB_TIMEOUT_S)
        now_id, version = detail()
        assert now_id == table_id, f"rebuild {rebuild} replaced the table"
        assert version > place
        changes = (hb.spark.read.format("delta").option("readChangeFeed", "true")
                   .option("startingVersion", place + 1).table(state)
                   .where("_change_type in ('insert', 'update_postimage')").collect())
        for change in sorted(changes, key=lambda c: c["_commit_version"]):
            seen[change["sensor_id"]] = change["status"]
        by_version = {r["sensor_id"]: r["status"]
                      for r in hb.spark.sql(f"SELECT * FROM {state} VERSION AS OF {version}").collect()}
        assert seen == by_version, f"rebuild {rebuild}: the feed since version {place} and the table differ"
        place = version
    assert set(seen) == {"delta_table:follow_sales.orders", "delta_table:follow_sales.refunds"}
    assert set(seen.values()) == {"PROCESSED_NEW_DATA"}


#: what a normal lifecycle must not log: an ERROR line, a Java or Python stack trace
ALARMS = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|^\s+at [\w.$]+\(|Exception in thread", re.M)


def _alarms(text: str) -> list[str]:
    return [line for line in text.splitlines() if ALARMS.search(line)]


@pytest.mark.engines("spark-classic")
def test_the_demo_passes_on_spark_and_logs_no_error(tmp_path, engine_kind):
    """The demo on `spark-local` in its own process: every job COMPLETED (job 102 ends with its own
    `complete`, in a third process that joins the demo's engine), and not one ERROR line or stack trace
    from Spark, Delta, Hive or Python in the whole run."""
    home = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "heartbeat_runner", "demo", "--target", "spark-local", "--json",
                           "--lakehouse-dir", str(home)],
                          env={**os.environ, "HEARTBEAT_SPARK_MODE": "classic"}, capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT_S, cwd=tmp_path)

    assert proc.returncode == 0, f"stdout:{proc.stdout}\nstderr:{proc.stderr[-5000:]}"
    rows = json.loads(proc.stdout)
    assert {(r["trigger_job_id"], r["status"]) for r in rows} == {
        (job, JobStatus.COMPLETED.value) for job in ("101", "102", "103")}
    job_logs = "".join(p.read_text() for p in (home / "jobs" / "runs").glob("*/output.log"))
    assert "job 102: recorded" in job_logs
    assert _alarms(proc.stderr + job_logs) == []


def test_a_recorded_tick_duration_counts_every_stage_and_the_report(hb):
    """The duration written to heartbeat_runs covers each stage it lists, the report's rows included
    (it was taken before the report and its rebuild: an 80 s tick was recorded as 55 s)."""
    hb.create_table("timed_sales.orders", "id bigint")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "timed_sales.orders", "J1"))
    hb.tick()
    hb.insert("timed_sales.orders", "(1)")

    result = hb.tick()

    [run] = hb.app.store.read("heartbeat_runs", Cond("run_id", result.run_id))
    stages = {stage: seconds for stage, seconds in json.loads(run["stage_timings"]).items()
              if stage not in COUNT_FIGURES}  # the counts recorded beside the stages' seconds
    assert {"sensing", "dbt", "triggering", "report"} <= set(stages)
    assert run["duration_s"] >= sum(stages.values()) - 0.01  # rounding of the recorded figures
