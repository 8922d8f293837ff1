#!/usr/bin/env python
"""What alerting costs a tick, and how soon a missed deadline is told.

    python benchmarks/alerts.py [--sizes 1000,10000] [--repeats 5]

Per size, on the embedded engine: a lakehouse with that many trigger-file sensors (one job
each, every job with a daily deadline, every source with a freshness rule, so every rule is
evaluated for every sensor), the steady tick's wall time (nothing new) and the alert
monitor's share of it (the ``alerts`` stage: folding the tick's result into hot state and
evaluating every condition; nothing to raise). Then the delay from a deadline passing to the
webhook message arriving on a loopback receiver under ticks one second apart. Prints each
figure beside its target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: the alerts stage of a steady tick, as a share of the whole tick
SHARE_TARGET = 0.05
#: deadline passed -> message received, at most one tick interval + 1 s
INTERVAL_S = 1.0
DELAY_TARGET_S = INTERVAL_S + 1.0
HEADER = ("sensor_source,sensor_id,sensor_read_type,asset_description,upstream_key,preprocess_query,"
          "trigger_job_id,trigger_job_name,job_state,dependency_flag")


def lakehouse(root: Path, n: int, policy: str) -> tuple:
    from heartbeat_runner.core.settings import load_settings

    config = root / "config.csv"
    config.write_text("\n".join([HEADER, *(f"trigger_file,drop{i},batch,d,,,J{i},job,UNPAUSED,TRUE"
                                           for i in range(n))]) + "\n")
    (root / "jobs.yml").write_text("jobs: {}\n")
    (root / "policy.yml").write_text(policy)
    return load_settings(lakehouse_dir=str(root / "lakehouse"), config_csv=str(config),
                         jobs_file=str(root / "jobs.yml"), jobs_backend="local",
                         env={"HEARTBEAT_RUN_POLICY": str(root / "policy.yml")})


def measure_size(n: int, repeats: int) -> dict:
    from heartbeat_runner.runner.app import open_app
    from heartbeat_runner.sensing.config import load_config

    later = (datetime.now(timezone.utc) + timedelta(hours=2)).strftime("%H:%M")
    policy = (f"alerts:\n  default:\n    job: {{deadline: '{later} UTC', run_longer_than: 1h}}\n"
              "    source: {new_data_every: 1d, sensing_error_after: 15m}\n")
    with tempfile.TemporaryDirectory() as folder:
        settings = lakehouse(Path(folder), n, policy)
        with open_app(settings) as app:
            app.load_config(load_config(settings.effective_config_csv))
            heartbeat = app.heartbeat()
            heartbeat.tick()  # baseline, and the monitor reads the control table once
            completed_today(heartbeat)
            heartbeat.tick()
            ticks = [heartbeat.tick() for _ in range(repeats)]
            heartbeat.close()
    walls = [t.duration_s for t in ticks]
    alerts = [t.stage_timings["alerts"] for t in ticks]
    tick_s, alerts_s = statistics.median(walls), statistics.median(alerts)
    return {"sensors": n, "steady_tick_s": round(tick_s, 4), "alerts_s": round(alerts_s, 5),
            "share": round(alerts_s / tick_s, 4)}


def completed_today(heartbeat) -> None:
    """The steady state of a working day: every job completed since its deadline's period began."""
    now = datetime.now(timezone.utc)
    for job in heartbeat.observer.state.jobs.values():
        job.last_completed = now


def deadline_delay() -> float:
    """Seconds from a deadline passing to its webhook message arriving (ticks ``INTERVAL_S`` apart)."""
    from heartbeat_runner.runner.app import open_app
    from heartbeat_runner.sensing.config import load_config

    arrived: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            arrived.append(time.time())
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["HB_BENCH_HOOK"] = f"http://127.0.0.1:{server.server_address[1]}/"
    now = datetime.now(timezone.utc)
    due = (now + timedelta(seconds=40)).replace(microsecond=0)
    start = due - timedelta(seconds=10)  # the jobs completed before today's period began: due at `due`
    policy = ("alerts:\n  group_interval: off\n  destinations:\n    hook: {type: webhook, url_env: HB_BENCH_HOOK}\n"
              f"  default:\n    job: {{deadline: {{by: '{due:%H:%M:%S}', after: '{start:%H:%M:%S}'}}}}\n")
    with tempfile.TemporaryDirectory() as folder:
        settings = lakehouse(Path(folder), 10, policy)
        with open_app(settings) as app:
            app.load_config(load_config(settings.effective_config_csv))
            heartbeat = app.heartbeat()
            heartbeat.tick()  # the runner sees the deadline before it passes: first checked at `due`
            completed_today(heartbeat)  # before today's period began: still due at `due`
            while not arrived and time.time() < due.timestamp() + 30:
                started = time.monotonic()
                heartbeat.tick()
                time.sleep(max(0.0, INTERVAL_S - (time.monotonic() - started)))
            heartbeat.close()
    server.shutdown()
    return round(arrived[0] - due.timestamp(), 2) if arrived else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-delay", action="store_true", help="skip the deadline-to-message delay")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "alerts.json")
    args = parser.parse_args()
    sizes = [measure_size(int(n), args.repeats) for n in args.sizes.split(",")]
    delay = None if args.no_delay else deadline_delay()
    print(f"{'sensors':>8} {'steady tick s':>14} {'alerts stage s':>15} {'share':>7}  target")
    for s in sizes:
        mark = "met" if s["share"] <= SHARE_TARGET else "MISSED"
        print(f"{s['sensors']:>8,} {s['steady_tick_s']:>14.3f} {s['alerts_s']:>15.4f} {s['share']:>7.1%}  "
              f"<= {SHARE_TARGET:.0%} ({mark})")
    if delay is not None:
        mark = "met" if delay <= DELAY_TARGET_S else "MISSED"
        print(f"deadline passed -> webhook message: {delay:.2f} s  target <= {DELAY_TARGET_S:.0f} s "
              f"(tick interval {INTERVAL_S:g} s + 1 s) ({mark})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sizes": sizes, "deadline_delay_s": delay,
                                    "targets": {"share": SHARE_TARGET, "delay_s": DELAY_TARGET_S}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
