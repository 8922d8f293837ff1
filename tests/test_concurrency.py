"""Two runners on one lakehouse: every upstream change triggers exactly one run; the tick lease
expires and is taken over; lost Delta commit races are retried."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import HEADER, CliLakehouse, marker_jobs_file
from harness import config_row as row

from heartbeat_runner.core.records import Event, utcnow
from heartbeat_runner.core.settings import load_settings
from heartbeat_runner.lakehouse.dbt_invoke import DbtError, DbtProject
from heartbeat_runner.lakehouse.store import LeaseInfo, TableStore
from heartbeat_runner.runner.app import open_app
from heartbeat_runner.runner.lease import Lease, LeaseHeld, LeaseLost


def seeded_lakehouse(root: Path) -> CliLakehouse:
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.events", "201"), row("trigger_file", "drop", "202")]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "201", "202"))
    lake.home.mkdir()
    lake.append_ids("up.events", 0)
    lake.cli("seed")
    lake.cli("run")  # baseline
    return lake


@pytest.fixture
def lake(tmp_path, template) -> CliLakehouse:
    """201 reads the Delta table ``up.events``, 202 the trigger folder ``drop``; seeded, at its baseline."""
    return template.copy(tmp_path)


def run_pair(lake: CliLakehouse) -> list[str]:
    """Start two runners at the same time; both must finish cleanly. Returns their outputs."""
    runners = [lake.start("run", "--wait-lease", "300") for _ in range(2)]
    outputs = []
    for runner in runners:
        out, err = runner.communicate(timeout=300)
        assert runner.returncode == 0, err
        outputs.append(out + err)
    return outputs


@pytest.mark.slow
def test_two_runners_started_together_trigger_each_change_exactly_once(lake):
    rounds = 3
    for n in range(1, rounds + 1):
        lake.wait_local_runs()
        lake.append_ids("up.events", n)
        lake.drop_trigger_file("drop", f"batch-{n}.done")
        outputs = run_pair(lake)
        # one runner holds the lease at a time: the second waited, then found nothing left to trigger
        assert sum(out.count("triggered job 201") for out in outputs) <= 1
        assert not any("skipped: another runner" in out for out in outputs)
    lake.wait_local_runs()
    run_pair(lake)  # reconciles the last round

    assert lake.executions() == {"201": rounds, "202": rounds}
    new_data = lake.events("NEW_DATA")
    assert sorted(e["source_key"] for e in new_data) == ["delta_table:up.events"] * rounds + ["trigger_file:drop"] * rounds
    tokens = {(e["trigger_job_id"], e["idempotency_token"]) for e in lake.events("TRIGGER_REQUESTED")}
    assert len(tokens) == 2 * rounds
    assert {r[3] for r in lake.control()} == {"COMPLETED"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_file_lease_is_exclusive_until_it_expires_then_taken_over(tmp_path):
    """The lease in a file (engines with ``lease_in_files``: local Apache Spark) behaves as the lakehouse's."""
    clock = FakeClock()
    path = tmp_path / "locks" / "tick.lease"
    first, second = (Lease(path, ttl_s=60, owner=name, clock=clock) for name in ("first", "second"))
    first.acquire()
    with pytest.raises(LeaseHeld, match="first"):
        second.acquire()
    clock.now += 59
    first.renew()  # renewing pushes the expiry out
    clock.now += 59
    assert second.try_acquire() is not None
    clock.now += 61  # the first runner hung: its lease expired
    second.acquire()
    assert second.holder().owner == "second"
    with pytest.raises(LeaseLost, match="second"):
        first.renew()  # the old holder learns it lost the lease before it calls the jobs API
    first.release()  # not its lease any more: a no-op
    assert second.holder().owner == "second"
    second.release()
    assert first.holder() is None


def test_a_waiting_runner_asks_again_so_a_holder_that_missed_the_ask_still_lets_go(tmp_path):
    """A loop lets the lease go after its tick when the row says another runner waits. A holder can miss that
    (it re-took the lease between its yield and the waiter's next look; or it keeps a row it read before the ask
    reached its engine, while the table's version stays). Seen in CI: the second of two loops waited three
    minutes. So a waiter asks again every ASK_AGAIN_S seconds of its own clock, a new commit each time."""
    from heartbeat_runner.runner.lease import ASK_AGAIN_S

    clock = FakeClock()
    path = tmp_path / "locks" / "tick.lease"
    holder, waiter = (Lease(path, ttl_s=600, owner=name, clock=clock) for name in ("holder", "waiter"))
    holder.acquire()
    with pytest.raises(LeaseHeld):
        waiter.acquire(wait_s=0.05, poll_s=0.01)
    asked = holder.records.read()
    assert asked is not None and asked.wanted_by == "waiter"
    with pytest.raises(LeaseHeld):
        waiter.acquire(wait_s=0.05, poll_s=0.01)             # soon after: the ask stands, no new commit
    assert holder.records.read() == asked
    clock.now += ASK_AGAIN_S
    with pytest.raises(LeaseHeld):
        waiter.acquire(wait_s=0.05, poll_s=0.01)             # still waiting: asked again
    again = holder.records.read()
    assert again is not None and again.wanted_by == "waiter" and again.wanted_at == asked.wanted_at + ASK_AGAIN_S
    assert holder.yield_if_wanted() and waiter.try_acquire() is None  # the holder sees it and lets go


