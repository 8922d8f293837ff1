"""Triggers per finalized event-time window: one run per window, when the window is complete in
every hard input (minimum watermark), in order, empty windows skipped and recorded, late rows
counted (and, by policy, one correction run).

Real Sail + Delta + dbt, the real Kafka-protocol broker with messages carrying their own
timestamps, real local job processes, and real runner processes killed for the crash tests.
"""

from __future__ import annotations

import contextlib
import json
import random
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, Harness
from harness import config_row as row
from services import kafka_broker, postgres  # noqa: F401 (fixtures)
from test_catch_up import CrashOutcome, recorded, recorder_jobs

from heartbeat_runner.core.faults import CRASH_EXIT_CODE
from heartbeat_runner.core.records import EventType
from heartbeat_runner.core.settings import MaintenancePolicy
from heartbeat_runner.core.windows import EventTimes
from heartbeat_runner.interfaces.operations import explain, late_data, record_job_event
from heartbeat_runner.lakehouse.maintenance import Maintenance
from heartbeat_runner.lakehouse.store import EVENTS, EVENTS_ARCHIVE
from heartbeat_runner.policies.event_windows import (
    Arrival,
    LateRows,
    Window,
    WindowLedger,
    final_windows,
    late_rows,
    ledger_from_history,
)

DAY = "2026-05-01"


def ts(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"{DAY}T{hhmm}:00+00:00")


def ms(hhmm: str) -> int:
    return int(ts(hhmm).timestamp() * 1000)


def starts(out: Path, job: str) -> list[tuple[str, str]]:
    """(window_start, correction flag) of every run of ``job``, in the order they started."""
    return [(p["window_start"][11:16], p["heartbeat_window_correction"]) for p in recorded(out, job)]


def settle(hb: Harness, ticks: int = 12) -> None:
    for _ in range(ticks):
        hb.wait_for_jobs()
        hb.tick()
        store = hb.app.store
        if not store.windows_due() and not store.next_windows_due() and "IN_PROGRESS" not in set(hb.status().values()):
            return
    raise AssertionError(f"not settled: {hb.status()}")


def windowed(tmp_path: Path, policy: str, **env: str) -> Harness:
    path = tmp_path / "policies.yml"
    path.write_text(policy)
    return Harness(tmp_path, HEARTBEAT_RUN_POLICY=str(path), **env)


@contextlib.contextmanager
def clicks(tmp_path: Path, policy: str, first: str, **env: str) -> Iterator[Harness]:
    """Job H reads up.clicks (event time: its ``ts`` key) under ``policy``; a baseline at ``first``."""
    with windowed(tmp_path, policy, **env) as hb:
        hb.create_table("up.clicks", "ts TIMESTAMP, n INT")
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} {first}:00', 0)")
        hb.seed(row("delta_table", "up.clicks", "H", key="ts"))
        recorder_jobs(hb.jobs_path, tmp_path / "out", "H")
        hb.tick()  # baseline: the watermark starts at ``first``
        yield hb


# -- the rules, without an engine ------------------------------------------------------------------

def test_final_windows_and_late_rows():
    hour = 3600
    start = int(ts("10:00").timestamp())
    assert final_windows(start, start + 2 * hour + 59, hour) == [Window(start, start + hour),
                                                                 Window(start + hour, start + 2 * hour)]
    assert final_windows(start, start + hour - 1, hour) == []
    planned_at = ts("12:00")
    arrivals = [(ts("11:59"), "a", EventTimes.of([start + 60], 60)),          # before the plan: on time
                (ts("12:01"), "a", EventTimes.of([start + 120, start + 7300], 60)),  # 10:02 late, 12:01 not
                (ts("12:02"), "b", EventTimes.of([start + hour + 5], 60))]   # 11:00 window: late
    assert late_rows(arrivals, [(planned_at, start + 2 * hour)], hour) == [
        LateRows("a", start, 1), LateRows("b", start + hour, 1)]


