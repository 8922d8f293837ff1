"""Databricks at scale: ticks against the Jobs API stand-in answering every call after 150 ms.

Real parts: a temporary lakehouse (Sail + Delta, dbt, built by the test harness), the real
databricks-sdk and Heartbeat's Databricks backend; the Jobs API is the stand-in of the tests
(``tests/databricks_jobs_server.py``), with ``--latency`` seconds added to every answer. Each job
is fed by its own trigger-file folder. The workspace also holds other teams' runs (30 active,
200 completed, started an hour ago) that Heartbeat must ignore. Setup runs at zero latency; only
the measured tick pays the latency. Figures (each printed beside its target):

* busy tick: N ready jobs triggered in one tick (default 300);
* steady tick with 1,000 runs RUNNING (after one reconcile has learnt their start times);
* steady tick with 1,000 jobs FAILED, each with 100 earlier runs, after the first look (which reads
  each job's history once per process; printed too) and with the failed runs older than the
  2-minute overlap of the incremental look, as on any tick after the first minutes;
* 429 storm: the busy tick again with every 3rd run-now answered 429 (Retry-After 1 s, honoured by
  the SDK): no duplicate run, no lost request, the tick's API calls within their budget;
* local jobs: launching 334 local job processes (the busy tick at 10,000 sensors) on the same pool,
  against one after another.

    python benchmarks/databricks_scale.py                 # everything (~10 min on 2 shared cores)
    python benchmarks/databricks_scale.py --only busy,storm --busy-jobs 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness and the Jobs API stand-in of the tests

from databricks_jobs_server import JobsApiServer  # noqa: E402
from harness import Harness  # noqa: E402
from harness import config_row as row  # noqa: E402

from heartbeat_runner.core.settings import JobsApiLimits  # noqa: E402
from heartbeat_runner.jobs.databricks import DatabricksJobsBackend  # noqa: E402
from heartbeat_runner.runner.tick import Heartbeat  # noqa: E402
from heartbeat_runner.runner.tick_result import TickResult  # noqa: E402

ENDPOINTS = ("run-now", "runs/get", "runs/list")


@dataclass(frozen=True)
class Figure:
    name: str
    measured: str
    target: str
    met: bool

    def line(self) -> str:
        return f"{self.name:<52} {self.measured:<34} target {self.target:<28} {'met' if self.met else 'NOT MET'}"


@dataclass
class Workspace:
    """A lakehouse whose ``jobs`` each read one trigger folder, ticking against the stand-in."""

    hb: Harness
    api: JobsApiServer
    heartbeat: Heartbeat
    jobs: list[int]

    def drop_all(self, name: str) -> None:
        for i in range(len(self.jobs)):
            self.hb.drop_trigger_file(f"drop_{i}", name)

    def measured_tick(self, latency_s: float) -> tuple[TickResult, float, dict[str, int]]:
        """One tick with every answer ``latency_s`` late: the result, its wall time and its calls per endpoint."""
        self.api.reset_counts()
        self.api.latency_s = latency_s
        began = time.monotonic()
        result = self.heartbeat.tick()
        took = time.monotonic() - began
        self.api.latency_s = 0.0
        return result, took, {e: self.api.calls(e) for e in ENDPOINTS}


@contextmanager
def workspace(jobs: int, *, retries_real_time: bool = False) -> Iterator[Workspace]:
    with tempfile.TemporaryDirectory(prefix="hb-dbx-") as tmp, JobsApiServer() as api, \
            Harness(Path(tmp), engine="sail") as hb:
        api.record_requests = False
        ids = [api.add_job(f"job_{i}") for i in range(jobs)]
        api.add_other_runs(active=30, completed=200, start_ms=int(time.time() * 1000) - 3_600_000)
        hb.seed(*(row("trigger_file", f"drop_{i}", str(job)) for i, job in enumerate(ids)))
        client = api.client(http_timeout_s=30, retry_timeout_s=120, fast_retries=not retries_real_time)
        heartbeat = hb.app.heartbeat(backend=DatabricksJobsBackend(client, limits=JobsApiLimits()))
        heartbeat.tick()  # baseline: the folders are empty
        yield Workspace(hb, api, heartbeat, ids)


def calls_text(calls: dict[str, int]) -> str:
    return f"{sum(calls.values())} calls (" + ", ".join(f"{e} {n}" for e, n in calls.items() if n) + ")"


def busy(jobs: int, latency: float) -> list[Figure]:
    with workspace(jobs) as ws:
        ws.drop_all("batch.done")
        result, took, calls = ws.measured_tick(latency)
        assert len(result.triggered) == jobs, result.as_dict()
        api_s = result.stage_timings.get("triggering", 0.0)
        print("   stages:", {k: round(v, 2) for k, v in result.stage_timings.items()})
        return [Figure(f"busy tick, {jobs} ready jobs", f"{took:.2f} s (triggering {api_s:.2f} s), "
                       f"{calls_text(calls)}", "<= 8 s (300 jobs)", took <= 8.0)]


def steady_running(latency: float) -> list[Figure]:
    with workspace(1000) as ws:
        ws.drop_all("batch.done")
        assert len(ws.heartbeat.tick().triggered) == 1000
        for run in list(ws.api.runs.values()):
            if run.token:
                ws.api.start_run(run.run_id)
        ws.heartbeat.tick()  # the first reconcile learns the runs' start times
        result, took, calls = ws.measured_tick(latency)
        assert not result.completed and not result.trigger_errors, result.as_dict()
        total = sum(calls.values())
        return [Figure("steady tick, 1,000 runs RUNNING", f"{took:.2f} s, {calls_text(calls)}",
                       "<= 3 s, <= 45 calls", took <= 3.0 and total <= 45)]


def steady_failed(latency: float) -> list[Figure]:
    with workspace(1000) as ws:
        now_ms = int(time.time() * 1000)
        for n, job in enumerate(ws.jobs):  # 100 earlier runs each, in the last days
            for i in range(100):
                start = now_ms - 3_600_000 * (1 + i) - n
                ws.api.create_manual_run(job, "SUCCESS", start_ms=start, end_ms=start + 60_000)
        ws.drop_all("batch.done")
        assert len(ws.heartbeat.tick().triggered) == 1000
        for run in list(ws.api.runs.values()):
            if run.token:  # each ran for an hour before it failed: the steady state, later than the first look
                run.start_ms -= 3_600_000
                ws.api.finish_run(run.run_id, "FAILED", "Task etl failed")
        assert len(ws.heartbeat.tick().failed) == 1000
        ws.api.reset_counts()
        ws.heartbeat.tick()  # the first look of this process reads each failed job's history once
        first_look = ws.api.calls("runs/list")
        result, took, calls = ws.measured_tick(latency)
        assert not result.completed and not result.trigger_errors, result.as_dict()
        total = sum(calls.values())
        return [Figure("steady tick, 1,000 jobs FAILED, 100 runs each", f"{took:.2f} s, {calls_text(calls)}",
                       "<= 3 s, <= 45 calls", took <= 3.0 and total <= 45),
                Figure("  (first look after start, once per process)", f"{first_look} runs/list at 0 ms", "-", True)]


def storm(jobs: int, latency: float) -> list[Figure]:
    with workspace(jobs, retries_real_time=True) as ws:
        ws.api.throttle_every("run-now", 3, retry_after=1)
        ws.drop_all("batch.done")
        result, took, calls = ws.measured_tick(latency)
        api_s = result.stage_timings.get("triggering", 0.0) + result.stage_timings.get("reconciliation", 0.0)
        budget = ws.heartbeat.settings.jobs_api.budget_s
        for _ in range(3):  # whatever was carried goes out in the next ticks
            if not ws.api.runs or all(len(ws.api.runs_of(job)) == 1 for job in ws.jobs):
                break
            ws.heartbeat.tick()
        ws.api.throttle_every("run-now", 0)
        duplicates = sum(max(0, len(ws.api.runs_of(job)) - 1) for job in ws.jobs)
        lost = sum(1 for job in ws.jobs if not ws.api.runs_of(job))
        return [Figure(f"429 storm (every 3rd run-now), {jobs} ready jobs",
                       f"{took:.2f} s tick, API steps {api_s:.2f} s, {calls_text(calls)}, "
                       f"{len(result.triggered)} triggered + {len(result.carried)} carried",
                       f"API steps within budget {budget:g} s", api_s <= budget + 3),
                Figure("  duplicates / lost requests", f"{duplicates} / {lost}", "0 / 0", duplicates == lost == 0)]


def local_launches(count: int = 334) -> list[Figure]:
    """The local backend's trigger calls one after another, then on the tick's pool (fresh tokens each)."""
    from heartbeat_runner.jobs.base import TriggerRequest
    from heartbeat_runner.jobs.calls import ApiBudget, call_all
    from heartbeat_runner.jobs.local import LocalJobsBackend

    with tempfile.TemporaryDirectory(prefix="hb-local-") as tmp:
        jobs_file = Path(tmp) / "jobs.yml"
        jobs_file.write_text("jobs:\n" + "".join(f"  'J{i}': ['true']\n" for i in range(count)))
        backend = LocalJobsBackend(jobs_file, Path(tmp) / "state")
        timings = {}
        for label, concurrency in (("one after another", 1), ("pool", JobsApiLimits().concurrency)):
            requests = [TriggerRequest(f"J{i}", None, f"{label[0]}-{i}") for i in range(count)]
            began = time.monotonic()
            calls = call_all(requests, backend.trigger, ApiBudget(JobsApiLimits(concurrency=concurrency)))
            timings[label] = time.monotonic() - began
            assert len(calls.answers) == count and all(a.error is None for a in calls.answers)
        sequential, pooled = timings["one after another"], timings["pool"]
        return [Figure(f"local jobs: {count} launches", f"{pooled:.2f} s on the pool, {sequential:.2f} s one "
                       f"after another ({sequential / pooled:.1f}x)", "faster than one after another",
                       pooled < sequential)]


SCENARIOS: dict[str, Callable[[argparse.Namespace], list[Figure]]] = {
    "busy": lambda a: busy(a.busy_jobs, a.latency),
    "running": lambda a: steady_running(a.latency),
    "failed": lambda a: steady_failed(a.latency),
    "storm": lambda a: storm(a.busy_jobs, a.latency),
    "local": lambda a: local_launches(),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.150, help="seconds every API answer waits (0.150)")
    parser.add_argument("--busy-jobs", type=int, default=300)
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    print(f"Jobs API stand-in, {args.latency * 1000:.0f} ms per call; limits {JobsApiLimits()}")
    figures: list[Figure] = []
    for name in chosen:
        for figure in SCENARIOS[name](args):
            print(figure.line(), flush=True)
            figures.append(figure)
    return 0 if all(f.met for f in figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())
