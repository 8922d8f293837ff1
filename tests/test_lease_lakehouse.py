"""The tick lease lives in the lakehouse: runners that share the tables exclude each other whatever
machine (lock folder) they run on; an expired lease is taken over; the holder renews only when half its
lifetime is gone; a one-shot tick releases; of two simultaneous claims exactly one wins."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, marker_jobs_file
from harness import config_row as row

from heartbeat_runner.core.settings import load_settings
from heartbeat_runner.lakehouse.store import FREE_LEASE, LEASE, LeaseInfo, TableStore
from heartbeat_runner.runner.app import open_app
from heartbeat_runner.runner.lease import Lease, LeaseHeld, LeaseLost


class FakeClock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two engines (two Sail processes, as two runners have) on one lakehouse's tables."""
    home = tmp_path_factory.mktemp("lease") / "lakehouse"
    settings = load_settings(lakehouse_dir=str(home))
    with open_app(settings) as first, open_app(settings) as second:
        yield first.store, second.store


@pytest.fixture
def store(stores) -> TableStore:
    """The first engine's store, with the lease free."""
    first = stores[0]
    lease = Lease(first)
    lease.records.swap(lease._read(), FREE_LEASE)
    return first


def commits(store: TableStore) -> int:
    return store.engine.table_version(store.name(LEASE)) or 0


def as_other_machine(lease: Lease) -> Lease:
    lease.host, lease.pid = "another-machine", 1
    return lease


def test_an_expired_lease_is_taken_over_and_the_old_holder_learns_it_lost_it(store):
    clock = FakeClock()
    first, second = (Lease(store, ttl_s=60, owner=name, clock=clock) for name in ("first", "second"))
    as_other_machine(first).acquire()
    with pytest.raises(LeaseHeld, match="first"):
        second.acquire()
    clock.now += 59
    assert second.try_acquire() is not None  # not expired yet
    clock.now += 2  # the first runner hung on its machine: its lease expired
    second.acquire()
    assert second.holder().owner == "second"
    with pytest.raises(LeaseLost, match="second"):
        first.renew()  # the old holder learns it lost the lease before it calls the jobs API
    first.release()  # not its lease any more: a no-op
    assert store.lease_row("tick").owner == "second"


def test_the_holder_renews_only_when_less_than_half_its_lifetime_is_left(store):
    clock = FakeClock()
    lease = Lease(store, ttl_s=60, owner="holder", clock=clock)
    lease.acquire()
    taken, before = store.lease_row("tick"), commits(store)
    clock.now += 20
    queries = store.engine.sql_count
    lease.renew()
    lease.acquire()  # the next tick of a loop that kept it
    assert commits(store) == before  # more than half left: no commit
    assert store.engine.sql_count == queries  # nor a query: the table's log shows nothing changed
    assert store.lease_row("tick") == taken
    clock.now += 15  # 25 s left of 60
    lease.renew()
    renewed = store.lease_row("tick")
    assert commits(store) == before + 1
    assert renewed.expires_at == pytest.approx(clock.now + 60) and renewed.acquired_at == taken.acquired_at


def test_a_held_block_releases_and_a_waiting_runner_gets_a_loops_lease_after_its_tick(store):
    with Lease(store, owner="one-shot").held():
        assert store.lease_row("tick").owner == "one-shot"
    assert store.lease_row("tick").owner == ""

    loop, waiter = Lease(store, owner="loop"), Lease(store, owner="reset")
    with loop.ticking():
        pass
    assert store.lease_row("tick").owner == "loop"  # kept between ticks: nobody asked
    waited = threading.Thread(target=waiter.acquire, kwargs={"wait_s": 30, "poll_s": 0.1})
    waited.start()
    deadline = time.monotonic() + 30
    while store.lease_row("tick").wanted_by != "reset" and time.monotonic() < deadline:
        time.sleep(0.1)
    with loop.ticking():
        pass  # the loop's next tick ends: it lets go for the waiter
    waited.join(30)
    assert store.lease_row("tick").owner == "reset"
    with pytest.raises(LeaseHeld, match="reset"):
        loop.acquire()