@pytest.mark.parametrize("seed", range(40))
def test_the_ledger_carried_from_plan_to_plan_equals_the_whole_history(seed):
    """Each plan reads only the arrivals after the previous one's ledger. On random histories (late rows,
    rows for future windows, two sources, corrections) what it sees equals the whole history's: the rows
    of each window it plans, and the windows with late rows not yet corrected."""
    rng = random.Random(seed)
    hour, origin = 3600, int(ts("00:00").timestamp())
    arrivals: list[Arrival] = []
    plans: list[tuple[datetime, int]] = []
    corrected: set[int] = set()
    carried, until, clock = WindowLedger(("a", "b")), origin, ts("00:00")
    for _ in range(rng.randrange(20, 60)):
        clock += timedelta(minutes=rng.randrange(1, 90))
        if rng.random() < 0.6:  # an arrival: mostly recent rows, some late, some far ahead
            now_s = int(clock.timestamp())
            seconds = [max(origin, now_s + rng.choice([-1, -1, -3, -8, 2]) * rng.randrange(0, hour))
                       for _ in range(rng.randrange(1, 4))]
            arrivals.append(Arrival(clock, rng.choice("ab"), EventTimes.of(seconds, 600)))
            continue
        ledger = carried.advance([a for a in arrivals if carried.through is None or a.event_ts > carried.through],
                                 hour, track_late=True)
        whole = ledger_from_history(("a", "b"), arrivals, plans, corrected, hour, track_late=True)
        assert ledger == whole
        late = {r.window_start_s for r in late_rows([(a.event_ts, a.source_key, a.times) for a in arrivals], plans,
                                                    hour)}
        assert set(ledger.pending) == late - corrected
        watermark = int(clock.timestamp()) - hour
        windows = final_windows(until, watermark, hour)
        if windows:  # a plan
            for window in windows:
                assert ledger.rows_in(window) == sum(n for a in arrivals for b, n in a.times.buckets.items()
                                                     if window.start_s <= b < window.end_s)
            until = windows[-1].end_s
            plans.append((clock, until))
            carried = ledger.planned(until)
        elif ledger.pending:  # a correction run of the oldest late window
            corrected.add(ledger.pending[0])
            carried = ledger.corrected(ledger.pending[0])
        assert WindowLedger.from_payload(json.loads(json.dumps(carried.payload()))) == carried


# -- Delta with a timestamp upstream_key -----------------------------------------------------------

