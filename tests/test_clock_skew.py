"""Commits, not clocks: writers whose clocks disagree (another runner, an operator's laptop, a job's ``complete``)
process each committed version once. Each writer's clock is shifted with libfaketime (Debian's ``faketime``),
preloaded into its process as ``faketime`` does; the JVM-free embedded engine stamps nothing that decides state."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
from harness import HEADER, MARKER_JOB, CliLakehouse, wait_for
from harness import config_row as row

LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)
pytestmark = pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime is not installed (Debian: faketime)")


def shifted(seconds: int) -> dict[str, str]:
    """The environment of a process whose wall clock is ``seconds`` ahead (negative: behind). Its monotonic clock
    moves by the same offset: libfaketime 0.9.10 leaving it alone fails Python's ``time.sleep`` (EINVAL)."""
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{seconds:+d}s"}


@pytest.fixture
def lake(tmp_path, template) -> CliLakehouse:
    return template.copy(tmp_path)


#: job 301: waits while <lakehouse>/hold exists, leaves its marker, and fails while <lakehouse>/fail exists
SLOW_MARKER_JOB = ("import os, pathlib, time; h = pathlib.Path(os.environ['HEARTBEAT_HOME'])\n"
                   "while (h / 'hold').exists(): time.sleep(0.05)\n" + MARKER_JOB + "\n"
                   "raise SystemExit(1 if (h / 'fail').exists() else 0)")


