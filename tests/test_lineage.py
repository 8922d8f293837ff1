"""OpenLineage events (docs/lineage.md): real runners (`python -m heartbeat_runner`), real local jobs, a real HTTP
receiver on loopback; every event received is validated against the OpenLineage JSON schema."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from alert_receivers import AlertReceiver
from harness import HEADER, MARKER_JOB, CliLakehouse, wait_for
from harness import config_row as row

from heartbeat_runner.senders.lineage import (
    ConsumedInput,
    LineageKind,
    LineageRecord,
    build_event,
    lineage_configured,
    lineage_run_id,
)
from heartbeat_runner.sensing.sources.base import LineageDataset, LineageNaming
from heartbeat_runner.sensing.sources.registry import source_for

LINEAGE_PATH = "/api/v1/lineage"
NAMESPACE = "acme.sales"


@pytest.fixture
def receiver():
    with AlertReceiver() as server:
        yield server


@pytest.fixture(scope="module")
def schema():
    pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates the events")
    pytest.importorskip("openlineage.client", reason="openlineage-python (the lineage extra) builds the schema")
    from openlineage_schema import validator

    return validator()


def lineage_lake(tmp_path: Path, receiver: AlertReceiver | None) -> CliLakehouse:
    """J1 (succeeds) reads Delta table up.orders and the trigger folder ``drop``; J2 (exits 3) reads ``drop``.
    Seeded, and its baseline tick run (nothing triggered), with lineage to ``receiver`` when given."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.orders", "J1"), row("trigger_file", "drop", "J1"),
                                 row("trigger_file", "drop", "J2")]) + "\n")
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(f"jobs:\n  'J1': [{sys.executable!r}, '-c', {MARKER_JOB!r}]\n"
                    f"  'J2': [{sys.executable!r}, '-c', 'raise SystemExit(3)']\n")
    env = {"HEARTBEAT_LINEAGE_NAMESPACE": NAMESPACE}
    if receiver is not None:
        env["OPENLINEAGE_URL"] = receiver.url
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs, env=env)
    lake.home.mkdir()
    lake.append_ids("up.orders", 1)
    lake.cli("seed")
    lake.cli("run")  # baseline
    return lake


def new_data(lake: CliLakehouse) -> None:
    lake.append_ids("up.orders", 2, 3)
    lake.drop_trigger_file("drop", "batch-1.done")


def received(receiver: AlertReceiver, schema) -> list[dict]:
    """The lineage events received, in order, each valid against the OpenLineage schema."""
    with receiver._lock:
        bodies = [r.body for r in receiver.received if r.path == LINEAGE_PATH]
    for body in bodies:
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in schema.iter_errors(body)]
        assert not errors, (errors, body)
    return bodies


def per_run(events: list[dict]) -> Counter:
    return Counter((e["run"]["runId"], e["eventType"]) for e in events)


def test_each_run_sends_start_with_its_inputs_and_windows_then_complete_or_fail(tmp_path, receiver, schema):
    lake = lineage_lake(tmp_path, receiver)
    new_data(lake)
    lake.cli("run")                                   # triggers J1 and J2: START of each
    lake.wait_local_runs()
    lake.cli("run")                                   # reconciles: COMPLETE of J1, FAIL of J2
    events = received(receiver, schema)
    triggered = {e["trigger_job_id"]: str(e["job_run_id"]) for e in lake.events("TRIGGERED")}
    assert set(triggered) == {"J1", "J2"}
    run_ids = {job: lineage_run_id(NAMESPACE, job, run) for job, run in triggered.items()}
    assert per_run(events) == Counter({(run_ids["J1"], "START"): 1, (run_ids["J1"], "COMPLETE"): 1,
                                       (run_ids["J2"], "START"): 1, (run_ids["J2"], "FAIL"): 1})
    for job, run_id in run_ids.items():                # START before its end, and the backend's run id in a facet
        mine = [e for e in events if e["run"]["runId"] == run_id]
        assert mine[0]["eventType"] == "START"
        assert {e["run"]["facets"]["heartbeatRun"]["jobRunId"] for e in mine} == {triggered[job]}
        assert {(e["job"]["namespace"], e["job"]["name"]) for e in mine} == {(NAMESPACE, job)}

    start = next(e for e in events if e["run"]["runId"] == run_ids["J1"] and e["eventType"] == "START")
    inputs = {(i["namespace"], i["name"]): i["inputFacets"]["heartbeatWindow"] for i in start["inputs"]}
    drop = str(lake.home / "triggers" / "drop")
    assert set(inputs) == {("spark_catalog", "up.orders"), ("file", drop)}
    windows = {e["sensor_id"]: e for e in lake.events("NEW_DATA")}
    for (_, name), facet in inputs.items():
        sensor_id = "drop" if name == drop else "up.orders"
        assert (facet["windowFrom"], facet["windowUntil"], facet.get("rows")) == (
            windows[sensor_id]["window_from"], windows[sensor_id]["window_to"], windows[sensor_id]["rows"])
        assert facet["windowUntil"] and facet["sensorId"] == sensor_id
    (j2_start,) = [e for e in events if e["run"]["runId"] == run_ids["J2"] and e["eventType"] == "START"]
    assert [(i["namespace"], i["name"]) for i in j2_start["inputs"]] == [("file", drop)]
    (fail,) = [e for e in events if e["eventType"] == "FAIL"]
    assert fail["run"]["facets"]["errorMessage"]["message"]
    assert len(lake.events("LINEAGE_SENT")) == 4     # each recorded once, so no later run sends them again
    lake.cli("run")
    assert len(received(receiver, schema)) == 4