@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_delta_hourly_windows_fire_when_final_skip_empty_ones_and_rerun_late_ones_once(tmp_path):
    out = tmp_path / "out"
    with clicks(tmp_path, 'jobs: {"H": {window: {size: 1h, lateness: 0s, late_data: rerun}}}', "09:30") as hb:
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:05:00', 1), (TIMESTAMP'{DAY} 10:50:00', 2)")
        hb.tick()
        assert recorded(out, "H") == []
        verdict = explain(hb.app.store, "H").verdict
        assert "waits for the watermark" in verdict and "10:50" in verdict, verdict

        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 11:10:00', 3)")  # 10:00-11:00 is now complete
        settle(hb)
        assert starts(out, "H") == [("10:00", "false")]
        assert recorded(out, "H")[0]["window_end"] == f"{DAY}T11:00:00Z"
        structured = json.loads(recorded(out, "H")[0]["heartbeat_params"])
        assert structured["window"] == {"start": f"{DAY}T10:00:00Z", "end": f"{DAY}T11:00:00Z", "correction": False}
        assert [(s["kind"], s["from"], s["until"]) for s in structured["sources"]] == [
            ("event_time", f"{DAY}T10:00:00Z", f"{DAY}T11:00:00Z")]

        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 12:30:00', 4), (TIMESTAMP'{DAY} 14:10:00', 5)")
        settle(hb)  # 11:00 and 12:00 run, in order; 13:00 had no data: skipped; 14:00 is not final
        assert starts(out, "H") == [("10:00", "false"), ("11:00", "false"), ("12:00", "false")]
        skipped = hb.events("WINDOW_SKIPPED")
        assert [json.loads(e["payload"])["window_start"] for e in skipped] == [f"{DAY}T13:00:00Z"]

        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:30:00', 6)")  # late for the 10:00 window
        settle(hb)
        assert starts(out, "H")[-1] == ("10:00", "true")  # one correction run, flagged
        assert json.loads(recorded(out, "H")[-1]["heartbeat_params"])["window"]["correction"] is True
        assert late_data(hb.app.store, hb.settings.run_policy_file, "H") == [
            {"source_key": hb.rows("H")[0]["source_key"], "window_start": f"{DAY}T10:00:00Z", "rows": 1}]
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:40:00', 7)")  # late again: counted, no second correction
        settle(hb)
        assert [s for s in starts(out, "H") if s[1] == "true"] == [("10:00", "true")]
        assert late_data(hb.app.store, hb.settings.run_policy_file, "H")[0]["rows"] == 2


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_once_its_history_is_archived_a_windowed_job_reads_only_the_hot_log_and_still_corrects(tmp_path, monkeypatch):
    """Plans and late-data checks read the arrivals since the job's latest plan (the ledger it carries)
    from the hot log: with the job's history archived, its ticks read no archived event, a late row
    still earns its one correction run and the next window its run; jobs never see the ledger."""
    out = tmp_path / "out"
    with clicks(tmp_path, 'jobs: {"H": {window: {size: 1h, lateness: 0s, late_data: rerun}}}', "09:30",
                HEARTBEAT_ARCHIVE_MARGIN_MINUTES="0") as hb:
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:05:00', 1), (TIMESTAMP'{DAY} 11:10:00', 2)")
        settle(hb)
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 12:30:00', 3), (TIMESTAMP'{DAY} 14:10:00', 4)")
        settle(hb)
        assert starts(out, "H") == [("10:00", "false"), ("11:00", "false"), ("12:00", "false")]
        assert Maintenance(hb.app.store, MaintenancePolicy()).archive_events() > 0

        store, tables = hb.app.store, []
        read = store.read
        monkeypatch.setattr(store, "read", lambda table, *a, **k: tables.append(table) or read(table, *a, **k))
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:30:00', 5)")  # late for 10:00
        settle(hb)
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 15:20:00', 6)")  # 14:00 becomes final
        settle(hb)
        assert starts(out, "H")[3:] == [("10:00", "true"), ("14:00", "false")]
        assert EVENTS in tables and EVENTS_ARCHIVE not in tables
        assert not [key for run in recorded(out, "H") for key in run if key.startswith("_")]


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_a_backlog_of_windows_after_a_pause_runs_each_window_once_in_order(tmp_path):
    out = tmp_path / "out"
    with clicks(tmp_path, 'jobs: {"H": {max_retries: 1, backoff_s: 0, window: {size: 1h}}}', "07:59") as hb:
        record_job_event(hb.app, "H", EventType.JOB_PAUSED)
        hb.insert("up.clicks", ", ".join(f"(TIMESTAMP'{DAY} {h:02d}:15:00', {h})" for h in range(8, 14)))
        hb.tick()
        assert recorded(out, "H") == []
        record_job_event(hb.app, "H", EventType.JOB_RESUMED)
        out.mkdir()
        (out / "fail_run").write_text("10:00")  # the 10:00 window fails once: its retry runs before 11:00
        settle(hb)
        # 08:00 … 12:00 are final (the watermark is 13:15); 13:00 is not
        assert starts(out, "H") == [(f"{h:02d}:00", "false") for h in (8, 9, 10, 10, 11, 12)]
        assert len(hb.events("FAILED")) == 1 and len(hb.events("RETRY_REQUESTED")) == 1
        tokens = [e["idempotency_token"] for e in hb.events()
                  if e["event_type"] in ("TRIGGER_REQUESTED", "NEXT_WINDOW_REQUESTED")]
        assert len(tokens) == len(set(tokens)) == 5


# -- Kafka: message timestamps, two sources with different lags --------------------------------------

