#!/usr/bin/env python
"""Paired before/after: the same benchmarks on two versions of Heartbeat, interleaved in one run (issue 54).

    python benchmarks/ab.py [--before 7fe6466] [--after WORKTREE] [--pairs 3]
                            [--figures tick,wake,scale10k,scale100k] [--out benchmarks/results/ab.json]
    python benchmarks/ab.py --switch HEARTBEAT_FOLDS [--figures tick] [--bound 1.0] [--pairs 5]

Each version is a tree of its own: ``--before`` and ``--after`` name git commits (``git archive`` writes each to
a temporary folder); ``WORKTREE`` (the default after) is a copy of this checkout as it is at the start. Every
benchmark runs as that tree's own script, in a process whose ``PYTHONPATH`` puts the tree's ``heartbeat_runner``
(and with it its dbt project) first, so each side measures its own code with the same installed libraries. A pair is one run of each
side; pairs alternate which side goes first (A B, B A, ...), so a machine that slows down or warms up over the
run weighs on both sides alike. The verdict per figure is the median over pairs of after/before, beside the
issue's bound (≤ 1.1): a ratio of two runs made minutes apart on one machine, never an absolute time.

Figures (each a benchmark script of the tree, its JSON read back):

- ``tick``: ``run.py --sizes 1000``: the steady tick (nothing new) and the busy tick (10 % changed), medians of
  three repeats;
- ``wake``: ``latency.py --interval 5``: commit → job start with wake-ups on, the runner idle (``wake_idle``)
  and in a burst of changes (``wake_burst``); every kind's samples pooled, their median;
- ``scale10k``, ``scale100k``: ``scale.py`` at 10,000 and 100,000 sources: steady and busy ticks.

``--switch VAR`` compares one tree (``--after``) with itself: the setting ``VAR=off`` (before) against ``on``
(after), on the figures asked for, beside ``--bound`` (what the switch must show to stay: 0.8 is a 20 % cut).
It decided the fate of ``HEARTBEAT_HURRY`` (a tick that left work to the next while a wake-up waited): off
against on, on the burst latency, it had to cut the median by 20 % and did not (results/ab-hurry.json), so it
was removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "ab.json"
#: the commit issue 54 was filed against
DEFAULT_BEFORE = "7fe6466"
WORKTREE = "WORKTREE"
#: after/before medians at most this (issue 54)
BOUND = 1.1
#: the latency modes both sides measure, in this order (the older script runs exactly these, always)
WAKE_MODES = "on,burst,off"


@dataclass(frozen=True)
class Side:
    """One version under test: a tree and the environment its benchmarks run with."""

    name: str
    tree: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(self, script: str, args: list[str], out: Path, log: Path) -> dict[str, Any]:
        """Run the tree's ``benchmarks/<script>`` with ``args`` and ``--out``; its JSON. Raises with the log's end
        when the script fails."""
        env = {**os.environ, "PYTHONPATH": str(self.tree), **self.env}
        env.pop("HEARTBEAT_PROJECT_DIR", None)  # the tree's own dbt project (settings.package_project_dir)
        argv = [sys.executable, str(self.tree / "benchmarks" / script), *args, "--out", str(out)]
        with open(log, "w") as sink:
            done = subprocess.run(argv, cwd=self.tree, env=env, stdout=sink, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"{self.name}: {script} exited {done.returncode}:\n" + "\n".join(tail))
        return json.loads(out.read_text())


@dataclass(frozen=True)
class Benchmark:
    """A benchmark script and how its JSON gives named figures (seconds)."""

    name: str
    script: str
    args: Callable[[Side], list[str]]
    figures: Callable[[dict[str, Any]], dict[str, float]]


def _tick_figures(size: str) -> Callable[[dict[str, Any]], dict[str, float]]:
    def figures(results: dict[str, Any]) -> dict[str, float]:
        measured = results["sizes"][size]
        return {f"steady_{size}": measured["steady"]["wall_s"], f"busy_{size}": measured["busy"]["wall_s"]}
    return figures


def _wake_figures(results: dict[str, Any]) -> dict[str, float]:
    pooled = {mode: [s for kind in results["modes"][mode].values() for s in kind["samples"]]
              for mode in ("on", "burst")}
    return {"wake_idle": statistics.median(pooled["on"]), "wake_burst": statistics.median(pooled["burst"])}


def _wake_args(side: Side) -> list[str]:
    """The latency script's arguments: a short interval (its ``off`` mode waits for the interval), and the modes
    the older script always runs, for a script that takes ``--modes``."""
    takes_modes = "--modes" in (side.tree / "benchmarks" / "latency.py").read_text()
    return ["--interval", "5", *(["--modes", WAKE_MODES] if takes_modes else [])]


BENCHMARKS = {
    # three repeats (run.py's default; --quick is one): a steady tick at 1,000 sources is 40-60 ms
    "tick": Benchmark("tick", "run.py", lambda _: ["--sizes", "1000"], _tick_figures("1000")),
    "wake": Benchmark("wake", "latency.py", _wake_args, _wake_figures),
    "scale10k": Benchmark("scale10k", "scale.py", lambda _: ["--sizes", "10000", "--latency-at", ""],
                          _tick_figures("10000")),
    "scale100k": Benchmark("scale100k", "scale.py", lambda _: ["--sizes", "100000", "--latency-at", ""],
                           _tick_figures("100000")),
}


def export_tree(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` written under ``into`` (``git archive``); for WORKTREE, a copy of this checkout's
    files as they are now (tracked and new, not ignored), so edits made while the benchmark runs never reach it."""
    tree = into / ref.replace("/", "_")
    tree.mkdir(parents=True)
    if ref == WORKTREE:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                                capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            if (REPO / name).is_file():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, tree / name)
        return tree
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"ab.py: git archive {ref}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def run_pairs(before: Side, after: Side, chosen: list[Benchmark], pairs: int, work: Path) -> dict[str, Any]:
    """``pairs`` runs of every benchmark on each side, alternating which side goes first; each pair's figures."""
    measured: list[dict[str, dict[str, float]]] = []
    for pair in range(pairs):
        order = (before, after) if pair % 2 == 0 else (after, before)
        figures: dict[str, dict[str, float]] = {before.name: {}, after.name: {}}
        for bench in chosen:
            for side in order:
                started = time.monotonic()
                stem = work / f"{pair}-{bench.name}-{side.name}"
                results = side.run(bench.script, bench.args(side), stem.with_suffix(".json"), stem.with_suffix(".log"))
                found = bench.figures(results)
                figures[side.name].update(found)
                print(f"pair {pair + 1}/{pairs} {bench.name:9} {side.name:6} {time.monotonic() - started:6.0f} s: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in found.items()), flush=True)
        measured.append(figures)
    return {"pairs": measured}


def verdicts(measured: list[dict[str, dict[str, float]]], before: str, after: str,
             bound: float) -> list[dict[str, Any]]:
    """Per figure: each side's median, the median of the pairs' after/before ratios, and whether it is within
    ``bound``."""
    rows = []
    for name in measured[0][after]:
        ratios = [pair[after][name] / pair[before][name] for pair in measured if pair[before][name] > 0]
        ratio = statistics.median(ratios) if ratios else float("nan")
        rows.append({"figure": name, "before_s": statistics.median(p[before][name] for p in measured),
                     "after_s": statistics.median(p[after][name] for p in measured),
                     "ratio": round(ratio, 3), "ratios": [round(r, 3) for r in ratios],
                     "bound": bound, "met": ratio <= bound})
    return rows


def print_verdicts(rows: list[dict[str, Any]], before: str, after: str) -> None:
    print(f"\n{'figure':14} {before + ' (s)':>14} {after + ' (s)':>14} {'after/before':>13}  bound  pairs' ratios")
    for row in rows:
        print(f"{row['figure']:14} {row['before_s']:14.3f} {row['after_s']:14.3f} {row['ratio']:13.3f}  "
              f"≤ {row['bound']:<4} {'met' if row['met'] else 'NOT met':8} {row['ratios']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help=f"a git commit (default {DEFAULT_BEFORE})")
    parser.add_argument("--after", default=WORKTREE, help="a git commit, or WORKTREE: this checkout (default)")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--figures", default="tick,wake,scale10k,scale100k",
                        help=f"benchmarks, comma-separated: {', '.join(BENCHMARKS)}")
    parser.add_argument("--switch", metavar="VAR",
                        help="one tree (--after), the setting VAR=off (before) against on (after)")
    parser.add_argument("--bound", type=float, default=BOUND, help=f"after/before at most this (default {BOUND})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.figures.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown or args.pairs < 1:
        parser.error(f"--figures: unknown {', '.join(unknown)}" if unknown else "--pairs: at least 1")
    work = Path(tempfile.mkdtemp(prefix="hb-ab-"))
    try:
        if args.switch:
            tree = export_tree(args.after, work)
            before, after = Side("off", tree, {args.switch: "off"}), Side("on", tree, {args.switch: "on"})
        else:
            before, after = Side("before", export_tree(args.before, work)), Side("after", export_tree(args.after, work))
        print(f"A/B: {before.name} = {before.tree}{' ' + str(before.env) if before.env else ''}; "
              f"{after.name} = {after.tree}{' ' + str(after.env) if after.env else ''}; {args.pairs} pairs", flush=True)
        try:
            measured = run_pairs(before, after, [BENCHMARKS[n] for n in names], args.pairs, work)
        except RuntimeError as exc:
            print(f"ab.py: {exc}", file=sys.stderr)
            return 1
        rows = verdicts(measured["pairs"], before.name, after.name, args.bound)
        print_verdicts(rows, before.name, after.name)
        results = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                   "before": f"{args.switch}=off" if args.switch else args.before, "after": args.after,
                   "switch": args.switch, **measured, "verdicts": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwritten to {args.out}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