@pytest.mark.slow
def test_a_run_ended_by_its_own_complete_gets_its_complete_event_from_the_next_tick_of_the_loop(
        tmp_path, receiver, schema):
    """J3's last task is `complete` (the spec's "update status" task, every Databricks job's last task). In a loop
    polling every 600 s, the tick the run's end wakes records nothing itself (the row is already COMPLETED), and
    before it the COMPLETE event waited for the monitor's look back, up to 600 s. Now that tick sends it."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop3", "J3")]) + "\n")
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(f'jobs:\n  "J3":\n    command: "{sys.executable} -c pass && {sys.executable} -m heartbeat_runner '
                    'complete --job-id J3"\n')
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs,
                        env={"HEARTBEAT_LINEAGE_NAMESPACE": NAMESPACE, "OPENLINEAGE_URL": receiver.url})
    lake.home.mkdir()
    lake.cli("seed")
    lake.cli("run")  # baseline
    loop = lake.start("run", "--loop", "--interval", "600")
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(loop.stderr), daemon=True)
    reader.start()
    try:
        # the first poll is done: the watches are on from then (a lost wake-up would wait 600 s)
        wait_for(lambda: any(line.startswith("tick 1 ") for line in err) or loop.poll() is not None, 120,
                 "the first poll")
        lake.drop_trigger_file("drop3", "a.done")
        wait_for(lambda: {e["eventType"] for e in received(receiver, schema)} >= {"START", "COMPLETE"}
                 or loop.poll() is not None, 90, "the START and COMPLETE events of J3's run")
        assert loop.poll() is None, "".join(err[-30:])
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=60)
    reader.join(timeout=10)
    (completed,) = [e for e in lake.events("COMPLETED") if e["trigger_job_id"] == "J3"]
    assert json.loads(completed["payload"]).get("via") == "cli"  # recorded by the job's own `complete`
    assert per_run(received(receiver, schema)) == Counter({
        (lineage_run_id(NAMESPACE, "J3", str(completed["job_run_id"])), "START"): 1,
        (lineage_run_id(NAMESPACE, "J3", str(completed["job_run_id"])), "COMPLETE"): 1})


def test_a_run_whose_end_is_recorded_twice_gets_one_complete_event(tmp_path, receiver, schema, monkeypatch):
    """A run's end can be recorded twice: its job's own `complete` lands after a tick read the control table and
    before that tick saw the job's process end, so the tick records the end again. The second end, coming after
    the first was sent and recorded as sent, is not sent again: the monitor remembers what it recorded."""
    from harness import Harness

    from heartbeat_runner.core.records import Event, EventType, utcnow
    from heartbeat_runner.runner.lineage import LineageMonitor
    from heartbeat_runner.runner.tick_result import TickObservers, TickResult

    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    for name in [n for n in os.environ if n.startswith("OPENLINEAGE__")]:
        monkeypatch.delenv(name)
    # the client writes its transport into os.environ (OPENLINEAGE__TRANSPORT__...): put back as it was after
    monkeypatch.setattr(os, "environ", os.environ.copy())
    (tmp_path / "lake").mkdir()
    with Harness(tmp_path / "lake") as hb:
        hb.jobs(J1=0)
        hb.seed(row("trigger_file", "a", "J1"))
        hb.tick()  # the baseline
        hb.drop_trigger_file("a", "1.done")
        assert hb.tick().triggered_job_ids == ["J1"]
        hb.wait_for_jobs()  # the tick that sees the run end queues its COMPLETE
        wait_for(lambda: "COMPLETE" in {e["eventType"] for e in received(receiver, schema)}, 30, "the COMPLETE event")
        hb.tick()  # records the COMPLETE as sent
        (completed,) = hb.events("COMPLETED")
        observers = hb.heartbeat.observer.observers if isinstance(hb.heartbeat.observer, TickObservers) else []
        (monitor,) = [o for o in observers if isinstance(o, LineageMonitor)]
        again = TickResult(run_id="again", snapshot_ts=utcnow())
        again.run_events = [Event(event_type=EventType.COMPLETED, run_id="again", snapshot_ts=utcnow(),
                                  trigger_job_id="J1", job_run_id=str(completed["job_run_id"]))]
        monitor.observe(again)  # the same run's end recorded a second time
        monitor.close()
    assert Counter(e["eventType"] for e in received(receiver, schema)) == Counter({"START": 1, "COMPLETE": 1})


def test_nothing_is_sent_or_printed_when_openlineage_is_not_configured(tmp_path, monkeypatch):
    for name in ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    lake = lineage_lake(tmp_path, None)
    new_data(lake)
    done = lake.cli("run")
    lake.wait_local_runs()
    done2 = lake.cli("run")
    assert len(lake.events("TRIGGERED")) == 2 and len(lake.events("COMPLETED")) == 1
    for proc in (done, done2):                       # the client (its console fallback) was never made
        assert "OpenLineage" not in proc.stderr and "eventType" not in proc.stdout + proc.stderr, proc.stderr
    assert not lake.events("LINEAGE_SENT")
    # what "configured" means: the client's own places, and its off switch
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    assert not lineage_configured({}, cwd, home)
    assert lineage_configured({"OPENLINEAGE_URL": "http://x"}, cwd, home)
    assert lineage_configured({"OPENLINEAGE__TRANSPORT__TYPE": "console"}, cwd, home)
    assert not lineage_configured({"OPENLINEAGE_URL": "http://x", "OPENLINEAGE_DISABLED": "true"}, cwd, home)
    (cwd / "openlineage.yml").write_text("transport: {type: console}\n")
    assert lineage_configured({}, cwd, home)


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_a_receiver_that_is_down_then_up_gets_each_event_exactly_once(tmp_path, receiver, schema):
    lake = lineage_lake(tmp_path, receiver)
    receiver.mode = "error"                          # refuses everything (HTTP 500)
    loop = lake.start("run", "--loop", "--interval", "0.3")
    try:
        new_data(lake)
        wait_for(lambda: len(lake.events("FAILED")) == 1 and len(lake.events("COMPLETED")) == 1
                 or loop.poll() is not None, 120, "both runs to end")
        assert loop.poll() is None, loop.communicate()
        wait_for(lambda: receiver.refused >= 2, 30, "the receiver to refuse deliveries")
        assert not received(receiver, schema)
        receiver.mode = "ok"
        wait_for(lambda: len(received(receiver, schema)) >= 4, 90, "the events after the receiver is back")
        wait_for(lambda: len(lake.events("LINEAGE_SENT")) == 4, 30, "the deliveries to be recorded")
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.communicate(timeout=60)
    lake.cli("run")                                  # a new runner: nothing left to send
    counts = per_run(received(receiver, schema))
    assert sorted(kind for _, kind in counts) == ["COMPLETE", "FAIL", "START", "START"]
    assert set(counts.values()) == {1}


def test_a_runner_killed_during_delivery_leaves_no_run_without_its_events(tmp_path, receiver, schema):
    """Death (os._exit, as SIGKILL) right after the transport accepted an event, before it is recorded, twice:
    each next runner sends what is unrecorded; every run gets its START and its COMPLETE or FAIL; a repeat is
    the same event (same run id and type)."""
    lake = lineage_lake(tmp_path, receiver)
    new_data(lake)
    crashed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": "after_lineage_sent"})
    assert crashed.returncode == 86
    assert len(lake.events("TRIGGERED")) == 2 and len(received(receiver, schema)) == 1
    lake.wait_local_runs()
    crashed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": "after_lineage_sent"})
    assert crashed.returncode == 86                  # killed again, after the next event
    lake.cli("run")
    counts = per_run(received(receiver, schema))
    triggered = {e["trigger_job_id"]: str(e["job_run_id"]) for e in lake.events("TRIGGERED")}
    j1, j2 = (lineage_run_id(NAMESPACE, job, triggered[job]) for job in ("J1", "J2"))
    assert {key for key in counts} == {(j1, "START"), (j1, "COMPLETE"), (j2, "START"), (j2, "FAIL")}
    assert sum(counts.values()) == 4 + 2             # each kill repeated the one event it had sent, no more
    assert len(lake.events("LINEAGE_SENT")) == 4


# -- naming and building, without a runner -------------------------------------------------------


def test_each_source_type_names_its_dataset_by_the_openlineage_conventions(tmp_path):
    naming = LineageNaming(
        connections={"kafka": {"sales": {"bootstrap.servers": "SASL_SSL://broker-1:9093,broker-2:9093"}},
                     "jdbc": {"wh": {"url": "postgresql+psycopg://loader:s3cret@db.example:5432/sales"},
                              "ms": {"reader": "spark", "jdbc_url": "jdbc:sqlserver://sql.example:1433;databaseName=x"},
                              "ref": {"url": {"env": "WH_URL"}}}},
        trigger_dir=tmp_path / "triggers", table_namespace="databricks://adb-1.azuredatabricks.net")
    expected = {
        ("delta_table", "main.sales.orders"): ("databricks://adb-1.azuredatabricks.net", "main.sales.orders"),
        ("delta_table", "/lake/orders"): ("file", "/lake/orders"),
        ("lmu_delta_table", "s3://bucket/lake/orders"): ("s3://bucket", "lake/orders"),
        ("delta_table", "abfss://raw@acct.dfs.core.windows.net/orders"): (
            "abfss://raw@acct.dfs.core.windows.net", "orders"),
        ("delta_upstream_sensor_table", "ops.state#sales.orders"): (
            "databricks://adb-1.azuredatabricks.net", "ops.state"),
        ("kafka", "sales: orders.v1"): ("kafka://broker-1:9093", "orders.v1"),
        ("jdbc", "wh:public.orders"): ("postgres://db.example:5432", "sales.public.orders"),
        ("jdbc", "ms:dbo.orders"): ("sqlserver://sql.example:1433", "x.dbo.orders"),
        ("jdbc", "ref:orders"): ("jdbc://ref", "orders"),
        ("sap_bw", "bw_prod:ZCHAIN"): ("sap_bw://bw_prod", "ZCHAIN"),
        ("sap_b4", "ZCHAIN"): ("sap_b4://default", "ZCHAIN"),
        ("trigger_file", "drop"): ("file", str(tmp_path / "triggers" / "drop")),
    }
    found = {key: source_for(key[0]).lineage_dataset(*key, naming) for key in expected}
    assert found == {key: LineageDataset(*value) for key, value in expected.items()}
    assert "s3cret" not in json.dumps([vars(d) for d in found.values()])


def test_a_failure_message_is_redacted_in_the_event(schema):
    from openlineage.client.serde import Serde

    record = LineageRecord(LineageKind.FAIL, NAMESPACE, "J9", "77", datetime.now(timezone.utc),
                           (ConsumedInput("file", "/x", "trigger_file", "x"),),
                           message="could not reach postgresql://loader:s3cret@db.example/sales\nTraceback ...")
    body = json.loads(Serde.to_json(build_event(record)))
    assert not list(schema.iter_errors(body))
    assert "s3cret" not in json.dumps(body) and "\n" not in body["run"]["facets"]["errorMessage"]["message"]
    assert body["run"]["runId"] == lineage_run_id(NAMESPACE, "J9", "77")
