"""Apache Spark as a lakehouse's one engine: shared by every command, recorded in the lakehouse, with
a sensor state table that followers can keep following (checked on the demo's lakehouse).

A Spark JVM takes 10-40 s to start here, so these tests reuse the session's JVM (``hb`` on the Spark
shapes): the test process holds it, and the CLI processes the tests start join it through its Spark
Connect address (engines/spark_share.py) instead of starting their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from harness import Harness
from harness import config_row as row

from heartbeat_runner.core.records import JobStatus
from heartbeat_runner.core.settings import load_settings
from heartbeat_runner.engines import made_by, spark_share
from heartbeat_runner.lakehouse.dbt_invoke import merge_stage_dir
from heartbeat_runner.lakehouse.store import Cond
from heartbeat_runner.runner.tick_result import COUNT_FIGURES

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


#: what a normal lifecycle must not log: an ERROR line, a Java or Python stack trace
ALARMS = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|^\s+at [\w.$]+\(|Exception in thread", re.M)


def _alarms(text: str) -> list[str]:
    return [line for line in text.splitlines() if ALARMS.search(line)]


def _repeated_warnings(text: str) -> list[str]:
    """WARN lines (timestamp aside) logged more than once: a warning at every statement or tick is noise
    no user can act on, and a running loop would print it forever."""
    warnings = Counter(re.sub(r"^[\d/]+ [\d:]+ ", "", line) for line in text.splitlines() if " WARN " in line)
    return sorted(line for line, times in warnings.items() if times > 1)


@pytest.mark.engines("spark-classic")
def test_the_demo_passes_on_spark_logs_no_error_and_a_follower_keeps_its_place(tmp_path, hb):
    """The demo on `spark-local` in its own process: every job COMPLETED (job 102 ends with its own
    `complete`, in a third process that joins the demo's engine), and not one ERROR line or stack trace
    from Spark, Delta, Hive or Python in the whole run, nor a warning logged twice.

    Then a follower product on another Spark (this test's, reading by path) walks the demo's
    heartbeat_sensor_state version by version: one table id in every commit (updated in place, never
    replaced), and at each version the change data feed since the last one, applied to what it had,
    equals the table read AS OF that version, across every rebuild of the demo."""
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
    assert _repeated_warnings(proc.stderr) == []
    staged = merge_stage_dir(load_settings(lakehouse_dir=str(home)))  # MERGE sources computed once, then removed
    assert staged.is_dir() and list(staged.iterdir()) == []

    [state] = [p.parent for p in home.rglob("heartbeat_sensor_state/_delta_log")]
    _follow(hb.spark, state)


def _follow(spark, table: Path) -> None:
    """Follow the Delta table at ``table`` from its first version to its last, as a follower product would."""
    commits = sorted((table / "_delta_log").glob("*.json"))
    versions = [int(c.stem) for c in commits]
    table_ids = {json.loads(line)["metaData"]["id"] for c in commits for line in c.read_text().splitlines()
                 if line.strip() and "metaData" in json.loads(line)}
    assert len(table_ids) == 1, f"the table was replaced: ids {table_ids}"
    # the demo's ticks rebuild the table three to five times:
    # two rebuilds after the first give the follower something to follow
    assert len(versions) >= 3, f"fewer than two rebuilds after the first: versions {versions}"

    def as_of(version: int) -> dict[str, str]:
        frame = spark.read.format("delta").option("versionAsOf", version).load(str(table))
        return {r["sensor_id"]: r["status"] for r in frame.collect()}

    seen = as_of(versions[0])
    for version in versions[1:]:
        changes = (spark.read.format("delta").option("readChangeFeed", "true")
                   .option("startingVersion", version).option("endingVersion", version).load(str(table))
                   .where("_change_type != 'update_preimage'").collect())
        for change in changes:
            if change["_change_type"] == "delete":
                seen.pop(change["sensor_id"], None)
            else:
                seen[change["sensor_id"]] = change["status"]
        assert seen == as_of(version), f"version {version}: the feed and the table differ"
    assert seen, "the follower saw no sensor"


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
              if stage not in COUNT_FIGURES and isinstance(seconds, (int, float))}  # counts and lists beside them
    assert {"sensing", "dbt", "triggering", "report"} <= set(stages)
    assert run["duration_s"] >= sum(stages.values()) - 0.01  # rounding of the recorded figures


@pytest.mark.engines("spark-connect", "spark-classic")
def test_a_first_tick_finds_its_upstream_tables_files_in_one_catalog_listing_per_schema(hb):
    """Issue 55: a first tick on local Spark asked each upstream table for its location with a DESCRIBE DETAIL of its
    own (each loads the table's snapshot): at 1,000 sources about 100 s of the cold start. Now one ``SHOW TABLE
    EXTENDED`` per schema finds them all; the locations are the tables' own, and sensing reads their logs there."""
    from heartbeat_runner.engines.engine import local_path

    tables = [f"loc_sales.t{i}" for i in range(4)]
    for name in tables:
        hb.create_table(name, "id bigint")
    hb.jobs(J1=0)
    hb.seed(*(row("delta_table", name, "J1") for name in tables))
    spark = hb.app.engine.spark
    plain, asked = spark.sql, []
    spark.sql = lambda text, *args, **kwargs: (asked.append(text), plain(text, *args, **kwargs))[1]
    try:
        hb.tick()  # the baseline
    finally:
        del spark.sql
    assert [text for text in asked if text.startswith("SHOW TABLE")] == ["SHOW TABLE EXTENDED IN loc_sales LIKE '*'"]
    assert not [text for text in asked if text.startswith("DESCRIBE DETAIL") and "loc_sales" in text], asked
    for name in tables:
        told = local_path(spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]["location"])
        assert hb.app.engine.delta_log_dir(name) == told
    for name in tables:
        hb.insert(name, "(1)")
    assert hb.tick().triggered_job_ids == ["J1"]