@pytest.mark.parametrize("kept_in", ["table", "file"])
def test_a_loop_whose_ticks_outlast_its_interval_still_lets_a_waiter_in(stores, store, tmp_path, kept_in):
    """Seen in CI: of two loops whose ticks took longer than their interval, the second waited three minutes.
    The holder let go after its tick and took the lease back at once for the next one, before the waiter's next
    look. Now a holder that let go leaves the free lease to the runner it let go for (HANDOFF_S at most). In the
    lakehouse's table (holder and waiter on two engines) and in a file (local Apache Spark's)."""
    where = {"table": stores, "file": [tmp_path / "locks" / "tick.lease"] * 2}[kept_in]
    holder, waiter = (as_other_machine(Lease(at, ttl_s=600, owner=name)) for at, name in zip(where, ("holder", "waiter")))
    holder.acquire()
    got = threading.Event()

    def wait() -> None:
        with waiter.held(wait_s=60):  # a one-shot command: seed, reset, a run
            got.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    ticks = 0
    while not got.is_set() and ticks < 200:  # back-to-back ticks of 50 ms: the loop never pauses between them
        with holder.ticking(wait_s=60):
            ticks += 1
            time.sleep(0.05)
    thread.join(timeout=60)
    assert got.is_set() and ticks < 40, ticks  # in a tick or two of the waiter's 0.25 s polls, not never
    with holder.ticking(wait_s=60):  # and the holder ticks again once the waiter is done
        assert holder.holder() is not None and holder.holder().owner == "holder"
    holder.release()


def test_a_lease_of_a_crashed_process_on_this_machine_is_taken_over_at_once(store):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    crashed = LeaseInfo(owner="crashed", acquired_at=0.0, expires_at=time.time() + 3600,
                        host=socket.gethostname(), pid=int(dead.stdout))
    store.swap_lease("tick", store.lease_row("tick"), crashed)
    Lease(store, ttl_s=60).acquire()  # far from expiry, but its holder is gone


