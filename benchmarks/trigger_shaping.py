#!/usr/bin/env python
"""Trigger shaping's two figures (docs/trigger_shaping.md): a hold's end → its run's start, and the holds of
10,000 jobs evaluated in one tick.

    python benchmarks/trigger_shaping.py [--samples 6] [--interval 30] [--jobs 10000] [--repeats 20]
                                         [--skip-loop] [--out benchmarks/results/trigger_shaping.json]

**Hold end → run start** (target p50 ≤ 1 s). One embedded lakehouse, one ``run --loop --interval 30``
process and two local jobs, each fed by its own Delta table:

- ``min_interval``: job ``spaced`` has ``min_interval: 6s``. Each sample commits to its table right after the
  job's previous run started, so the new data is held; the hold ends at the previous run's request time plus
  6 s (read back from ``heartbeat_events`` at the end);
- ``quiet_for``: job ``quiet`` has ``quiet_for: 3s``. Each sample commits once; the hold ends 3 s after the
  tick that recorded the data (its NEW_DATA event's snapshot time, what the hold counts from).

The figure is from the hold's end to the job's process writing its first line, so it holds what the loop adds
(its timer wake-up at the hold's end, the tick, the trigger) and nothing of the interval: without the timer
the wait would be up to the 30 s interval.

**Holds of 10,000 jobs** (target ≤ 50 ms): ``hold_decisions`` (policies/trigger_shaping.py), the rule a tick
applies to the jobs that are ready, over ``--jobs`` candidates whose policies mix every rule (a minimum
interval, a quiet period with a cap, a cron gate in a zone, pools with priorities), with facts spread so that
every kind of hold and release occurs. The facts' one query (``heartbeat_job_trigger_facts``) is not in this
figure: its cost is the view's, measured with the tick's other reads by benchmarks/run.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from latency import percentile, print_p50_table, wait_for  # noqa: E402 (this folder: python benchmarks/trigger_shaping.py)

DEFAULT_OUT = REPO / "benchmarks" / "results" / "trigger_shaping.json"
#: issue 57's targets
RELEASE_TARGET_P50_S = 1.0
HOLDS_TARGET_MS = 50.0
MIN_INTERVAL_S, QUIET_FOR_S = 6, 3
STAMP_JOB = "import sys, time; open(sys.argv[1], 'a').write(repr(time.time()) + '\\n')"
JOBS = {"spaced": f"min_interval: {MIN_INTERVAL_S}s", "quiet": f"quiet_for: {QUIET_FOR_S}s"}


# -- hold end -> run start ----------------------------------------------------------------------

class Lakehouse:
    """An embedded lakehouse with one Delta table per job and a run-policy file shaping both jobs."""

    def __init__(self, root: Path):
        self.root, self.home = root, root / "lakehouse"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")},
                    "HEARTBEAT_HOME": str(self.home), "HEARTBEAT_CONFIG": str(root / "config.csv"),
                    "HEARTBEAT_JOBS_FILE": str(root / "jobs.yml"), "HEARTBEAT_RUN_POLICY": str(root / "policies.yml"),
                    "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        from heartbeat_runner.sensing.config import COLUMNS

        rows = [",".join(COLUMNS)] + [f"delta_table,sales.{job},batch,,,,{job},{job},UNPAUSED,TRUE" for job in JOBS]
        (root / "config.csv").write_text("\n".join(rows) + "\n")
        (root / "jobs.yml").write_text("jobs:\n" + "".join(
            f"  {job}: [{sys.executable!r}, '-c', {STAMP_JOB!r}, {str(self.stamp(job))!r}]\n" for job in JOBS))
        (root / "policies.yml").write_text("jobs:\n" + "".join(
            f"  {job}: {{trigger: {{{rule}}}}}\n" for job, rule in JOBS.items()))
        (root / "stamps").mkdir()
        for job in JOBS:
            self.commit(job, 0)

    def stamp(self, job: str) -> Path:
        return self.root / "stamps" / job

    def starts(self, job: str) -> list[float]:
        path = self.stamp(job)
        return [float(x) for x in path.read_text().split()] if path.exists() else []

    def commit(self, job: str, n: int) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        write_deltalake(str(self.home / "warehouse" / "sales" / job), pa.table({"id": [n]}), mode="append")

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "heartbeat_runner", *args]

    def events(self, kind: str, job_or_source: str, column: str) -> list[float]:
        """Epoch seconds in ``column`` of the ``kind`` events of a job or a source, oldest first: what the holds
        count from (models/heartbeat_job_trigger_facts.sql): a request's ``event_ts``, new data's
        ``snapshot_ts`` (the control row's ``latest_event_fetched_timestamp``)."""
        from deltalake import DeltaTable

        rows = DeltaTable(str(self.home / "warehouse" / "heartbeat" / "heartbeat_events")).to_pyarrow_table(
            columns=["event_id", "event_type", column, "trigger_job_id", "source_key"]).to_pylist()
        unique = {r["event_id"]: r for r in rows if r["event_type"] == kind
                  and job_or_source in (r["trigger_job_id"], r["source_key"])}
        return sorted(r[column].replace(tzinfo=timezone.utc).timestamp() for r in unique.values())


def measure_releases(samples: int, interval_s: float) -> dict[str, list[float]]:
    """Seconds from each hold's end to the held run's start, by rule (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="hb-shaping-") as tmp:
        lake = Lakehouse(Path(tmp))
        subprocess.run(lake.cli("seed"), env=lake.env, check=True, capture_output=True)
        subprocess.run(lake.cli("run"), env=lake.env, check=True, capture_output=True)  # the baseline
        log = lake.root / "loop.err"
        with open(log, "w") as err:
            loop = subprocess.Popen(lake.cli("run", "--loop", "--interval", str(interval_s)), env=lake.env,
                                    stdout=subprocess.DEVNULL, stderr=err, text=True)

        def started(job: str, count: int) -> bool:
            if loop.poll() is not None:
                raise RuntimeError("the loop ended:\n" + log.read_text()[-3000:])
            return len(lake.starts(job)) >= count

        try:
            wait_for(lambda: "tick 1 · " in log.read_text() or loop.poll() is not None, 300, "the loop's first poll")
            # min_interval: a first run, then each commit lands right after a start and is held
            lake.commit("spaced", 1)
            wait_for(lambda: started("spaced", 1), interval_s * 3 + 60, "spaced's first run")
            for n in range(samples):
                lake.commit("spaced", 2 + n)
                wait_for(lambda n=n: started("spaced", n + 2), interval_s * 3 + 60, f"spaced's run {n + 2}")
                print(f"  min_interval sample {n + 1}/{samples}", flush=True)
            # quiet_for: each commit waits for its quiet period
            for n in range(samples):
                time.sleep(1.0)
                lake.commit("quiet", 1 + n)
                wait_for(lambda n=n: started("quiet", n + 1), interval_s * 3 + 60, f"quiet's run {n + 1}")
                print(f"  quiet_for sample {n + 1}/{samples}", flush=True)
        finally:
            loop.terminate()
            loop.wait(timeout=60)
        requests = lake.events("TRIGGER_REQUESTED", "spaced", "event_ts")
        spaced = [round(start - (request + MIN_INTERVAL_S), 3)
                  for request, start in zip(requests, lake.starts("spaced")[1:], strict=False)]
        arrivals = lake.events("NEW_DATA", "delta_table:sales.quiet", "snapshot_ts")
        quiet = [round(start - (arrival + QUIET_FOR_S), 3)
                 for arrival, start in zip(arrivals, lake.starts("quiet"), strict=False)]
        return {"min_interval": spaced[:samples], "quiet_for": quiet[:samples]}


# -- the holds of many jobs ---------------------------------------------------------------------

def shaping_and_candidates(jobs: int, now: datetime) -> tuple[Any, list[Any], list[str]]:
    """``jobs`` candidates whose policies mix every rule, their facts spread so that every hold occurs, and the
    running jobs (a tenth of each pool's places taken)."""
    from heartbeat_runner.policies.trigger_shaping import Candidate, trigger_shaping

    rules = [{"min_interval": "15m"}, {"quiet_for": "2m", "max_wait": "30m"}, {"at": "0 6 * * * Europe/Berlin"},
             {"pool": "warehouse", "priority": 10}, {"pool": "cluster", "min_interval": "5m"}, {}]
    policies = {f"job_{i}": {"trigger": rules[i % len(rules)]} for i in range(jobs) if rules[i % len(rules)]}
    shaping = trigger_shaping({"pools": {"warehouse": {"max_running": 20}, "cluster": {"max_running": 5}},
                               "jobs": policies})
    candidates = []
    for i in range(jobs):
        ago = timedelta(seconds=(i * 7919) % 7200)  # spread over two hours: some held, some released
        candidates.append(Candidate(f"job_{i}", last_start=now - ago, first_arrival=now - ago / 2,
                                    last_arrival=now - ago / 4, added_at=now - timedelta(days=1),
                                    operator=i % 97 == 0, follow_up=i % 89 == 0))
    running = [f"job_{i}" for i in range(3, jobs, 6)][:2] + [f"job_{i}" for i in range(4, jobs, 6)][:1]
    return shaping, candidates, running


def measure_holds(jobs: int, repeats: int) -> dict[str, Any]:
    """Milliseconds per evaluation of the holds of ``jobs`` candidates, and what they decided."""
    from heartbeat_runner.policies.trigger_shaping import hold_decisions

    now = datetime.now(timezone.utc)
    shaping, candidates, running = shaping_and_candidates(jobs, now)
    hold_decisions(shaping, candidates, running, now)  # warm: imports, zone data
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        decisions = hold_decisions(shaping, candidates, running, now)
        times.append((time.perf_counter() - began) * 1000)
    return {"jobs": jobs, "median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2),
            "released": len(decisions.released),
            "held": dict(Counter(hold.kind.value for hold in decisions.held.values()))}


def report(results: dict[str, Any]) -> None:
    holds = results["holds"]
    met = "met" if holds["median_ms"] <= HOLDS_TARGET_MS else "NOT met"
    print(f"\nholds of {holds['jobs']:,} jobs in one tick: median {holds['median_ms']:.1f} ms, max "
          f"{holds['max_ms']:.1f} ms   target ≤ {HOLDS_TARGET_MS:g} ms: {met}")
    print(f"  released {holds['released']:,}; held by {holds['held']}")
    releases = results.get("releases")
    if releases:
        print(f"\nhold end → run start, run --loop --interval {results['interval_s']:g}")
        print_p50_table("hold", releases, RELEASE_TARGET_P50_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=6, help="held runs per rule (default 6)")
    parser.add_argument("--interval", type=float, default=30.0, help="the loop's interval (default 30)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs whose holds are evaluated (default 10,000)")
    parser.add_argument("--repeats", type=int, default=20, help="evaluations timed (default 20)")
    parser.add_argument("--skip-loop", action="store_true", help="only the holds' evaluation")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.samples < 1 or args.jobs < 1 or args.repeats < 1:
        parser.error("--samples, --jobs and --repeats must be at least 1")
    results: dict[str, Any] = {"interval_s": args.interval, "cores": os.cpu_count(),
                               "targets": {"release_p50_s": RELEASE_TARGET_P50_S, "holds_ms": HOLDS_TARGET_MS}}
    results["holds"] = measure_holds(args.jobs, args.repeats)
    if not args.skip_loop:
        found = measure_releases(args.samples, args.interval)
        results["releases"] = {rule: {"p50_s": round(statistics.median(v), 3), "p95_s": percentile(v, 0.95),
                                      "samples": v} for rule, v in found.items() if v}
    report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
