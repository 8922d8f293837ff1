"""Cold one-shot ticks of two code trees, back to back on one workload (issue 44, part 3).

``python benchmarks/cold_start.py --before /tmp/old-tree [--sensors 1000] [--repeats 5]``

A cold tick is ``python -m heartbeat_runner run`` in a new process (cron, a scheduled job).
Each repetition times, for each tree in turn: ``--version`` (imports alone), ``run`` with
nothing new, and ``run`` after one upstream Delta commit (which builds with dbt and starts a
job); then one more ``run`` reconciles that job, untimed. Alternating the trees lets a busy
machine slow both alike. ``--before`` is a checkout of another version (``git archive REV |
tar -x -C DIR``); the dbt project is this checkout's for both, so both build the same models.
Prints the medians beside the target; nothing is asserted.

Beside each process's wall time it reads the tick's own time from ``run --json`` (``duration_s``: the tick from
its first step to its report, without the process's start): ``no_new_data_tick`` and ``new_data_tick``, the
figures a change inside the tick moves. The last table is after ÷ before per figure, the median of the paired
ratios (one pair per repetition), beside the 1.1 bound issue 54 sets for a change that must not slow the tick.
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
from pathlib import Path

from run import REPO, Workload, _stamps, _wait_stamp  # a sibling module (the script's folder)

#: a cold tick with new data, at 1,000 sensors, on the embedded engine (issue 44)
TARGET_NEW_DATA_S = 4.0
FIGURES = ("version", "no_new_data", "new_data", "no_new_data_tick", "new_data_tick")
#: after ÷ before that a change which must not slow the tick may reach (issue 54)
RATIO_BOUND = 1.1


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_") and k != "SPARK_REMOTE"}
    env.update(PYTHONPATH=str(tree), HEARTBEAT_PROJECT_DIR=str(REPO), DBT_SEND_ANONYMOUS_USAGE_STATS="false")
    return env


def _run(argv: list[str], tree: Path) -> tuple[float, str]:
    """The process's wall seconds and its standard output."""
    began = time.monotonic()
    done = subprocess.run(argv, env=_env(tree), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    return round(time.monotonic() - began, 3), done.stdout


def _timed(argv: list[str], tree: Path) -> float:
    return _run(argv, tree)[0]


def _tick(argv: list[str], tree: Path) -> tuple[float, float]:
    """A one-shot ``run --json``: the process's wall seconds and the tick's own (its ``duration_s``)."""
    wall, out = _run([*argv, "--json"], tree)
    return wall, round(float(json.loads(out)["duration_s"]), 3)


def compare(trees: dict[str, Path], workload: Workload, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds per tree and figure, ``repeats`` of each."""
    probe = workload.sensors[0]
    times: dict[str, dict[str, list[float]]] = {name: {f: [] for f in FIGURES} for name in trees}
    for rep in range(repeats):
        for name, tree in trees.items():
            figures = times[name]
            figures["version"].append(_timed([sys.executable, "-m", "heartbeat_runner", "--version"], tree))
            for figure in ("no_new_data", "new_data"):
                if figure == "new_data":
                    before = len(_stamps(workload.stamp(probe.job)))
                    workload.change([probe], tag=1000 + rep * len(trees) + list(trees).index(name))
                wall, tick = _tick(workload.cli("run"), tree)
                figures[figure].append(wall)
                figures[f"{figure}_tick"].append(tick)
            _wait_stamp(workload.stamp(probe.job), after=0.0, count=before + 1)
            _timed(workload.cli("run"), tree)  # reconciles the job: the next run has nothing new
            print(f"{name} {rep + 1}/{repeats}: " + ", ".join(f"{f} {figures[f][-1]:.2f}s" for f in FIGURES),
                  flush=True)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the version to compare with")
    parser.add_argument("--sensors", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": REPO}
    with tempfile.TemporaryDirectory(prefix="hb-cold-") as root:
        workload = Workload(Path(root), args.sensors)
        workload.generate()
        _timed(workload.cli("seed"), REPO)
        _timed(workload.cli("run"), REPO)  # the baselines: later ticks see only the probe's commits
        times = compare(trees, workload, args.repeats)
    print(f"\ncold one-shot tick, {args.sensors} sensors, median of {args.repeats}:")
    for name, figures in times.items():
        print(f"  {name:6}  " + "  ".join(f"{f} {statistics.median(v):.2f}s" for f, v in figures.items()))
    print(f"  target: new_data <= {TARGET_NEW_DATA_S:g}s")
    if set(times) == {"before", "after"}:
        print(f"\nafter / before, median of the {args.repeats} paired ratios (bound {RATIO_BOUND:g}):")
        for figure in FIGURES:
            ratio = statistics.median(a / b for a, b in zip(times["after"][figure], times["before"][figure]) if b)
            print(f"  {figure:18} {ratio:.3f}  {'ok' if ratio <= RATIO_BOUND else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