def test_kafka_window_fires_only_when_the_slower_source_passes_it(tmp_path, kafka_broker):
    out = tmp_path / "out"
    fast, slow = f"fast-{tmp_path.name}"[:40], f"slow-{tmp_path.name}"[:40]
    for topic in (fast, slow):
        kafka_broker.create_topic(topic)
    sources = tmp_path / "sources.yml"
    sources.write_text(f"kafka:\n  shop: {{bootstrap.servers: '{kafka_broker.bootstrap}'}}\n")
    with windowed(tmp_path, 'jobs: {"K": {window: {size: 1h, lateness: 5m}}}',
                  HEARTBEAT_SOURCES_FILE=str(sources)) as hb:
        hb.seed(row("kafka", f"shop: {fast}", "K"), row("kafka", f"shop: {slow}", "K"))
        recorder_jobs(hb.jobs_path, out, "K")
        hb.tick()  # baselines at the (empty) ends of both topics
        # out of order: 10:50 arrives after 11:20 on the fast topic
        kafka_broker.produce(fast, "a", "b", "c", "d", timestamps_ms=[ms("10:05"), ms("10:40"), ms("11:20"),
                                                                      ms("10:50")])
        kafka_broker.produce(slow, "x", "y", timestamps_ms=[ms("10:10"), ms("10:30")])
        settle(hb)
        assert recorded(out, "K") == []  # watermark = min(11:20, 10:30) - 5m: 10:00-11:00 is not final
        verdict = explain(hb.app.store, "K").verdict
        assert "waits for the watermark" in verdict and slow in verdict, verdict

        kafka_broker.produce(slow, "z", timestamps_ms=[ms("11:06")])  # the slow source passes 11:05
        settle(hb)
        assert starts(out, "K") == [("10:00", "false")]

        kafka_broker.produce(slow, "late", timestamps_ms=[ms("10:20")])
        settle(hb)
        assert len(recorded(out, "K")) == 1  # late_data: report -> counted, no run
        late = late_data(hb.app.store, hb.settings.run_policy_file, "K")
        assert [(item["source_key"].split("#")[0], item["window_start"], item["rows"]) for item in late] == [
            (f"kafka:shop: {slow}", f"{DAY}T10:00:00Z", 1)]


# -- JDBC keys beside a Delta table: the window waits for the slower source ---------------------------

def test_jdbc_keys_hold_a_window_until_the_delta_source_passes_it_too(tmp_path, postgres, monkeypatch):
    """Job M reads a PostgreSQL table (event time: its loaded_at key) and a Delta table, both hard."""
    out, visits = tmp_path / "out", f"visits_{uuid.uuid4().hex[:8]}"
    postgres.execute(f"CREATE TABLE public.{visits} (id serial, loaded_at timestamp)",
                     f"GRANT SELECT ON public.{visits} TO reader")

    def visit(*hhmm: str) -> None:
        for at in hhmm:
            postgres.execute(f"INSERT INTO public.{visits} (loaded_at) VALUES (:t)", params={"t": f"{DAY} {at}:00"})

    visit("09:30")
    monkeypatch.setenv("HEARTBEAT_JDBC_CRM_URL", postgres.url())
    with windowed(tmp_path, 'jobs: {"M": {window: {size: 1h}}}') as hb:
        hb.create_table("up.clicks", "ts TIMESTAMP, n INT")
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 09:30:00', 0)")
        hb.seed(row("jdbc", f"crm:public.{visits}", "M", key="loaded_at"), row("delta_table", "up.clicks", "M", key="ts"))
        recorder_jobs(hb.jobs_path, out, "M")
        hb.tick()  # baselines: both watermarks start at 09:30
        visit("10:10", "11:20")  # the JDBC table passes 11:00
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:40:00', 1)")
        settle(hb)
        assert recorded(out, "M") == []
        verdict = explain(hb.app.store, "M").verdict
        assert "waits for the watermark" in verdict and "up.clicks" in verdict, verdict

        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 11:05:00', 2)")  # now both have passed 11:00
        settle(hb)
        assert starts(out, "M") == [("10:00", "false")]
        assert recorded(out, "M")[0]["window_end"] == f"{DAY}T11:00:00Z"


# -- crashes: between finalization and trigger, between trigger and the triggered event ---------------

