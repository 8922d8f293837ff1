#!/usr/bin/env python
"""Time to stop ``run --loop`` on a stop signal, on the embedded engine (Sail).

    python benchmarks/stop.py [--repeat 1] [--work-dir DIR]

One lakehouse (one trigger-folder source, one local job), seeded once. For each stop signal (SIGINT,
SIGTERM), each receiver (the whole process group, as Ctrl-C in a terminal, ``timeout`` or systemd's
``KillMode=control-group`` send it; the runner alone, as ``kill`` does) and each moment (between ticks; mid-tick,
paused after sensing by HEARTBEAT_PAUSE_AT and let go 0.3 s after the signal), one ``run --loop`` process:
prints the seconds from the signal to its exit, its exit code, and whether its shutdown watchdog fired or an
engine process was left behind. Target: exit 0, no watchdog, nothing left, well under the 30 s grace (the
mid-tick figures include the 0.3 s pause and the rest of the tick). Nothing is asserted: the test
``tests/test_hardening.py::test_a_stop_signal_to_the_loop_or_its_whole_process_group_stops_it_cleanly_after_the_running_tick``
checks the behaviour.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="stops per case (default 1)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the lakehouse goes (default: a temp dir)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    from harness import HEADER, CliLakehouse, config_row, marker_jobs_file, stop_loop

    root = Path(tempfile.mkdtemp(prefix="hb-stop-", dir=args.work_dir))
    config = root / "config.csv"
    config.write_text(f"{HEADER}\n{config_row('trigger_file', 'drop', 'J1')}\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "J1"))
    lake.home.mkdir(parents=True)
    lake.cli("seed")
    lake.cli("run")
    print(f"{'signal':8} {'to':7} {'when':8} {'stop s (median)':>16} {'exit':>5} {'watchdog':>9} {'left':>5}")
    for sig in (signal.SIGINT, signal.SIGTERM):
        for to_group in (True, False):
            for mid_tick in (False, True):
                stops = [stop_loop(lake, sig, to_group=to_group, mid_tick=mid_tick, marker=root / f"paused-{n}")
                         for n in range(args.repeat)]
                print(f"{signal.Signals(sig).name:8} {'group' if to_group else 'runner':7} "
                      f"{'mid-tick' if mid_tick else 'between':8} {statistics.median(s.stop_s for s in stops):16.2f} "
                      f"{','.join(sorted({str(s.returncode) for s in stops})):>5} "
                      f"{'yes' if any('Timeout (' in s.stderr for s in stops) else 'no':>9} "
                      f"{sum(len(s.left_behind) for s in stops):5d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
