#!/usr/bin/env python
"""The status page serving one browser for a long time: does `ui` keep flat memory?

    python benchmarks/ui_soak.py --minutes 60 [--sensors 100] [--change-every 30]

A real `run --loop` ticks over N generated sensors (benchmarks/run.py's workload) and one source
gets new data every ``--change-every`` seconds, so the runner triggers and reconciles jobs all the
while. A real `ui` process serves the page to headless Chromium, which polls it as a user's tab
does (every 5 s) and moves to another view every minute (overview, graph, a job, ticks). The `ui`
process tree's RSS (its engine child included) and the runner's are sampled every 15 s; the
figures after warm-up are printed beside issue 18's targets and written to
benchmarks/results/ui_soak.json. Needs Debian's chromium and chromium-driver (.ci/run installs
them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import MIB, REPO, Workload, _env, _judge, _print_targets, _slope, _timed  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from browser import headless_chromium  # noqa: E402 - the tests' browser, opened the same way

OUT = REPO / "benchmarks" / "results" / "ui_soak.json"
#: metric -> (target, "max"|"min"): the loop's memory targets, applied to `ui` (issue 18)
TARGETS: dict[str, tuple[float, str]] = {
    "ui_peak_over_warm": (1.25, "max"),
    "ui_peak_mib": (600.0, "max"),
    "runner_peak_over_warm": (1.25, "max"),
}
SAMPLE_EVERY_S = 15.0
VIEWS = ("/#/", "/#/graph", "/#/jobs/j000", "/#/ticks")


@dataclass(frozen=True)
class Sample:
    """One reading, seconds after the page first opened."""

    at_s: float
    ui_mib: float
    runner_mib: float


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the browser keeps the page open")
    parser.add_argument("--sensors", type=int, default=100, help="sensors in the generated workload")
    parser.add_argument("--change-every", type=float, default=30.0, help="seconds between two upstream changes")
    parser.add_argument("--warm-up", type=float, default=5.0, help="minutes before the reference size")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work-dir", type=Path, help="parent of the temporary lakehouse")
    args = parser.parse_args(argv)
    if args.warm_up >= args.minutes:
        parser.error("--warm-up must be shorter than --minutes")
    root = Path(tempfile.mkdtemp(prefix="hb-ui-soak-", dir=args.work_dir))
    try:
        figures = soak(Workload(root / f"n{args.sensors}", args.sensors), args.minutes * 60,
                       args.change_every, args.warm_up * 60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    report(figures)
    print(f"\nwritten to {args.out}")
    return 0


def soak(workload: Workload, seconds: float, change_every: float, warm_up_s: float) -> dict[str, Any]:
    """The runner and the page side by side for ``seconds``; their memory every SAMPLE_EVERY_S."""
    from heartbeat_runner.core.processes import tree_rss_bytes

    workload.generate()
    _timed(workload.cli("seed"))
    port = _free_port()
    runner = _start(workload.cli("run", "--loop", "--interval", "5"), workload.root / "runner.log")
    page = _start(workload.cli("ui", "--port", str(port), "--refresh", "5"), workload.root / "ui.log")
    url = f"http://127.0.0.1:{port}"
    samples: list[Sample] = []
    changes = views = 0
    try:
        _wait_http(url, page, timeout_s=180)
        with headless_chromium() as browser:
            began = next_change = next_view = time.monotonic()
            while (now := time.monotonic()) - began < seconds:
                if now >= next_view:
                    browser.get(url + VIEWS[views % len(VIEWS)])
                    views, next_view = views + 1, now + 60
                if now >= next_change:
                    workload.change([workload.sensors[changes % workload.n]], tag=5000 + changes)
                    changes, next_change = changes + 1, now + change_every
                for process, name in ((runner, "runner"), (page, "ui")):
                    if process.poll() is not None:
                        raise RuntimeError(f"{name} exited with {process.returncode}; see its log under {workload.root}")
                samples.append(Sample(round(now - began, 1), round(tree_rss_bytes(page.pid) / MIB, 1),
                                      round(tree_rss_bytes(runner.pid) / MIB, 1)))
                if len(samples) % 40 == 0:
                    print(f"  ui soak: {samples[-1].at_s / 60:.0f} of {seconds / 60:.0f} min: ui "
                          f"{samples[-1].ui_mib:.0f} MiB, runner {samples[-1].runner_mib:.0f} MiB",
                          file=sys.stderr, flush=True)
                time.sleep(SAMPLE_EVERY_S)
    finally:
        for process in (page, runner):
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    figures = {"sensors": workload.n, "minutes": round(seconds / 60, 1), "change_every_s": change_every,
               "warm_up_s": warm_up_s, "changes": changes, "views_opened": views,
               "ui": _phase([(s.at_s, s.ui_mib) for s in samples], warm_up_s),
               "runner": _phase([(s.at_s, s.runner_mib) for s in samples], warm_up_s),
               "samples": [vars(s) for s in samples]}
    figures["summary"] = _judge(TARGETS, {
        "ui_peak_over_warm": figures["ui"]["peak_over_warm"], "ui_peak_mib": figures["ui"]["peak_mib"],
        "runner_peak_over_warm": figures["runner"]["peak_over_warm"]})
    return figures


def _phase(points: list[tuple[float, float]], warm_up_s: float) -> dict[str, Any]:
    """Size at the end of warm-up, peak and median after it, growth per hour after it."""
    after = [(t, mib) for t, mib in points if t >= warm_up_s] or points[-1:]
    warm, peak = after[0][1], max(mib for _, mib in after)
    return {"warm_mib": warm, "peak_mib": peak, "peak_over_warm": round(peak / warm, 3),
            "median_mib": statistics.median(mib for _, mib in after),
            "growth_mib_per_hour": round(_slope(after) * 3600, 1)}


def report(figures: dict[str, Any]) -> None:
    print(f"\nui soak: {figures['minutes']:g} min, {figures['sensors']} sensors, one change every "
          f"{figures['change_every_s']:g} s ({figures['changes']} changes), headless Chromium polling every 5 s "
          f"and opening {figures['views_opened']} views")
    print("  process tree RSS (MiB) every 10 min:  ui | runner")
    for sample in figures["samples"]:
        if round(sample["at_s"]) % 600 < SAMPLE_EVERY_S:
            print(f"    {sample['at_s'] / 60:>5.0f} min  {sample['ui_mib']:>6.0f} | {sample['runner_mib']:>6.0f}")
    for name in ("ui", "runner"):
        phase = figures[name]
        print(f"  {name}: at warm-up {phase['warm_mib']:.0f} MiB, peak after {phase['peak_mib']:.0f} MiB "
              f"({phase['peak_over_warm']:.2f}x), median {phase['median_mib']:.0f} MiB, "
              f"growth {phase['growth_mib_per_hour']:+.1f} MiB per hour")
    _print_targets(figures["summary"])


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen(argv, env=_env(), stdout=handle, stderr=subprocess.STDOUT, cwd=log.parent)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ui exited with {process.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"ui did not answer at {url} within {timeout_s:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
