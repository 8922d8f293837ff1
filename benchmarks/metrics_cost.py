"""What Prometheus metrics cost (issue 42), for benchmarks/run.py.

* ``metrics on vs off``: steady ticks at 1,000 sensors, alternately without and with what a loop serving
  metrics adds to each tick on the tick's thread (counting the tick from its result); the cost is the
  median of the added seconds over the median steady tick (target <= 2%). The counts in lower layers
  (engine recycles, the lease) are on in both. A scrape is not part of a tick: Prometheus asks on its
  own schedule and the exposition answers on its own thread; its cost is shown beside (``scrape_s``) and
  timed over HTTP at 10,000 sources below.
* ``/metrics`` at 10,000 sources: the registry filled as a 10,000-source tick would fill it, then the
  median HTTP answer of the exposition served as a loop serves it (target <= 50 ms). Labels are bounded
  (source kind, stage, backend, ...), so the exposition's size does not depend on the number of sources:
  the figure is the same at any size, and the synthetic tick only has to touch every label a real one does.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from typing import Any

from heartbeat_runner.core.records import SensingTarget, utcnow
from heartbeat_runner.runner.tick_result import TickResult, TriggeredJob

#: the source kinds the synthetic tick senses (a real lakehouse has a handful)
KINDS = ("delta_table", "trigger_file", "jdbc", "kafka", "upstream_sensor_table")
STAGES = ("models", "sensing", "events_write", "dbt", "triggering", "reconciliation", "report", "alerts")


def synthetic_tick(sources: int) -> TickResult:
    """The result of a tick that sensed ``sources`` sources (one in ten with new data, one in a hundred
    failing) and triggered a job per new-data source: what a real tick hands the metrics."""
    from heartbeat_runner.sensing.parallel import SensingOutcome
    from heartbeat_runner.sensing.sources.base import SenseResult

    result = TickResult(run_id="bench", snapshot_ts=utcnow(), stage_timings=dict.fromkeys(STAGES, 0.01),
                        duration_s=0.1)
    for n in range(sources):
        kind = KINDS[n % len(KINDS)]
        target = SensingTarget(f"{kind}|s{n}", kind, f"s{n}", None, None, "batch", None)
        failing, new = n % 100 == 0, n % 10 == 0
        result.sensed.append(SensingOutcome(target, f"J{n}", None if failing else SenseResult(new_data=new),
                                            "boom" if failing else None, 0.001))
        if new:
            result.triggered.append(TriggeredJob(f"J{n}", f"run-{n}"))
    return result


def metrics_on_off(heartbeat: Any, repeats: int) -> dict[str, Any]:
    """Steady ticks of ``heartbeat`` alternately off and on (see the module); seconds and the cost in %."""
    from heartbeat_runner.core.metrics import metrics
    from heartbeat_runner.runner.observability import count_outcome, count_tick

    off, on, added, scrape = [], [], [], []
    for _ in range(max(5, repeats)):
        began = time.perf_counter()
        heartbeat.tick()
        off.append(time.perf_counter() - began)
        began = time.perf_counter()
        result = heartbeat.tick()
        counting = time.perf_counter()
        count_tick(result, "local")
        count_outcome(result, failed=False)
        done = time.perf_counter()
        on.append(done - began)
        added.append(done - counting)
        metrics().exposition()
        scrape.append(time.perf_counter() - done)
    steady = statistics.median(off)
    return {"off_s": round(steady, 4), "on_s": round(statistics.median(on), 4),
            "added_s": round(statistics.median(added), 6), "scrape_s": round(statistics.median(scrape), 6),
            "cost_pct": round(100 * statistics.median(added) / steady, 3)}


def scrape_at(sources: int, samples: int = 50) -> dict[str, Any]:
    """Median and worst ``/metrics`` answer (ms, over HTTP) after a ``sources``-source tick was counted."""
    from heartbeat_runner.core.metrics import serve_metrics, use_metrics
    from heartbeat_runner.runner.observability import count_open_alerts, count_outcome, count_tick

    use_metrics()
    tick = synthetic_tick(sources)
    count_tick(tick, "local")
    count_outcome(tick, failed=False)
    count_open_alerts(["SOURCE_LATE", "JOB_FAILED"])
    server = serve_metrics(0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        urllib.request.urlopen(url, timeout=10).read()  # the first answer opens the connection machinery
        took, size = [], 0
        for _ in range(samples):
            began = time.perf_counter()
            size = len(urllib.request.urlopen(url, timeout=10).read())
            took.append(1000 * (time.perf_counter() - began))
    finally:
        server.close()
        use_metrics()
    return {"sources": sources, "median_ms": round(statistics.median(took), 2), "max_ms": round(max(took), 2),
            "bytes": size}