def _claim_together(leases: list[Lease]) -> list[bool]:
    """Each lease's try_acquire in its own thread, started at one moment; which of them won."""
    start = threading.Barrier(len(leases))
    won = [False] * len(leases)

    def claim(i: int) -> None:
        start.wait()
        won[i] = leases[i].try_acquire() is None

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(leases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return won


def test_simultaneous_claims_from_two_engines_leave_exactly_one_holder(stores, store):
    for round_ in range(4):
        leases = [as_other_machine(Lease(s, owner=f"runner-{i}-{round_}")) for i, s in enumerate(stores)]
        won = _claim_together(leases)
        assert won.count(True) == 1, won
        winner = leases[won.index(True)]
        assert stores[1].lease_row("tick").owner == winner.owner
        winner.release()


@pytest.fixture(params=["table", "file"])
def kept_in(request, stores, store, tmp_path) -> Callable[[int], TableStore | Path]:
    """Where the contract's leases are kept, by runner: the lakehouse's table (runners 0 and 1 on two engines, as
    two runners have; the row free), or a file on this machine (local Apache Spark's: TableOps.lease_in_files)."""
    if request.param == "table":
        return lambda runner: stores[runner % 2]
    path = tmp_path / "locks" / "tick.lease"
    return lambda runner: path


def _count_swaps(lease: Lease) -> list[LeaseInfo]:
    """The rows ``lease`` writes from now on (its records' compare-and-swap, which still writes)."""
    written: list[LeaseInfo] = []
    swap = lease.records.swap

    def counted(seen: LeaseInfo, new: LeaseInfo) -> None:
        written.append(new)
        swap(seen, new)

    lease.records.swap = counted  # type: ignore[method-assign]
    return written


def test_both_kinds_of_lease_keep_one_contract(kept_in):
    """One contract, run against both implementations of the tick lease (the lakehouse table's row, and the file
    local Apache Spark keeps): a held block releases; an expired lease is taken over and its old holder learns it
    lost it; the holder writes a renewal only past half its lifetime; a crashed process's lease on this machine
    is taken at once; a write from a stale read is dropped; of claims made together exactly one wins."""
    clock = FakeClock()

    def lease(runner: int, owner: str) -> Lease:
        return as_other_machine(Lease(kept_in(runner), ttl_s=60, owner=owner, clock=clock))

    with lease(0, "one-shot").held():
        assert lease(1, "reader").holder().owner == "one-shot"
    assert lease(1, "reader").holder() is None

    first, second = lease(0, "first"), lease(1, "second")
    first.acquire()
    with pytest.raises(LeaseHeld, match="first"):
        second.acquire()
    clock.now += 59
    assert second.try_acquire() is not None  # not expired yet
    clock.now += 2  # the first runner hung: its lease expired
    second.acquire()
    with pytest.raises(LeaseLost, match="second"):
        first.renew()
    first.release()  # not its lease any more: a no-op
    assert first.holder().owner == "second"
    second.release()

    holder = lease(0, "holder")
    holder.acquire()
    taken, written = holder.holder(), _count_swaps(holder)
    clock.now += 20
    holder.renew()
    holder.acquire()  # the next tick of a loop that kept it
    assert written == [] and holder.holder() == taken  # more than half left: nothing written
    clock.now += 15  # 25 s left of 60
    holder.renew()
    renewed = holder.holder()
    assert len(written) == 1 and renewed.expires_at == pytest.approx(clock.now + 60)
    assert renewed.acquired_at == taken.acquired_at
    holder.release()

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    crashed = Lease(kept_in(0), ttl_s=3600, owner="crashed", clock=clock)
    crashed.pid = int(dead.stdout)  # a process of this machine that is gone
    crashed.acquire()
    taker = Lease(kept_in(1), ttl_s=60, owner="taker", clock=clock)
    taker.acquire()  # far from expiry, but its holder is gone
    assert taker.holder().owner == "taker"
    taker.release()

    records = lease(0, "records").records  # the compare-and-swap itself: a write from a stale read is dropped
    seen = records.read() or FREE_LEASE
    records.swap(seen, replace(FREE_LEASE, owner="a", expires_at=clock.now + 60))
    records.swap(seen, replace(FREE_LEASE, owner="b", expires_at=clock.now + 60))
    assert lease(1, "reader").holder().owner == "a"
    records.swap(records.read(), FREE_LEASE)

    for round_ in range(3):
        claims = [lease(runner, f"runner-{runner}-{round_}") for runner in (0, 1)]
        won = _claim_together(claims)
        assert won.count(True) == 1, won
        assert lease(1, "reader").holder().owner == claims[won.index(True)].owner
        claims[won.index(True)].release()


@pytest.fixture
def lake(tmp_path) -> CliLakehouse:
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "202")]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", "202"))
    lake.home.mkdir()
    lake.cli("seed")
    lake.cli("run")  # baseline
    return lake


def other_machine(lake: CliLakehouse, root: Path) -> CliLakehouse:
    """A runner with its own folder (its own locks) whose tables are the lake's: another machine."""
    home = root / "other-machine"
    home.mkdir()
    for entry in lake.home.iterdir():
        if entry.is_dir() and entry.name != "locks":
            (home / entry.name).symlink_to(entry)  # the tables, dbt's files, the trigger folders
    return CliLakehouse(home, config=Path(lake.env["HEARTBEAT_CONFIG"]), jobs_file=Path(lake.env["HEARTBEAT_JOBS_FILE"]),
                        env={"HEARTBEAT_TRIGGER_DIR": str(lake.home / "triggers")})  # the file sensor's cursor names it


def test_runners_on_two_machines_sharing_the_tables_do_not_tick_at_once(lake, tmp_path):
    other = other_machine(lake, tmp_path)
    settings = load_settings(lakehouse_dir=str(lake.home))
    lake.drop_trigger_file("drop", "a.done")
    with open_app(settings) as app:
        here = as_other_machine(Lease(app.store, owner="runner-on-machine-a"))
        here.acquire()  # a runner on the first machine is ticking
        skipped = other.cli("run", "--wait-lease", "0")
        assert "skipped: another runner holds the tick lease: runner-on-machine-a" in skipped.stderr
        assert "triggered" not in skipped.stdout
        here.release()
        taken = other.cli("run", "--wait-lease", "0")  # its turn now
        assert "triggered job 202" in taken.stdout
        assert app.store.lease_row("tick").owner == ""  # the one-shot tick released it