def test_a_loop_that_let_go_for_a_waiter_that_went_away_ticks_on_after_one_handoff(tmp_path):
    """A waiter that gave up (its --wait-lease ran out) is not waited for again: one handoff, then the loop keeps
    the lease tick after tick."""
    path = tmp_path / "locks" / "tick.lease"
    holder = Lease(path, ttl_s=600, owner="holder", handoff_s=0.5)
    gone = Lease(path, ttl_s=600, owner="gone")
    holder.acquire()
    with pytest.raises(LeaseHeld):
        gone.acquire(wait_s=0.05, poll_s=0.01)  # asks, then gives up
    assert holder.yield_if_wanted()  # lets go for it
    with pytest.raises(LeaseHeld, match="left free for gone, which asked for it"):
        holder.acquire()  # a tick that does not wait says why it skips
    started = time.monotonic()
    holder.acquire(wait_s=30, poll_s=0.05)  # the waiter never comes: the holder takes it back after the handoff
    assert 0.5 <= time.monotonic() - started < 10
    started = time.monotonic()
    for _ in range(5):
        with holder.ticking(wait_s=30):
            pass
    assert time.monotonic() - started < 0.5  # no more handoffs: nobody asks


def test_lease_of_a_crashed_process_on_this_machine_is_taken_over_at_once(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "tick.lease"
    path.write_text(json.dumps({"owner": "crashed", "acquired_at": 0, "expires_at": time.time() + 3600,
                                "host": socket.gethostname(), "pid": int(dead.stdout)}))
    Lease(path, ttl_s=60).acquire()  # far from expiry, but its holder is gone


@pytest.mark.slow
def test_a_held_lease_skips_the_tick_and_an_expired_one_is_taken_over(lake):
    live = LeaseInfo(owner="other-runner", acquired_at=0.0, expires_at=time.time() + 3600, host="another-machine", pid=1)
    with open_app(load_settings(lakehouse_dir=str(lake.home))) as app:
        store = app.store
        store.ensure_lease("tick")
        store.swap_lease("tick", store.lease_row("tick"), live)  # held in the lakehouse by another machine
        lake.drop_trigger_file("drop", "a.done")
        skipped = lake.cli("run", "--wait-lease", "0")
        assert "skipped: another runner holds the tick lease: other-runner" in skipped.stderr
        assert lake.events("NEW_DATA") == []

        # the other runner stopped renewing. Its row as the table holds it is what the swap compares with, as a
        # runner's own swap does: a double written through the engine may come back a last digit apart
        held = store.lease_row("tick")
        assert held.owner == "other-runner"
        store.swap_lease("tick", held, replace(held, expires_at=1.0))
        assert store.lease_row("tick").expires_at == 1.0
        taken = lake.cli("run", "--wait-lease", "0")
        assert "triggered job 202" in taken.stdout
        assert store.lease_row("tick").owner == ""  # released after the tick


class _FlakyWriter:
    """Stands in for a Spark DataFrameWriter whose first commits lose a race with another writer."""

    def __init__(self, *failures: str):
        self.failures, self.commits = list(failures), 0

    def mode(self, _: str) -> _FlakyWriter:
        return self

    def insertInto(self, _: str) -> None:
        if self.failures:
            raise RuntimeError(self.failures.pop(0))
        self.commits += 1


def _store_writing_to(writer: _FlakyWriter) -> TableStore:
    no_events_yet = SimpleNamespace(collect=lambda: [{"latest": None}])  # the latest event time read before appending
    return TableStore(SimpleNamespace(frame=lambda rows, schema: SimpleNamespace(write=writer), table=lambda name: name,
                                      sql=lambda text, args=None: no_events_yet, delta_log_dir=lambda name: None))


def test_lost_delta_commit_races_are_retried_not_surfaced():
    # The texts Sail 0.7 gives when two processes commit to one Delta table at once.
    writer = _FlakyWriter("Failed to commit transaction: 0", "Missing commit file: expected version 0, found 7")
    _store_writing_to(writer).append_events([Event("NEW_DATA", "run", utcnow())])
    assert writer.commits == 1

    broken = _FlakyWriter("[TABLE_OR_VIEW_NOT_FOUND] heartbeat_events")
    with pytest.raises(RuntimeError, match="TABLE_OR_VIEW_NOT_FOUND"):  # other errors are not retried
        _store_writing_to(broken).append_events([Event("NEW_DATA", "run", utcnow())])


def test_a_control_table_build_that_lost_a_commit_race_is_run_again(monkeypatch):
    calls = []

    def invoke(self, args, **options):
        calls.append(args)
        if len(calls) == 1:  # what dbt reports when another writer's MERGE committed first
            raise DbtError("dbt run failed\n  heartbeat_control: Runtime Error in model heartbeat_control\n"
                           "  Failed to commit transaction: 0")

    monkeypatch.setattr(DbtProject, "invoke", invoke)
    monkeypatch.setattr(DbtProject, "migrate_once", lambda self: None)  # no engine here to read tables from
    DbtProject(engine=None).build_control()
    assert len(calls) == 2
