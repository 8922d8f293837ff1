"""Windowed jobs by age: does a `late_data: rerun` job's tick cost the same after a year of history?

For each history size (in hourly windows), a fresh lakehouse (real Sail, Delta, dbt, local jobs,
built by the test harness) gets job H, hourly windows with `late_data: rerun`, on a Delta table
keyed by a timestamp. It runs two real windows, then receives that many hours of history before
them, written straight into the events log as an old runner would have left it (per hour: one
NEW_DATA with its event times, the window's request, run and success; every 24 h a late row and
its correction run), which maintenance then moves to the archive. Measured: the late-data check
of a free tick (`Sequences.correction`) and a whole free tick, best of three each.

    python benchmarks/window_history.py                 # 240, 2400 and 9600 hours (10, 100, 400 days)
    python benchmarks/window_history.py --hours 240,9600
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness and the windowed-job fixture of the tests

DAY = "2026-05-01"
POLICY = 'jobs: {"H": {window: {size: 1h, lateness: 0s, late_data: rerun}}}'


def _history(hours: int, source: dict[str, Any]) -> list[dict[str, Any]]:
    """``hours`` hourly windows before DAY, each planned, run and completed, with a late row and its
    correction every 24 hours."""
    from heartbeat_runner.policies.event_windows import Window, window_token
    from heartbeat_runner.runner.sequences import UNTIL_KEY

    day0 = datetime.fromisoformat(f"{DAY}T00:00:00+00:00")
    where = {"source_key": source["source_key"], "sensor_source": source["sensor_source"],
             "sensor_id": source["sensor_id"], "cursor_to": "{}", "event_type": "NEW_DATA"}
    rows: list[dict[str, Any]] = []
    for i in range(hours, 0, -1):
        start = day0 - timedelta(hours=i)
        s = int(start.timestamp())
        at = {"run_id": "history", "snapshot_ts": start}
        rows.append({**at, **where, "event_ts": start + timedelta(minutes=61), "event_id": f"n{i}",
                     "payload": json.dumps({"event_time_min_s": s + 60, "event_time_max_s": s + 3000,
                                            "event_time_buckets": {str(s): 5}})})
        rows += _run(at, f"p{i}", start + timedelta(minutes=62), window_token("H", Window(s, s + 3600)),
                     {UNTIL_KEY: s + 3600})
        if i % 24 == 0:
            late = start + timedelta(hours=3)
            rows.append({**at, **where, "event_ts": late, "event_id": f"l{i}",
                         "payload": json.dumps({"event_time_min_s": s + 10, "event_time_max_s": s + 10,
                                                "event_time_buckets": {str(s): 1}})})
            rows += _run(at, f"c{i}", late + timedelta(minutes=1),
                         window_token("H", Window(s, s + 3600), correction=True), {})
    return rows


def _run(at: dict[str, Any], name: str, when: datetime, token: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A request, its run and its success."""
    return [{**at, "event_ts": when + timedelta(seconds=k), "event_id": f"{name}-{kind}", "event_type": kind,
             "trigger_job_id": "H", "idempotency_token": token, "job_run_id": name,
             "payload": json.dumps(payload) if kind == "TRIGGER_REQUESTED" else None}
            for k, kind in enumerate(("TRIGGER_REQUESTED", "TRIGGERED", "COMPLETED"))]


def measure(hours: int) -> dict[str, Any]:
    import pyarrow as pa
    from deltalake import write_deltalake
    from test_event_windows import clicks, settle

    from heartbeat_runner.core.records import Event
    from heartbeat_runner.lakehouse.store import EVENTS, column_type

    arrow = {"timestamp": pa.timestamp("us", tz="UTC"), "bigint": pa.int64(), "string": pa.string()}
    schema = pa.schema([(c, arrow[column_type(c)]) for c in Event.columns()])
    with tempfile.TemporaryDirectory() as tmp, clicks(Path(tmp), POLICY, "09:30") as hb:
        hb.insert("up.clicks", f"(TIMESTAMP'{DAY} 10:05:00', 1), (TIMESTAMP'{DAY} 11:10:00', 2)")
        settle(hb)
        rows = _history(hours, hb.rows("H")[0])
        write_deltalake(str(hb.app.engine.own_location(EVENTS)), pa.Table.from_pylist(rows, schema=schema),
                        mode="append")
        heartbeat = hb.heartbeat
        heartbeat.refresh_models(force=True)
        archived = heartbeat.run_maintenance().archived_events
        check = _best(lambda: heartbeat.sequences.correction("H", "benchmark"))
        tick = _best(hb.tick)
        return {"hours": hours, "days": round(hours / 24), "events": len(rows), "archived": archived,
                "late_check_s": round(check, 3), "free_tick_s": round(tick, 3)}


def _best(call, repeats: int = 3) -> float:
    timings = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        timings.append(time.perf_counter() - began)
    return min(timings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", default="240,2400,9600", help="history sizes in hourly windows")
    args = parser.parse_args(argv)
    results = []
    for hours in (int(h) for h in args.hours.split(",")):
        print(f"  {hours} hours of history …", file=sys.stderr, flush=True)
        results.append(measure(hours))
    first = results[0]
    print(f"{'days':>6} {'events':>8} {'archived':>9} {'late check s':>13} {'free tick s':>12} {'tick ÷ first':>13}")
    for r in results:
        print(f"{r['days']:>6} {r['events']:>8} {r['archived']:>9} {r['late_check_s']:>13} {r['free_tick_s']:>12} "
              f"{r['free_tick_s'] / first['free_tick_s']:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
