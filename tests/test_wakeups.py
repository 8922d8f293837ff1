"""Wake-ups: ``run --loop`` senses a source as soon as it says it changed, and polling stays the truth.

None of these tests is timed: the loops poll every 600 s, far longer than any test waits, so a job that
runs within the wait was started by a wake-up; the lost wake-up test polls every few seconds instead and
loses every notification, so only the poll can start the job.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from harness import HEADER, MARKER_JOB, CliLakehouse, marker_jobs_file, wait_for
from harness import config_row as row
from services import kafka_broker  # noqa: F401 (fixture)

from heartbeat_runner.core.records import utcnow
from heartbeat_runner.interfaces import cli
from heartbeat_runner.runner.loop import RunConfig, run_loop
from heartbeat_runner.runner.tick_result import TickResult
from heartbeat_runner.runner.wake_endpoint import make_wake_server
from heartbeat_runner.runner.wakeups import POLL, TickScope, WakeSignal
from heartbeat_runner.sensing.watch import FolderWatch

TOKEN = "wake-token-for-tests"


# -- the signal and the loop's schedule (scripted ticks, no lakehouse) ------------------------------

def test_wake_ups_in_a_burst_coalesce_into_one_scope_and_a_poll_forgets_them():
    wakes = WakeSignal()
    for key in ("a", "b", "a"):
        wakes.wake(key)
    assert wakes.take() == TickScope(frozenset({"a", "b"}))
    assert wakes.take() is None
    wakes.wake("a")
    wakes.wake()  # every source
    assert wakes.take() == POLL


def test_a_wake_up_ticks_at_once_for_its_sources_and_never_moves_the_next_poll(restore_signals):
    """Interval 600 s: after the first poll, every tick the loop makes comes from a wake-up, limited to the
    sources it named; the ticks a burst asks for while one runs coalesce into one."""
    wakes, scopes = WakeSignal(), []

    def tick(start, scope):
        scopes.append(scope)
        if len(scopes) == 1:
            wakes.wake("orders")
            wakes.wake("drop")  # while the poll runs: one tick after it
        elif len(scopes) == 2:
            threading.Timer(0.2, wakes.wake, args=("orders",)).start()
        else:
            signal.raise_signal(signal.SIGTERM)
        return TickResult(run_id=f"r{len(scopes)}", snapshot_ts=utcnow(), scope=scope)

    args = argparse.Namespace(interval=600, json=False)
    code = run_loop(tick, RunConfig(interval_s=600, lease_wait_s=0.0, wakeups=True), cli._LoopStatus(args),
                    wakes=wakes)
    assert code == 0
    assert scopes == [POLL, TickScope(frozenset({"orders", "drop"})), TickScope(frozenset({"orders"}))]


def test_while_ticks_fail_the_loop_backs_off_deaf_to_wake_ups_and_then_polls(restore_signals):
    wakes, scopes = WakeSignal(), []

    def tick(start, scope):
        scopes.append(scope)
        if len(scopes) == 1:
            threading.Timer(0.1, wakes.wake, args=("orders",)).start()
            raise RuntimeError("engine died")
        signal.raise_signal(signal.SIGTERM)
        return TickResult(run_id="r2", snapshot_ts=utcnow(), scope=scope)

    args = argparse.Namespace(interval=0.5, json=False)
    run_loop(tick, RunConfig(interval_s=0.5, lease_wait_s=0.0, wakeups=True), cli._LoopStatus(args), wakes=wakes)
    assert scopes == [POLL, POLL]  # the wake-up was not a tick of its own: the poll after the back-off sensed all


def test_a_folder_watch_wakes_on_a_renamed_in_file_and_ignores_temporary_ones(tmp_path):
    woken: list[str] = []
    folder = tmp_path / "triggers" / "drop"
    later = tmp_path / "triggers" / "later"  # made after the watch started: its root is watched
    folder.mkdir(parents=True)
    watch = FolderWatch({folder: frozenset({"k1"}), later: frozenset({"k2"})}, {tmp_path / "triggers"},
                        woken.append, ignore=lambda name: name.endswith(".tmp")).start()
    try:
        assert watch.watching and not watch.unwatched
        (folder / "_x.tmp").write_text("partial")
        (folder / "_x.tmp").rename(folder / "a.done")
        wait_for(lambda: "k1" in woken, 10, "a wake-up for k1")
        later.mkdir()
        (later / "b.done").write_text("ready")
        wait_for(lambda: "k2" in woken, 10, "a wake-up for a folder made after the watch started")
    finally:
        watch.close()
    missing = FolderWatch({tmp_path / "nowhere" / "x": frozenset({"k"})}, {tmp_path / "nowhere"},
                          woken.append).start()
    assert not missing.watching and "does not exist" in missing.unwatched[tmp_path / "nowhere"]


def test_an_absolute_trigger_folder_made_after_the_loop_started_wakes_it_when_its_parent_exists(tmp_path):
    """What docs/wakeups.md says of a trigger folder that does not exist yet: one under the trigger directory, or
    an absolute one whose parent exists, is watched through that parent (a file in it once it is made wakes the
    loop); an absolute one whose parent is missing too is polled (and tried again later)."""
    from types import SimpleNamespace

    from heartbeat_runner.core.records import SensingTarget
    from heartbeat_runner.sensing.sources.registry import source_for

    def target(folder: Path) -> SensingTarget:
        return SensingTarget(f"trigger_file:{folder}", "trigger_file", str(folder), None, None, "batch", None)

    (tmp_path / "drops").mkdir()
    made_later, orphan = tmp_path / "drops" / "inventory", tmp_path / "nowhere" / "inventory"
    woken: list[str] = []
    ctx = SimpleNamespace(trigger_dir=tmp_path / "triggers")
    watch = source_for("trigger_file").watch([target(made_later), target(orphan)], ctx, woken.append)
    try:
        assert watch.watching and list(watch.unwatched) == [tmp_path / "nowhere"]
        made_later.mkdir()
        (made_later / "a.done").write_text("ready")
        wait_for(lambda: f"trigger_file:{made_later}" in woken, 10, "a wake-up for the folder made later")
    finally:
        watch.close()


def test_reading_files_under_a_watched_root_queues_nothing_so_a_big_sensing_pass_never_overflows(
        tmp_path, caplog, monkeypatch):
    """A tick at 10,000 sources reads every Delta log under the watched warehouse. Reads must not reach the
    watch: inotify's queue (fs.inotify.max_queued_events, 16,384 by default) overflowed on them in a busy
    loop, and each overflow re-walks the whole tree. 20,000 reads deliver no event at all; then one write
    wakes, and nothing overflowed."""
    from heartbeat_runner.sensing import watch as watch_module

    delivered: list[str] = []
    dispatch = watch_module._Handler.dispatch
    monkeypatch.setattr(watch_module._Handler, "dispatch",
                        lambda self, event: (delivered.append(event.event_type), dispatch(self, event))[1])
    woken: list[str] = []
    logs = tmp_path / "warehouse" / "t" / "_delta_log"
    logs.mkdir(parents=True)
    for i in range(200):
        (logs / f"{i:020d}.json").write_text("{}")
    watch = FolderWatch({logs: frozenset({"t"})}, {tmp_path / "warehouse"}, woken.append).start()
    try:
        with caplog.at_level("WARNING", logger="watchdog"):
            for _ in range(100):
                for path in logs.iterdir():
                    path.read_bytes()
            time.sleep(1)
            assert not woken and not delivered
            (logs / "commit.json").write_text("{}")
            wait_for(lambda: "t" in woken, 10, "a wake-up for the write")
        assert not [r for r in caplog.records if "overflow" in r.getMessage().lower()]
    finally:
        watch.close()


# -- the real runner ----------------------------------------------------------------------------------

@pytest.fixture
def lake(tmp_path) -> CliLakehouse:
    """J1 reads the trigger folder ``drop``, J2 the local Delta table ``sales.orders``, J3 a trigger folder
    outside the trigger directory that does not exist when the loop starts (polled, or woken by POST)."""
    outside = tmp_path / "outside" / "drop3"
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1"), row("delta_table", "sales.orders", "J2"),
                                 row("trigger_file", str(outside), "J3")]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config,
                        jobs_file=marker_jobs_file(tmp_path / "jobs.yml", "J1", "J2", "J3"))
    lake.append_ids("sales.orders", 1)
    lake.cli("seed")
    lake.outside = outside  # type: ignore[attr-defined]
    return lake


class Loop:
    """``run --loop`` of ``lake`` with its output in files (read while it runs)."""

    def __init__(self, lake: CliLakehouse, *args: str, env: dict[str, str] | None = None):
        self.out, self.err = (lake.home.parent / "loop.out").open("w+"), (lake.home.parent / "loop.err").open("w+")
        self.process = subprocess.Popen(lake.command("run", "--loop", *args), env={**lake.env, **(env or {})},
                                        stdout=self.out, stderr=self.err, text=True, cwd=lake.home.parent)

    def stderr(self) -> str:
        return Path(self.err.name).read_text()

    def first_poll_done(self) -> None:
        """Wait until the first poll ended: the sources' notifications are on from then."""
        wait_for(lambda: "tick 1 · " in self.stderr() or self.process.poll() is not None, 120, "the first poll")
        assert self.process.poll() is None, self.stderr()[-3000:]

    def wait(self, predicate, what: str) -> None:
        wait_for(lambda: predicate() or self.process.poll() is not None, 120, what)
        assert self.process.poll() is None, self.stderr()[-3000:]

    def stop(self) -> str:
        """SIGTERM; its stderr, once it ended cleanly."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        err = self.stderr()
        assert self.process.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        return err


def test_a_trigger_file_and_a_delta_commit_wake_the_loop_long_before_its_interval(lake):
    loop = Loop(lake, "--interval", "600")
    try:
        loop.first_poll_done()
        lake.drop_trigger_file("drop", "a.done")
        loop.wait(lambda: lake.executions().get("J1") == 1, "J1, woken by its file")
        lake.append_ids("sales.orders", 2)
        loop.wait(lambda: lake.executions().get("J2") == 1, "J2, woken by its commit")
    finally:
        loop.stop()
    assert lake.executions() == {"J1": 1, "J2": 1}
    woken = [r for r in lake.table("heartbeat_runs") if r["jobs_triggered"]]
    # each tick sensed one source, and the source of a job whose run's end it recorded (J1's, when its end came
    # in the tick that J2's commit woke)
    assert len(woken) == 2 and all(r["sources_sensed"] == 1 + r["jobs_completed"] for r in woken), woken


def test_a_lost_wake_up_is_caught_by_the_next_poll(lake):
    loop = Loop(lake, "--interval", "3", env={"HEARTBEAT_FAIL_AT": "lose_wake_up:1000000"})
    try:
        loop.first_poll_done()
        lake.drop_trigger_file("drop", "a.done")
        loop.wait(lambda: lake.executions().get("J1") == 1, "J1, by the poll")
    finally:
        err = loop.stop()
    assert "was lost (the next poll senses it)" in err
    assert lake.executions() == {"J1": 1}


def _data_lands_during_a_run(tmp_path, before_exit: str) -> tuple[CliLakehouse, list[dict]]:
    """A loop polling every 600 s with wake-ups on; J1 runs until the test releases it, then runs ``before_exit``
    (Python) and leaves its marker. A trigger file lands while J1 runs; the loop stops once J1 ran twice and the
    tick that records the second end is seen. The lakehouse and its events."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    started, release = tmp_path / "started", tmp_path / "release"
    job = (f"import pathlib, time; pathlib.Path({str(started)!r}).touch()\n"
           f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n" + before_exit + MARKER_JOB)
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(f"jobs:\n  'J1': [{sys.executable!r}, '-c', {job!r}]\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs)
    lake.cli("seed")
    loop = Loop(lake, "--interval", "600")
    try:
        loop.first_poll_done()
        lake.drop_trigger_file("drop", "a.done")
        loop.wait(started.exists, "J1's first run")
        lake.drop_trigger_file("drop", "b.done")  # lands while J1 runs
        release.touch()
        loop.wait(lambda: lake.executions().get("J1") == 2, "J1's second run, long before the next poll")
        loop.wait(lambda: "triggered 0 · completed 1" in loop.stderr(), "the tick that records its end")  # idle
    finally:
        loop.stop()
    events = lake.table("heartbeat_events")
    return lake, events


def test_data_that_lands_while_a_job_runs_is_sensed_by_the_tick_that_records_its_end_which_starts_the_next_run(
        tmp_path):
    """Wake-ups on, a poll every 600 s: J1 runs until the test releases it; a trigger file lands meanwhile (its
    folder is skipped while J1 runs). The tick woken by the run's end records the end, senses J1's folder and
    starts J1 again: one tick, no poll waited for."""
    lake, events = _data_lands_during_a_run(tmp_path, "")
    first = min((e for e in events if e["event_type"] == "TRIGGERED"), key=lambda e: e["event_ts"])
    (end,) = [e for e in events if e["event_type"] == "COMPLETED" and e["job_run_id"] == first["job_run_id"]]
    same_tick = {e["event_type"] for e in events if e["run_id"] == end["run_id"]}
    assert {"COMPLETED", "NEW_DATA", "TRIGGER_REQUESTED", "TRIGGERED"} <= same_tick, same_tick
    (row_,) = [r for r in lake.table("heartbeat_runs") if r["run_id"] == end["run_id"]]
    assert (row_["jobs_completed"], row_["sources_with_new_data"], row_["jobs_triggered"]) == (1, 1, 1), row_


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_data_that_lands_while_a_job_runs_is_sensed_when_its_own_complete_ended_the_run(tmp_path):
    """As above, but J1 records its own end (``complete``, as a Databricks job's last task does) before its process
    exits: the tick its exit wakes folds that end, senses J1's folder and starts J1 again."""
    lake, events = _data_lands_during_a_run(tmp_path, (
        "import os, subprocess, sys\n"
        "if not pathlib.Path(os.environ['HEARTBEAT_HOME'], 'ran').exists():\n"
        "    subprocess.run([sys.executable, '-m', 'heartbeat_runner', 'complete', '--job-id', 'J1'], check=True)\n"))
    first, second = sorted((e for e in events if e["event_type"] == "TRIGGERED"), key=lambda e: e["event_ts"])
    (end,) = [e for e in events if e["event_type"] == "COMPLETED" and e["job_run_id"] == first["job_run_id"]]
    assert end["run_id"] not in {r["run_id"] for r in lake.table("heartbeat_runs")}, end  # J1's own, not a tick's
    same_tick = {e["event_type"] for e in events if e["run_id"] == second["run_id"]}
    assert {"NEW_DATA", "TRIGGER_REQUESTED", "TRIGGERED"} <= same_tick and second["event_ts"] > end["event_ts"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: bytes | None, token: str | None = TOKEN) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/wake", data=body or b"", method="POST",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_post_wake_senses_the_named_source_at_once_and_refuses_what_it_must(lake):
    port = _free_port()
    loop = Loop(lake, "--interval", "600", "--wake-port", str(port), env={"HEARTBEAT_WAKE_TOKEN": TOKEN})
    outside: Path = lake.outside  # type: ignore[attr-defined]
    try:
        loop.first_poll_done()
        outside.mkdir(parents=True)  # made after the watch started, outside any watched folder: no notification
        (outside / "a.done").write_text("ready")
        assert _post(port, b'{"sources": ["x"]}', token=None)[0] == 401
        assert _post(port, b'{"sources": ["x"]}', token="wrong")[0] == 401
        assert _post(port, b"not json")[0] == 400
        assert _post(port, b'{"sources": "x"}')[0] == 400
        status, answer = _post(port, json.dumps({"sources": [str(outside), "no.such.source"]}).encode())
        assert status == 202 and answer == {"woken": 1, "unknown": ["no.such.source"]}
        loop.wait(lambda: lake.executions().get("J3") == 1, "J3, woken by POST /wake")
    finally:
        err = loop.stop()
    assert TOKEN not in err
    assert lake.executions() == {"J3": 1}


def test_a_wake_port_without_a_token_is_refused_in_one_line(lake):
    done = lake.cli("run", "--loop", "--interval", "600", "--wake-port", str(_free_port()), check=False)
    assert done.returncode != 0
    assert "HEARTBEAT_WAKE_TOKEN" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_wake_server_answers_a_bad_length_in_one_line():
    wakes = WakeSignal()
    server = make_wake_server("127.0.0.1", 0, TOKEN, wakes, lambda name: frozenset({"k"}) if name == "s" else frozenset())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(f"POST /wake HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                         "Content-Length: -5\r\n\r\n".encode())
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 400") and b"whole number" in answer
        assert _post(port, b'{"sources": ["s"]}') == (202, {"woken": 1, "unknown": []})
        assert wakes.take() == TickScope(frozenset({"k"}))
        assert _post(port, b"") == (202, {"woken": "every source"}) and wakes.take() == POLL
    finally:
        server.shutdown()
        server.server_close()


def test_a_kafka_message_wakes_its_topic_and_a_busy_topic_is_not_read_through(kafka_broker):
    """A long-polling consumer at the end of the watched topic: a new message wakes its source; a burst
    wakes it a few times (its partition pauses after each), not once per message."""
    from services import sense_context, sensing_target

    from heartbeat_runner.sensing.sources.kafka import KafkaSource

    topic = f"orders.{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, partitions=2)
    kafka_broker.produce(topic, "before the watch")  # at the end already: wakes nothing
    ctx = sense_context(None, {"kafka": {"shop": {"bootstrap.servers": kafka_broker.bootstrap}}})
    target = sensing_target("kafka", f"shop: {topic}")
    woken: list[str] = []
    watch = KafkaSource().watch([target], ctx, woken.append)
    assert watch is not None
    try:
        time.sleep(3)  # assigned at the end
        assert woken == []
        kafka_broker.produce(topic, "new", partition=1)
        wait_for(lambda: woken == [target.source_key], 30, "a wake-up for the topic")
        kafka_broker.produce(topic, *[f"m{i}" for i in range(50)])
        wait_for(lambda: len(woken) >= 2, 30, "a wake-up for the burst")
        time.sleep(2)
        assert len(woken) < 20, len(woken)  # paused after each: not a wake-up per message
    finally:
        watch.close()


def test_a_kafka_message_that_comes_while_its_partition_pauses_still_wakes_its_topic(kafka_broker, monkeypatch):
    """The partition pauses after a wake-up; a message produced during that pause (and nothing after it)
    wakes the topic again when the pause ends, instead of waiting for the next poll."""
    from services import sense_context, sensing_target

    from heartbeat_runner.sensing.sources.kafka import KafkaSource, KafkaWatch

    monkeypatch.setattr(KafkaWatch, "PAUSE_S", 4.0)  # long enough to produce inside it on a slow machine
    topic = f"orders.{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic)
    ctx = sense_context(None, {"kafka": {"shop": {"bootstrap.servers": kafka_broker.bootstrap}}})
    target = sensing_target("kafka", f"shop: {topic}")
    woken: list[float] = []
    watch = KafkaSource().watch([target], ctx, lambda key: woken.append(time.monotonic()))
    assert watch is not None
    try:
        time.sleep(3)  # assigned at the end
        kafka_broker.produce(topic, "first")
        wait_for(lambda: len(woken) == 1, 30, "a wake-up for the first message")
        kafka_broker.produce(topic, "during the pause")
        produced = time.monotonic()
        assert produced < woken[0] + KafkaWatch.PAUSE_S  # it did come during the pause
        wait_for(lambda: len(woken) == 2, 30, "a wake-up for the message that came during the pause")
        assert woken[1] >= woken[0] + KafkaWatch.PAUSE_S  # when the pause ended, not before
    finally:
        watch.close()