def window_crash_scenario(root: Path, point: str) -> CrashOutcome:
    """Hours 10:00 and 11:00 final at once; the runner is killed at ``point`` while starting them."""
    import pyarrow as pa
    from deltalake import write_deltalake

    out = root / "out"
    root.mkdir(parents=True)
    config, jobs = root / "config.csv", root / "jobs.yml"
    config.write_text("\n".join([HEADER, row("delta_table", "up.clicks", "101", key="ts")]) + "\n")
    recorder_jobs(jobs, out, "101")
    (root / "policies.yml").write_text('jobs: {"101": {window: {size: 1h}}}')
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=jobs,
                        env={"HEARTBEAT_RUN_POLICY": str(root / "policies.yml")})
    lake.home.mkdir(parents=True)
    table = str(lake.home / "warehouse" / "up" / "clicks")

    def append(*hhmm: str) -> None:
        write_deltalake(table, pa.table({"ts": pa.array([ts(t) for t in hhmm], pa.timestamp("us", tz="UTC"))}),
                        mode="append")

    append("09:00")
    lake.cli("seed")
    lake.cli("run")  # baseline
    append("10:10", "11:20", "12:05")  # 10:00 and 11:00 are final
    crashed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": point})
    for _ in range(5):
        lake.cli("run")
        lake.wait_local_runs()
    tokens = [e["idempotency_token"] for e in lake.events() if e["event_type"] in
              ("TRIGGER_REQUESTED", "NEXT_WINDOW_REQUESTED")]
    return CrashOutcome(crashed.returncode, [[(p["window_start"][11:16], "")] for p in recorded(out, "101")], tokens)


@pytest.mark.slow
def test_a_crash_around_a_window_trigger_neither_skips_nor_repeats_it(tmp_path):
    """Killed between finalization (the request recorded) and the trigger, or between the trigger and the
    TRIGGERED event: each final window still runs exactly once. (One scenario after the other, in this process
    but for the killed command: from threads each command would be a cold process.)"""
    points = ("after_trigger_requested", "after_trigger_call")
    outcomes = {point: window_crash_scenario(tmp_path / point, point) for point in points}
    for point, outcome in outcomes.items():
        assert outcome.crash_exit == CRASH_EXIT_CODE, point
        assert outcome.windows == [[("10:00", "")], [("11:00", "")]], point
        assert len(outcome.tokens) == len(set(outcome.tokens)) == 2, point


def test_a_bad_window_policy_is_a_clear_error_naming_the_file(tmp_path):
    from heartbeat_runner.core.errors import ConfigError
    from heartbeat_runner.policies.event_windows import LateData, WindowPolicy, source_grains
    from heartbeat_runner.policies.run_policies import load_run_policies

    path = tmp_path / "policies.yml"
    path.write_text('jobs: {"H": {window: {size: 1h, lateness: 10m, late_data: rerun}}}')
    assert load_run_policies(path).windows == {"H": WindowPolicy(3600, 600, LateData.RERUN)}
    for text, words in [('jobs: {"H": {window: {size: 10}}}', "expected a span"),
                        ('jobs: {"H": {window: {size: 1h, late_data: drop}}}', "expected report or rerun"),
                        ('jobs: {"H": {window: {lateness: 1m}}}', "window needs size"),
                        ('jobs: {"H": {window: {size: 1h}, catch_up: {max_window: 3}}}', "one or the other")]:
        path.write_text(text)
        with pytest.raises(ConfigError, match="policies.yml") as raised:
            load_run_policies(path)
        assert words in str(raised.value)
    hourly, quarter, tens = WindowPolicy(3600), WindowPolicy(900), WindowPolicy(600)
    assert source_grains({"a": hourly, "b": quarter}, [("a", "s"), ("b", "s"), ("c", "s")]) == {"s": 900}
    with pytest.raises(ConfigError, match="multiple of the smallest"):
        source_grains({"b": quarter, "c": tens}, [("b", "s"), ("c", "s")])


def test_validate_warns_when_a_windowed_job_reads_a_source_without_event_times(tmp_path, monkeypatch, capsys):
    from heartbeat_runner.interfaces.cli import main

    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.clicks", "H"), row("trigger_file", "drops", "H"),
                                 row("trigger_file", "soft", "H", hard="FALSE")]) + "\n")
    policy = tmp_path / "policies.yml"
    policy.write_text('jobs: {"H": {window: {size: 1h}}}')
    monkeypatch.setenv("HEARTBEAT_RUN_POLICY", str(policy))
    assert main(["validate", "--config", str(config), "--lakehouse-dir", str(tmp_path / "lake")]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "report no event times" in line]
    assert warnings == ["  warning: line 3: job H has a window policy, but trigger_file sources report no event "
                        "times: its windows never become final"]  # the soft row and the Delta table are fine
