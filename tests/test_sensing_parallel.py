"""``sense_all``: the sensing pool (fake sources; the pool is what is tested here)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from services import sensing_target

from heartbeat_runner.core.records import Outcome
from heartbeat_runner.sensing.parallel import sense_all
from heartbeat_runner.sensing.sources.base import SenseContext, SenseResult, SensingTarget

CTX = SenseContext(engine=None, trigger_dir=Path("/nonexistent"))  # type: ignore[arg-type]


@dataclass
class FakeSource:
    """Behaviour by sensor_id: ``hang`` blocks until released, ``fail`` raises, ``q…`` answers at once (a local
    file look), others sleep briefly."""

    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = 0
    most_running: int = 0
    finished_at: dict[str, float] = field(default_factory=dict)

    source_types = ("fake",)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        return None

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            if target.sensor_id.startswith("hang"):
                self.release.wait(30)
            elif target.sensor_id.startswith("fail"):
                raise ConnectionError("upstream refused\nsecond line")
            elif target.sensor_id.startswith("q"):
                pass
            else:
                time.sleep(0.05)
            return SenseResult(new_data=True, cursor_to='{"n":1}')
        finally:
            with self.lock:
                self.running -= 1
                self.finished_at[target.sensor_id] = time.monotonic()


def targets(*sensor_ids: str) -> list[tuple[SensingTarget, str]]:
    return [(sensing_target("fake", sid), f"job_{sid}") for sid in sensor_ids]


def test_a_hung_source_times_out_without_delaying_the_others():
    fake = FakeSource()
    began = time.monotonic()
    try:
        outcomes = sense_all(targets("hang", "a", "b", "c", "d"), CTX, max_workers=2, timeout_s=1.5,
                             source_for=lambda _: fake)
    finally:
        fake.release.set()
    elapsed = time.monotonic() - began
    by_id = {o.target.sensor_id: o for o in outcomes}
    assert [o.target.sensor_id for o in outcomes] == ["hang", "a", "b", "c", "d"]  # input order kept
    assert by_id["hang"].outcome is Outcome.ERROR and by_id["hang"].error == "timed out after 1.5s"
    assert by_id["hang"].result is None and by_id["hang"].trigger_job_ids == "job_hang"
    assert all(by_id[s].outcome is Outcome.NEW_DATA for s in "abcd")
    # the others shared the one remaining slot and were done long before the hung one's timeout
    assert all(fake.finished_at[s] - began < 1.0 for s in "abcd")
    assert 1.4 < elapsed < 3.0


def test_a_failing_source_is_an_error_for_that_source_only():
    fake = FakeSource()
    done = []
    outcomes = sense_all(targets("a", "fail", "b"), CTX, max_workers=3, timeout_s=10,
                         source_for=lambda _: fake, on_done=done.append)
    by_id = {o.target.sensor_id: o for o in outcomes}
    assert by_id["fail"].outcome is Outcome.ERROR
    assert by_id["fail"].error == "ConnectionError: upstream refused"
    assert by_id["a"].outcome is Outcome.NEW_DATA and by_id["b"].outcome is Outcome.NEW_DATA
    assert by_id["a"].result.cursor_to == '{"n":1}'
    assert sorted(o.target.sensor_id for o in done) == ["a", "b", "fail"]  # each reported once


def test_at_most_max_workers_sense_at_once():
    fake = FakeSource()
    outcomes = sense_all(targets(*(f"s{i}" for i in range(9))), CTX, max_workers=3, timeout_s=10,
                         source_for=lambda _: fake)
    assert all(o.outcome is Outcome.NEW_DATA for o in outcomes)
    assert 2 <= fake.most_running <= 3  # parallel, never past the limit


def test_an_unknown_source_type_is_an_error_not_a_crash():
    def source_for(name: str):
        raise KeyError(f"unknown sensor_source {name!r}")

    [outcome] = sense_all(targets("a"), CTX, max_workers=1, timeout_s=5, source_for=source_for)
    assert outcome.outcome is Outcome.ERROR and "unknown sensor_source" in outcome.error


def test_thousands_of_quick_sources_go_in_chunks_and_a_hung_one_in_a_chunk_holds_up_only_itself():
    """Ten thousand local sources are handed to the workers in chunks (a lock round per source cost more than
    sensing it). A source that hangs inside a chunk still times out alone: the rest of its chunk goes back to
    the queue and is sensed by the worker that takes the hung one's place, and what its worker sensed before it
    is recorded without waiting for the hung call; every source is sensed once."""
    fake = FakeSource()
    ids = [f"q{i}" for i in range(10_000)]
    ids[5] = "hang-in-a-chunk"
    sensed: list[str] = []
    reported_at: dict[str, float] = {}

    def done(outcome) -> None:
        sensed.append(outcome.target.sensor_id)
        reported_at[outcome.target.sensor_id] = time.monotonic()

    began = time.monotonic()
    try:
        outcomes = sense_all(targets(*ids), CTX, max_workers=2, timeout_s=5, source_for=lambda _: fake, on_done=done)
    finally:
        fake.release.set()
    elapsed = time.monotonic() - began
    by_id = {o.target.sensor_id: o for o in outcomes}
    assert elapsed < 20, elapsed                         # the hung call (30 s) held nothing up past its timeout
    assert [o.target.sensor_id for o in outcomes] == ids                     # input order kept
    assert by_id["hang-in-a-chunk"].error == "timed out after 5s"
    assert all(by_id[i].outcome is Outcome.NEW_DATA for i in ids if i != "hang-in-a-chunk")
    assert sorted(sensed) == sorted(ids)                                     # each reported once
    # none waited for the hung one: every quick source, those after it in its chunk too, was sensed before its
    # timeout ended it (an order, not a time: a loaded machine senses 10,000 sources in well under 5 s)
    assert max(fake.finished_at[i] for i in ids if i.startswith("q")) < reported_at["hang-in-a-chunk"]
    assert fake.most_running <= 2


class SlowLook(FakeSource):
    """A source whose bulk look takes 0.8 s and rules out every target named ``same…``."""

    def unchanged(self, group: list[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        self.finished_at["look started"] = time.monotonic()
        time.sleep(0.8)
        self.finished_at["look ended"] = time.monotonic()
        return {t.source_key: "no change" for t in group if t.sensor_id.startswith("same")}


class HungLook(SlowLook):
    """...and one whose bulk look hangs until released."""

    look_released = threading.Event()

    def unchanged(self, group: list[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        self.finished_at["look started"] = time.monotonic()
        self.look_released.wait(30)
        return super().unchanged(group, ctx)


def test_the_bulk_looks_of_source_classes_run_at_once_and_one_that_hangs_rules_nothing_out():
    first, other = SlowLook(), HungLook()
    both = targets("same1", "new1") + [(sensing_target("other", sid), f"job_{sid}") for sid in ("same2", "new2")]
    try:
        outcomes = sense_all(both, CTX, max_workers=2, timeout_s=1.5,
                             source_for=lambda kind: first if kind == "fake" else other)
    finally:
        other.look_released.set()
    by_id = {o.target.sensor_id: o for o in outcomes}
    assert by_id["same1"].outcome is Outcome.NO_NEW_DATA and by_id["same1"].result.detail == "no change"
    assert "same1" not in first.finished_at  # ruled out: never sensed
    # the hung look ruled nothing out: its targets were sensed one by one
    assert by_id["same2"].outcome is Outcome.NEW_DATA and by_id["new2"].outcome is Outcome.NEW_DATA
    assert by_id["new1"].outcome is Outcome.NEW_DATA
    # both looks ran at once: the hung one did not wait for the other, nor the other for the hung one's timeout
    assert other.finished_at["look started"] < first.finished_at["look ended"]


def test_targets_a_wake_up_named_are_sensed_without_a_bulk_look_first():
    fake = SlowLook()
    outcomes = sense_all(targets("same1", "new1"), CTX, max_workers=2, timeout_s=5, source_for=lambda _: fake,
                         look_first=False)
    assert [o.outcome for o in outcomes] == [Outcome.NEW_DATA, Outcome.NEW_DATA]
    assert "look started" not in fake.finished_at and "same1" in fake.finished_at
