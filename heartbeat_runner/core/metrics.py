"""Every Prometheus collector of Heartbeat, declared in one place (a leaf: any layer may count here).

Invariants:

* one :class:`Metrics` per process (:func:`metrics`), on a private ``CollectorRegistry``, never the
  library's global default; a test swaps in a fresh one with :func:`use_metrics`;
* names follow Prometheus' conventions: the ``heartbeat_`` prefix, base units (seconds, bytes), counters
  end in ``_total`` (the library appends it), durations in ``_seconds``;
* labels are bounded: an outcome, a stage, a source kind (``sensor_source``), a jobs backend, a jobs API
  endpoint, a destination kind, an alert kind, a control table refresh's path and reason; never a job id, a source id or a run id, so the
  exposition's size does not grow with the number of sources;
* nothing here queries a table: what a scrape reads was set by the last tick (or by the code that counts),
  so a scrape costs the same at 10,000 sources as at 10.

The runner counts a tick from its result record (``runner/observability.py``); lower layers count what
only they see (engine recycles and wakes, jobs API answers, alert deliveries, the lease).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest, start_http_server

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.records import RefreshPath, RefreshReason

# no ``*_created`` series: a third of the exposition, and nothing the dashboard or the rules read
disable_created_metrics()

#: the ``outcome`` of a tick the lease made the loop skip (the others are TickStatus values)
SKIPPED = "SKIPPED"
#: the exposition's content type (the Prometheus text format)
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: tick and stage durations: from an idle tick (tens of ms) to a tick far past any sane interval
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass
class Metrics:
    """Every collector, on ``registry`` (see the module's invariants)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.ticks = Counter("heartbeat_ticks", "Ticks by outcome: OK, ERROR (a source or job call failed), "
                             "FAILED (the tick raised), SKIPPED (another runner held the lease)",
                             ["outcome"], registry=r)
        self.tick_duration = Histogram("heartbeat_tick_duration_seconds", "Wall time of a tick that went through",
                                       registry=r, buckets=DURATION_BUCKETS)
        self.stage_duration = Histogram("heartbeat_tick_stage_duration_seconds",
                                        "Wall time of one stage of a tick (sensing, dbt, triggering, ...)",
                                        ["stage"], registry=r, buckets=DURATION_BUCKETS)
        self.interval = Gauge("heartbeat_tick_interval_seconds", "The loop's interval between tick starts",
                              registry=r)
        self.last_tick = Gauge("heartbeat_last_successful_tick_timestamp_seconds",
                               "Unix time at which the latest tick that went through (OK or ERROR) ended",
                               registry=r)
        self.sources_sensed = Counter("heartbeat_sources_sensed", "Sources sensed, by source kind",
                                      ["kind"], registry=r)
        self.sources_new_data = Counter("heartbeat_sources_new_data", "Sources sensed with new data, by source kind",
                                        ["kind"], registry=r)
        self.source_errors = Counter("heartbeat_source_errors", "Sensings that failed, by source kind",
                                     ["kind"], registry=r)
        self.sources_failing = Gauge("heartbeat_sources_failing",
                                     "Sources whose latest sensing by this process failed, by source kind",
                                     ["kind"], registry=r)
        self.control_refreshes = Counter(
            "heartbeat_control_refresh", "Refreshes of the control table by ticks, by path "
            f"({', '.join(path.value for path in RefreshPath)}) and, for a build, why it did not fold "
            f"({', '.join(reason.value for reason in RefreshReason)}; empty otherwise)", ["path", "reason"],
            registry=r)
        self.jobs_triggered = Counter("heartbeat_jobs_triggered", "Job runs started, by jobs backend",
                                      ["backend"], registry=r)
        self.jobs_completed = Counter("heartbeat_jobs_completed", "Job runs that succeeded, by jobs backend",
                                      ["backend"], registry=r)
        self.jobs_failed = Counter("heartbeat_jobs_failed", "Job runs that failed, by jobs backend",
                                   ["backend"], registry=r)
        self.trigger_errors = Counter("heartbeat_job_trigger_errors",
                                      "Trigger requests the jobs backend refused or did not answer, by jobs backend",
                                      ["backend"], registry=r)
        self.catalog_look_failures = Counter(
            "heartbeat_catalog_look_failures", "Catalog looks (information_schema.tables) that failed, by kind: "
            "transient (asked again after a back-off) or terminal (the look's query found no information_schema; "
            "asked again after the longest back-off; a catalog found beforehand to have none, a Hive metastore, is "
            "not counted: one INFO line says so); their tables are sensed from their history meanwhile", ["kind"], registry=r)
        self.runs_not_executed = Counter(
            "heartbeat_job_runs_not_executed", "Runs the jobs service ended without executing them, by termination "
            "code and fate: skipped (asked again next tick), limited (asked again after a back-off), refused (a "
            "terminal non-run), deferred (a tick held the ask back for the back-off)", ["code", "fate"], registry=r)
        self.api_calls = Counter("heartbeat_jobs_api_calls", "Jobs API calls (HTTP requests), by endpoint",
                                 ["endpoint"], registry=r)
        self.api_throttled = Counter("heartbeat_jobs_api_throttled",
                                     "Jobs API answers 429 Too Many Requests, by endpoint", ["endpoint"], registry=r)
        self.api_retries = Counter("heartbeat_jobs_api_retries",
                                   "Jobs API requests the client sends again (after a 429 or 503), by endpoint",
                                   ["endpoint"], registry=r)
        self.alert_deliveries = Counter("heartbeat_alert_deliveries", "Alert messages a destination accepted, "
                                        "by destination kind", ["destination"], registry=r)
        self.alert_failures = Counter("heartbeat_alert_delivery_failures", "Alert messages that could not be "
                                      "delivered (retried), by destination kind", ["destination"], registry=r)
        self.lineage_events = Counter("heartbeat_lineage_events", "OpenLineage events the transport accepted",
                                      registry=r)
        self.lineage_failures = Counter("heartbeat_lineage_event_failures", "OpenLineage events that could not "
                                        "be delivered (retried)", registry=r)
        self.jobs_held = Gauge("heartbeat_jobs_held", "Ready jobs a trigger hold kept back, by hold: the minimum "
                               "interval, the quiet period, the cron gate or the pool (as of the latest tick)",
                               ["hold"], registry=r)
        self.hold_release = Gauge("heartbeat_trigger_hold_release_timestamp_seconds",
                                  "Unix time at which the earliest time hold of the latest tick ends by itself "
                                  "(0: no job is held by time)", registry=r)
        self.alerts_open = Gauge("heartbeat_alerts_open", "Open alerts, by alert kind (as of the latest tick)",
                                 ["kind"], registry=r)
        self.engine_recycles = Counter("heartbeat_engine_recycles", "Embedded engine processes replaced",
                                       registry=r)
        self.engine_wakes = Counter("heartbeat_engine_wakes", "Parked embedded engines started again", registry=r)
        self.tree_rss = Gauge("heartbeat_process_tree_resident_memory_bytes",
                              "Resident memory of the runner and its engine (not local job runs), as of the "
                              "latest tick", registry=r)
        self.lease_held = Gauge("heartbeat_lease_held", "1 while this process holds the tick lease, else 0",
                                registry=r)
        # process_resident_memory_bytes, process_cpu_seconds_total, ... of this process (read from /proc)
        ProcessCollector(registry=r)
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()

    def note_sensing(self, failed: dict[str, str], recovered: Iterable[str]) -> None:
        """Keep the failing gauge from one tick: ``failed`` maps the sources whose sensing failed now to their
        kind, ``recovered`` names the ones that sensed again after a failure. A source stays failing until
        it recovers (one not due this tick keeps its state). The keys stay here, never in a label."""
        with self._lock:
            if not failed and not self._failing:
                return
            for key in recovered:
                self._failing.pop(key, None)
            self._failing.update(failed)
            counts: dict[str, int] = {}
            for kind in self._failing.values():
                counts[kind] = counts.get(kind, 0) + 1
            for kind in set(counts) | {labels[0] for labels in _children(self.sources_failing)}:
                self.sources_failing.labels(kind=kind).set(counts.get(kind, 0))

    def exposition(self) -> bytes:
        """The text exposition of every collector (what ``/metrics`` answers)."""
        return generate_latest(self.registry)

    def names(self) -> set[str]:
        """Every series name this registry can expose (``_total``, ``_bucket``, ... included), children or not."""
        return set(exposed_names(self.registry))