def seeded_lakehouse(tmp_path: Path) -> CliLakehouse:
    """One upstream Delta table sensed for job 301 (SLOW_MARKER_JOB), seeded and at its baseline."""
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.events", "301")]) + "\n")
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(f"jobs:\n  '301': [{sys.executable!r}, '-c', {SLOW_MARKER_JOB!r}]\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs)
    lake.home.mkdir()
    lake.append_ids("up.events", 0)
    lake.cli("seed")
    lake.cli("run")  # the baseline: version 0 is where sensing starts
    return lake


def consumed_twice(lake: CliLakehouse) -> dict[str, int]:
    """NEW_DATA event id -> how many trigger requests consumed it, for those consumed more than once."""
    counts: dict[str, int] = {}
    for request in lake.events("TRIGGER_REQUESTED"):
        for event_id in filter(None, (request["consumed_event_ids"] or "").split(",")):
            counts[event_id] = counts.get(event_id, 0) + 1
    return {event_id: n for event_id, n in counts.items() if n > 1}


def windows(lake: CliLakehouse) -> list[tuple[int, int] | None]:
    """The version ranges the runs read, in the order they were requested (None: a run that consumed no data,
    an operator's forced run)."""
    new_data = {e["event_id"]: e for e in lake.events("NEW_DATA")}
    spans: list[tuple[int, int] | None] = []
    for request in lake.events("TRIGGER_REQUESTED"):
        ids = [i for i in (request["consumed_event_ids"] or "").split(",") if i]
        if not ids:
            spans.append(None)
            continue
        spans.append((min(_version(new_data[i]["cursor_from"]) + 1 for i in ids),
                      max(_version(new_data[i]["cursor_to"]) for i in ids)))
    return spans


def _version(cursor: str | None) -> int:
    """A Delta cursor's version (-1: before the first)."""
    return json.loads(cursor)["version"] if cursor else -1


def stop(loop) -> str:
    loop.send_signal(signal.SIGTERM)
    out, err = loop.communicate(timeout=120)
    return out + err


def both_ticking(lake: CliLakehouse, loops: list) -> None:
    """Until each loop has held the tick lease (the lease row names its holder's pid; a loop lets go after its
    tick when another wants it), or AssertionError after 180 s."""
    seen: set[int] = set()
    rows: list[tuple] = []  # the lease rows seen, in order (what the loops did, when they do not both tick)

    def all_seen() -> bool:
        for lease_row in lake.table("heartbeat_lease"):
            seen.add(lease_row["pid"])
            shown = (round(time.time(), 1), *(lease_row[key] for key in ("pid", "owner", "wanted_by", "wanted_at")))
            if not rows or rows[-1][1:] != shown[1:]:
                rows.append(shown)
        assert all(loop.poll() is None for loop in loops), f"a loop ended: exits {[loop.poll() for loop in loops]}"
        return {loop.pid for loop in loops} <= seen

    try:
        wait_for(all_seen, 180, "both loops to tick")
    except AssertionError as exc:
        said = [stop(loop)[-3000:] for loop in loops]
        raise AssertionError(f"{exc}: loops {[loop.pid for loop in loops]}, lease rows {rows[-40:]}, said {said}") from exc


@pytest.mark.slow
def test_two_runners_a_minute_apart_read_each_version_in_one_run(lake):
    """Two loops on one lakehouse, one clock 60 s ahead, a commit every 0.7 s: no run re-reads a version."""
    # each waits up to 600 s for the lease, as the Spark twin below: with the default 30 s, one loop of three runs
    # three at a time ended (exit 0) before it ever held the lease
    loops = [lake.start("run", "--loop", "--interval", "0.3", "--wait-lease", "600"),
             lake.start("run", "--loop", "--interval", "0.3", "--wait-lease", "600", env=shifted(60))]
    try:
        both_ticking(lake, loops)  # a loaded machine can take over 20 s to start a loop: commit once both tick
        for n in range(1, 25):
            lake.append_ids("up.events", n)
            time.sleep(0.7)
        wait_for(lambda: any(span and span[1] == 24 for span in windows(lake)), 120, "a run reading version 24")
    finally:
        said = [stop(loop) for loop in loops]
    lake.wait_local_runs()
    assert consumed_twice(lake) == {}, (windows(lake), said)
    spans = [span for span in windows(lake) if span is not None]
    assert len(spans) == len(windows(lake)) and spans[-1][1] == 24, spans
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start == end + 1, spans  # each run starts where the last one's window ended


@pytest.mark.parametrize("skew", [90, -90])
@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_a_reset_from_a_skewed_clock_replays_once_then_reads_only_new_commits(lake, skew):
    lake.append_ids("up.events", 1)
    lake.cli("run")
    lake.wait_local_runs()
    lake.cli("run")  # the run's end
    lake.cli("reset", "--job-id", "301", "--reason", "replay", env=shifted(skew))
    lake.cli("run")  # the replay
    lake.wait_local_runs()
    lake.cli("run")
    lake.append_ids("up.events", 2)
    lake.cli("run")
    lake.wait_local_runs()
    lake.cli("run")
    # the first run, the replay from the start, then the new commit alone (not the replay again)
    assert windows(lake) == [(1, 1), (0, 1), (2, 2)]


def operator_scenario(lake: CliLakehouse, operator: dict[str, str]) -> tuple:
    """Pause, data, resume, a forced trigger, a run ended by its `complete` and a retry of a failed run, each command
    run with ``operator``'s environment; the windows the runs read, how often the job ran and its lifecycle events
    in order."""
    def ticks(n: int = 1) -> None:
        for _ in range(n):
            lake.cli("run")
            lake.wait_local_runs()

    lake.append_ids("up.events", 1)
    ticks(2)
    lake.cli("pause", "--job-id", "301", env=operator)
    lake.append_ids("up.events", 2)
    ticks()  # paused: nothing runs
    lake.cli("resume", "--job-id", "301", env=operator)
    ticks(2)  # the data that landed while paused, once
    lake.cli("trigger", "--job-id", "301", "--reason", "by hand", env=operator)
    ticks(2)
    lake.append_ids("up.events", 3)
    (lake.home / "hold").touch()  # the run is still going when its own `complete` ends it
    lake.cli("run")
    lake.cli("complete", "--job-id", "301", "--message", "loaded", env=operator)
    (lake.home / "hold").unlink()
    lake.wait_local_runs()
    ticks()
    lake.append_ids("up.events", 4)
    (lake.home / "fail").touch()
    ticks(2)  # the run fails
    (lake.home / "fail").unlink()
    lake.cli("retry", "--job-id", "301", "--reason", "fixed", env=operator)
    ticks(2)
    lake.append_ids("up.events", 5)
    ticks(2)
    lifecycle = [e["event_type"] for e in lake.events() if e["trigger_job_id"] is not None]
    return windows(lake), lake.executions(), lifecycle


def _correct_clock_lifecycle() -> list[str]:
    """The job's lifecycle events in order when the operator scenario runs from a correct clock."""
    from heartbeat_runner.core.records import EventType as E

    run = [E.TRIGGER_REQUESTED, E.TRIGGERED, E.COMPLETED]
    return [*run, E.JOB_PAUSED, E.JOB_RESUMED, *run, E.TRIGGER_ASKED, *run, *run,  # data; paused; resumed; by hand; its `complete`
            *run[:2], E.FAILED, E.RETRY_ASKED, E.RETRY_REQUESTED, E.TRIGGERED, E.COMPLETED, *run]  # fails, retried


#: what :func:`operator_scenario` gives from a correct clock: the windows the runs read (None: the forced run),
#: the job's runs (one more: the retry) and its lifecycle. The scenario from a correct clock gave exactly this
#: (at 3a10483); a constant rather than a third run of it, which took 70-260 s of a CI worker.
CORRECT_CLOCK_OUTCOME = ([(1, 1), (2, 2), None, (3, 3), (4, 4), (5, 5)], {"301": 7}, _correct_clock_lifecycle())


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("skew", [120, -120])
def test_operator_commands_from_a_skewed_clock_run_what_they_run_from_a_correct_one(lake, skew):
    """`pause`, `resume`, `trigger`, a job's `complete` and `retry` from a clock two minutes ahead or behind
    (~25 commands, five of them processes under the shifted clock: up to 265 s under a loaded CI)."""
    assert operator_scenario(lake, shifted(skew)) == CORRECT_CLOCK_OUTCOME


@pytest.mark.engines("spark-classic")
@pytest.mark.timeout(1800)
def test_two_runners_a_minute_apart_on_spark_classic_read_each_version_in_one_run(hb):
    """The same two loops on Apache Spark: this process holds the lakehouse's JVM (its clock is right), both
    runners join it through Spark Connect, one of them with its clock a minute ahead."""
    import os
    import subprocess
    import sys

    hb.create_table("skew_sales.orders", "id bigint")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "skew_sales.orders", "J1"))
    hb.tick()  # the baseline
    env = {**os.environ, "HEARTBEAT_HOME": str(hb.home), "HEARTBEAT_CONFIG": str(hb.config_path),
           "HEARTBEAT_JOBS_FILE": str(hb.jobs_path), **hb.settings.lakehouse_env()}
    command = [sys.executable, "-m", "heartbeat_runner", "run", "--loop", "--interval", "0.5", "--wait-lease", "600"]
    loops = [subprocess.Popen(command, env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=hb.root) for extra in ({}, shifted(60))]
    try:
        for n in range(1, 9):
            hb.insert("skew_sales.orders", f"({n})")
            time.sleep(2)
        time.sleep(10)
    finally:
        said = [stop(loop) for loop in loops]
    hb.wait_for_jobs()
    requests = [e for e in hb.events("TRIGGER_REQUESTED") if e["trigger_job_id"] == "J1"]
    consumed = [i for e in requests for i in (e["consumed_event_ids"] or "").split(",") if i]
    assert len(consumed) == len(set(consumed)), said  # no version read by two runs
    assert len(requests) >= 2, said


def test_each_append_is_stamped_after_the_latest_event_another_writer_committed(hb):
    """A writer whose clock is ahead commits an event (here written straight to the table, as another machine's
    runner would); this process's next events are stamped after it, whether the latest time is read from the
    table's log on this machine (each append) or asked of the engine (the first)."""
    from datetime import timedelta

    from heartbeat_runner.core.records import Event, EventType, utcnow
    from heartbeat_runner.lakehouse.store import EVENTS, LATEST_EVENT_SQL

    store = hb.app.store
    for ahead in (timedelta(minutes=2), timedelta(minutes=5)):
        future = Event(EventType.JOB_PAUSED, "laptop", utcnow(), event_ts=utcnow() + ahead, trigger_job_id="J1")
        store._append(EVENTS, Event.columns(), [future.as_tuple()])  # another machine's commit
        (mine,) = store.append_events([Event(EventType.JOB_RESUMED, "runner", utcnow(), trigger_job_id="J1")])
        assert mine.event_ts > future.event_ts
        assert mine.event_ts - future.event_ts < timedelta(milliseconds=2)  # moved as little as needed
        engine_says = store.engine.sql(LATEST_EVENT_SQL.format(table=store.name(EVENTS))).collect()[0]["latest"]
        assert abs(store.latest_event_ts().replace(tzinfo=None) - engine_says) < timedelta(milliseconds=1)