def exposed_names(registry: CollectorRegistry) -> Iterator[str]:
    """The series names of every metric family on ``registry``, also of those without a sample yet."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    for family in registry.collect():
        for suffix in suffixes.get(family.type, ("",)):
            yield family.name + suffix


def _children(metric: Gauge) -> list[tuple[str, ...]]:
    """The label values of a labelled metric's children (the library keeps them; no public accessor)."""
    return list(getattr(metric, "_metrics", {}))


#: where the exposition listens unless told otherwise: this machine only
DEFAULT_METRICS_HOST = "127.0.0.1"


@dataclass
class MetricsServer:
    """The exposition's HTTP server on a thread of its own (``/metrics``, any path answers the same)."""

    host: str
    port: int
    _server: WSGIServer | None = None

    def close(self) -> None:
        server = self._server
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None


def serve_metrics(port: int, host: str = DEFAULT_METRICS_HOST) -> MetricsServer:
    """Serve this process's collectors on ``host:port`` (port 0: any free one) until closed; a port that
    cannot be had is a HeartbeatError naming it."""
    try:
        server, _ = start_http_server(port, addr=host, registry=metrics().registry)
    except OSError as exc:
        raise HeartbeatError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                             "(choose another with --metrics-port / HEARTBEAT_METRICS_PORT)") from exc
    return MetricsServer(host, int(server.server_address[1]), server)


_current: Metrics | None = None
_current_lock = threading.Lock()


def metrics() -> Metrics:
    """This process's collectors (made at first use)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Metrics()
        return _current


def use_metrics(fresh: Metrics | None = None) -> Metrics:
    """Make ``fresh`` (default: a new one) this process's collectors; for tests and benchmarks."""
    global _current
    with _current_lock:
        _current = fresh or Metrics()
        return _current


# -- docs/observability.md's metrics table --------------------------------------------------------

#: the comments around the generated table in docs/observability.md
TABLE_START = "<!-- metrics-table: generated by heartbeat_runner.core.metrics.metrics_table; do not edit -->"
TABLE_END = "<!-- /metrics-table -->"


def metrics_table() -> str:
    """The Markdown table of every Heartbeat metric: its exposed name, type, labels and help."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for collector in vars(Metrics()).values():
        if not isinstance(collector, (Counter, Gauge, Histogram)):
            continue
        for family in collector.describe():
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in getattr(collector, "_labelnames", ())) or "none"
            rows.append(f"| `{name}` | {family.type} | {labels} | {family.documentation} |")
    return "\n".join(rows)


def with_metrics_table(text: str) -> str:
    """``text`` with the part between TABLE_START and TABLE_END replaced by :func:`metrics_table`."""
    head, _, rest = text.partition(TABLE_START)
    _, _, tail = rest.partition(TABLE_END)
    return f"{head}{TABLE_START}\n{metrics_table()}\n{TABLE_END}{tail}"
